"""The doctor's text output: a greppable table, then notes, problems and the verdict."""

from __future__ import annotations

import os

from .model import Diagnosis, TensorRow, clip

#: the longest line the text answer prints (``--json`` holds every text whole)
LONGEST = 600


_COLUMNS = ("name", "dtype", "shape", "type", "scheme", "companions", "action", "reason")


def _cells(row: TensorRow) -> tuple[str, ...]:
    suffixes = [c.rpartition(".")[2] for c in row.companions]
    reason = row.problem or row.reason
    return (
        row.name,
        row.dtype,
        "x".join(str(d) for d in row.shape) or "scalar",
        row.description or "-",
        row.scheme or "-",
        ",".join(suffixes) or "-",
        row.action.upper() if row.action == "error" else row.action,
        reason,
    )


def render_text(report: Diagnosis) -> str:
    """A plain-text table (stable, greppable, fits a log), then notes, then the verdict."""
    lines = [f"sglang-mtp-dequant doctor: {report.requested}"]
    lines += _setting_lines(report) + [""] + _table_lines(report) + _finding_lines(report)
    lines += _form_lines(report)
    lines += ["", f"verdict: {report.verdict} - {report.reason}"]
    return "\n".join(clip(line, LONGEST) for line in lines)


def _setting_lines(report: Diagnosis) -> list[str]:
    """What was resolved, the draft class, the launch, the build and what a load walks."""
    lines = []
    if report.folder:
        lines.append(f"  resolved: {report.folder} ({report.resolved_by})")
    if report.folder or report.architecture:
        lines.append(
            f"  architecture: {report.architecture or '?'} -> draft class "
            f"{report.draft_class or '(none this plugin hooks)'}{_hooked(report)}"
        )
    if report.launch:
        lines.append(f"  launch: {report.launch}")
    if report.form:
        lines.append(f"  form: {report.form}")
    if report.built:
        lines.append(f"  built: {report.built}")
    if report.plugin_activation:
        state = {True: "active", False: "NOT active", None: "unknown"}[report.plugin_active]
        lines.append(f"  plugin in this sglang: {state} ({report.plugin_activation})")
    if report.description_file:
        lines.append(f"  description: {os.path.basename(report.description_file)}")
    if report.folder:
        lines.append(
            f"  safetensors files: {report.files}; draft dtype: {report.draft_dtype or '?'}"
        )
    if report.walk is not None:
        lines.append(f"  draft load walks: {walk_line(report.walk)}")
    return lines


def _hooked(report: Diagnosis) -> str:
    if not report.hooked:
        return ""
    if report.hooked_by in (None, report.draft_class):
        return " (hooked by this plugin)"
    return f" (hooked by this plugin through {report.hooked_by}.load_weights)"


def _table_lines(report: Diagnosis) -> list[str]:
    """One aligned row per draft tensor, then the count of each action."""
    if not report.tensors:
        return []
    lines = []
    table = [_COLUMNS] + [_cells(r) for r in report.tensors]
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS) - 1)]
    for cells in table:
        left = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False))
        lines.append(f"{left}  {cells[-1]}")
    counts = report.counts()
    passed = f"{counts['pass']} pass (left to sglang), " if counts["pass"] else ""
    lines += [
        "",
        f"  {len(report.tensors)} draft tensors: {counts['dequantize']} dequantize, "
        f"{counts['keep']} keep, {passed}{counts['error']} error",
    ]
    return lines


def _finding_lines(report: Diagnosis) -> list[str]:
    lines = [f"  stock: {report.stock}"] if report.stock else []
    refused: dict[tuple[str, str], list[str]] = {}
    for row in report.tensors:
        if row.action == "error":
            refused.setdefault((row.problem or row.reason, row.hint), []).append(row.name)
    for (problem, hint), names in refused.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        lines.append(f"  refused ({len(names)}): {shown}: {problem}")
        if hint:
            lines.append(f"    what to do: {hint}")
    if report.dry_run:
        lines.append(f"  dry run: {report.dry_run}")
    for parameter, what in report.unfilled.items():
        lines.append(f"  unfilled: {parameter}: no checkpoint tensor writes {what}")
    if report.skipped:
        shown = ", ".join(report.skipped[:8])
        more = f" and {len(report.skipped) - 8} more" if len(report.skipped) > 8 else ""
        lines.append(f"  skipped by the draft class: {shown}{more}")
    lines += [f"  note: {note}" for note in report.notes]
    lines += [f"  unchecked: {item}" for item in report.unchecked]
    lines += [f"  problem: {problem}" for problem in report.problems]
    return lines


def _form_lines(report: Diagnosis) -> list[str]:
    """Every launch form's answer (sglang's error quoted once), and the recommended one."""
    if not report.forms:
        return []
    said = {report.stock_error: "above"} if report.stock_error else {}
    lines = ["", "  every launch form (draft memory: sglang's meta build of this rank; with the "
             "plugin less its vocab-sized copies, which it shares with the target):"]  # fmt: skip
    lines += [f"    {answer.line(said)}" for answer in report.forms]
    lines.append(f"  recommended: {report.recommended}")
    return lines


def walk_line(walk: dict) -> str:
    """``stock 200,035 tensors in 5 files; with the plugin 35 in 1 (4 files skipped ...)``."""
    stock, plugin = walk["stock"], walk["plugin"]
    said = (
        f"stock {stock['tensors']:,} tensors in {stock['files']} files; with the plugin "
        f"{plugin['tensors']:,} in {plugin['files']}"
    )
    if walk["skipped_files"]:
        said += (
            f" ({len(walk['skipped_files'])} files skipped: no draft tensor in them by "
            f"{', '.join(walk['narrowed_by'])})"
        )
    elif walk["not_narrowed"]:
        said += f" (not narrowed: {walk['not_narrowed']})"
    return said
