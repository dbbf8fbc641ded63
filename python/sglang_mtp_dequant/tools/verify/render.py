"""``verify``'s report as text: a table per draft parameter, then problems, then the verdict."""

from __future__ import annotations

import math

from .report import PASSED, ParamRow, VerifyReport


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "not loaded"
    return f"{value:.4g}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _short_sources(sources: list[str]) -> str:
    if not sources:
        return "-"
    if len(sources) == 1:
        return sources[0]
    heads = {s.rsplit(".", 2)[0] for s in sources}
    if len(heads) == 1 and len(sources) <= 4:
        parts = ",".join(s.rsplit(".", 2)[1] for s in sources)
        return f"{heads.pop()}.{{{parts}}}.weight"
    return f"{sources[0]} +{len(sources) - 1}"


def _check(row: ParamRow) -> str:
    if row.check in PASSED:
        return row.check
    if row.check == "mismatch":
        return f"MISMATCH (max err {_num(row.max_error)})"
    return f"unchecked: {row.why}" if row.why else "unchecked"


def render_verify(report: VerifyReport) -> str:
    """The header, the table of draft parameters, what stopped, problems and the verdict."""
    lines = [f"sglang-mtp-dequant verify: {report.requested}"]
    if report.rows or not (report.class_name == "?" or report.unsupported or report.inactive):
        lines += _setting_lines(report) + [""] + _table_lines(report) + [""]
        lines += _stopped_lines(report)
    else:
        lines += [f"  problem: {p}" for p in report.problems] + [""]
    lines.append(f"verdict: {report.verdict} - {report.reason}")
    return "\n".join(lines)


def _setting_lines(report: VerifyReport) -> list[str]:
    """What was resolved, built and streamed, and what each column's load is."""
    lines = [
        f"  resolved: {report.folder} ({report.resolved_by})",
        f"  launch: {report.launch}",
        f"  draft class: {report.class_name} (sglang's own class for this architecture, built "
        f"on the CPU in {report.dtype}"
        + (f", quantized: {report.built_quantized})" if report.built_quantized else ")"),
        f"  memory: {_size(report.estimated_bytes)} of draft parameters "
        f"({_size(report.shared_bytes)} of them embedding + lm_head, taken from the target and "
        "not compared), estimated on the meta device before allocating",
        f"  streamed {len(report.files_streamed)} of {report.files_total} weight files (those "
        "holding draft tensors) through sglang's DefaultModelLoader",
        "  stock     = sglang's load_weights with the hook bypassed",
        "  reference = the same, fed an independent fp32 dequantization rounded once to "
        f"{report.dtype}",
        "  plugin    = load_weights as hooked by sglang.srt.plugins.load_plugins()",
        "  check     = exact: the plugin's parameter equals the reference bit for bit (ulp: "
        "within one ulp, for a format compressed-tensors converts and rounds its own way)",
    ]
    if report.reference:
        lines.append(f"  float ref = {report.reference}, the original float weights")
    return lines


def _table_lines(report: VerifyReport) -> list[str]:
    """One aligned row per draft parameter (the float reference's columns with one)."""
    header = ["parameter", "checkpoint tensors", "stock absmax", "plugin absmax", "check"]
    if report.reference:
        header += ["ref absmax", "stock err vs ref", "plugin err vs ref"]
    table = [header]
    for r in report.rows:
        cells = [
            r.parameter,
            _short_sources(r.sources),
            _num(r.stock_absmax),
            _num(r.plugin_absmax),
            _check(r),
        ]
        if report.reference:
            cells += [
                _num(r.reference_absmax),
                _num(r.stock_reference_error),
                _num(r.plugin_reference_error),
            ]
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in table
    ]


def _stopped_lines(report: VerifyReport) -> list[str]:
    """The loads that stopped, the problems and the notes."""
    lines = []
    if report.stock_error:
        lines.append(f"  stock load stopped: {report.stock_error}")
    if report.plugin_error:
        lines.append(f"  plugin load refused: {report.plugin_error}")
    lines += [f"  problem: {problem}" for problem in report.problems]
    lines += [f"  note: {note}" for note in report.notes]
    return lines
