"""``sglang-mtp-dequant verify``: load sglang's real draft on the CPU twice and compare.

Usage::

    report = run_verify("/ckpt", reference="/ckpt-float-mtp.safetensors")
    print(render_verify(report))
    sys.exit(0 if report.ok else 1)

What it does, in one process, the way an sglang scheduler does it: publish the server
context for the checkpoint, ``sglang.srt.plugins.load_plugins()`` (which finds this package
through its entry point and hooks the draft class), build sglang's own draft class from the
checkpoint's ``config.json`` on the CPU, then load it twice through sglang's own weight
iterator:

- **stock**: the class's ``load_weights.__wrapped__`` - sglang's method with the hook
  bypassed, i.e. exactly what sglang does without this package;
- **plugin**: ``load_weights`` as hooked by ``load_plugins()``.

Each draft parameter is then compared with an *independent* dequantization written here
from the ModelSlim format (plain fp32 ``(q - offset) * scale``; it shares no code with
``schemes/``) and, with ``--reference``, with the original float ``mtp.*`` tensors.

Memory: one draft in the checkpoint's dtype (embedding + lm_head + one decoder layer + fc),
estimated before anything is allocated by building the same class on the ``meta`` device;
for Qwen3.5-27B in bf16 that is 5.5 GiB. Only the shard files that hold draft tensors are
streamed (the rest of the checkpoint never reaches the draft's loader).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from .checkpoint import Checkpoint
from .drafts import DRAFT_SPECS, DraftSpec
from .errors import CheckpointFormatError, DraftWeightError
from .guard import SourceIndex, parameters_to_inspect

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class ParamRow:
    """One draft parameter, as stock sglang and as the plugin loaded it."""

    parameter: str
    sources: list[str]
    quantized: bool = False  # fed by integer codes the plugin decodes
    stock_absmax: float | None = None
    plugin_absmax: float | None = None
    dequant_error: float | None = None  # max |plugin - independent fp32 dequant|
    dequant_bound: float | None = None  # largest rounding error the draft dtype allows
    exact: bool | None = None  # plugin == independent dequant rounded to the draft dtype
    reference_absmax: float | None = None
    stock_reference_error: float | None = None
    plugin_reference_error: float | None = None

    @property
    def matches_dequant(self) -> bool | None:
        if self.dequant_error is None or self.dequant_bound is None:
            return None
        return self.dequant_error <= self.dequant_bound


@dataclass
class VerifyReport:
    folder: str
    class_name: str = "?"
    dtype: str = "bfloat16"
    estimated_bytes: int = 0
    shared_bytes: int = 0
    files_streamed: list[str] = field(default_factory=list)
    files_total: int = 0
    reference: str | None = None
    rows: list[ParamRow] = field(default_factory=list)
    stock_error: str | None = None
    plugin_error: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.problems or self.plugin_error:
            return False
        return all(r.matches_dequant is True or not r.quantized for r in self.rows) and all(
            r.matches_dequant is not False for r in self.rows
        )


# -- the independent dequantizer -------------------------------------------------------------


def _per_row(values: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """(out,), (out,1) or (out, in/G) -> fp32 (out, in) by repetition; None if it fits not."""
    rows, cols = shape[0], shape[-1]
    if values.numel() % rows:
        return None
    values = values.float().reshape(rows, -1)
    if cols % values.shape[1]:
        return None
    return values.repeat_interleave(cols // values.shape[1], dim=1)


def independent_dequantize(
    tensors: Mapping[str, torch.Tensor], name: str, described: str | None
) -> torch.Tensor | None:
    """fp32 weights of checkpoint tensor ``name`` from its raw companions, or None.

    W8A8_DYNAMIC / W8A16 (and V0 static with weight_scale): ``(q - offset) * scale``;
    static W8A8 V1: ``q * deq_scale / input_scale`` (int64 ``deq_scale`` holds f32 bits);
    W4A8_DYNAMIC V1: the same affine formula on int4 codes stored two per byte along ``out``
    (``byte = (even & 0xF) | (odd << 4)``, two's complement). Other int4 layouts: None.
    """
    q = tensors[name]
    if q.is_floating_point():
        return q.float()
    if q.dtype != torch.int8 or q.dim() != 2 or not name.endswith(".weight"):
        return None
    base = name[: -len(".weight")]
    scale = tensors.get(f"{base}.weight_scale")
    if (described or "").startswith("W4"):
        if described != "W4A8_DYNAMIC" or scale is None or f"{base}.weight_scale_second" in tensors:
            return None
        if scale.shape[0] != 2 * q.shape[0]:
            return None
        q = _unpack_int4_along_out(q)
    if scale is not None:
        s = _per_row(scale, q.shape)
        offset = tensors.get(f"{base}.weight_offset")
        o = _per_row(offset, q.shape) if offset is not None else torch.zeros(q.shape)
        return None if s is None or o is None else (q.float() - o) * s
    deq, input_scale = tensors.get(f"{base}.deq_scale"), tensors.get(f"{base}.input_scale")
    if deq is None or input_scale is None or input_scale.numel() != 1:
        return None
    if deq.dtype == torch.int64:
        deq = (deq & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    s = _per_row(deq.float() / input_scale.float().reshape(()), q.shape)
    return None if s is None else q.float() * s


def _unpack_int4_along_out(packed: torch.Tensor) -> torch.Tensor:
    """(out/2, in) int8 bytes -> (out, in) int4 values: low nibble = even row, high = odd."""
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(packed, 4), 4)  # sign-extends
    high = torch.bitwise_right_shift(packed, 4)
    return torch.stack([low, high], dim=1).reshape(2 * packed.shape[0], packed.shape[1])


def assemble(parameter: str, shape: tuple[int, ...], parts: list[tuple[str, torch.Tensor]]):
    """The checkpoint tensors stacked the way sglang's loaders stack them at TP=1."""
    if not parts:
        return None
    per_expert = all(n.split(".experts.")[-1].split(".")[0].isdigit() for n, _ in parts)
    if len(shape) == 3 and ".experts." in parameter and per_expert:
        experts: dict[int, list[torch.Tensor]] = {}
        for name, tensor in parts:
            index = int(name.split(".experts.")[1].split(".")[0])
            experts.setdefault(index, []).append(tensor)
        out = torch.stack([torch.cat(experts[e], dim=0) for e in sorted(experts)])
    else:
        out = torch.cat([t for _, t in parts], dim=0) if len(parts) > 1 else parts[0][1]
    return out if tuple(out.shape) == tuple(shape) else None


# -- running sglang --------------------------------------------------------------------------


def _spec_for(folder: str) -> tuple[DraftSpec, dict]:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CheckpointFormatError(
            file=path, problem=f"cannot be read ({exc})", hint="verify needs the config.json"
        ) from exc
    arch = (config.get("architectures") or ["?"])[0] if isinstance(config, dict) else "?"
    for spec in DRAFT_SPECS:
        if arch in spec.architectures:
            return spec, config
    raise CheckpointFormatError(
        file=path,
        problem=f"architecture {arch!r} has no draft class this plugin hooks",
        hint="verify builds only the hooked draft classes; run `doctor` for the tensors",
    )


def _dtype_of(config: dict) -> torch.dtype:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    name = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return _DTYPES.get(name, torch.bfloat16)


def _progress(stream, total: int, label: str, enabled: bool) -> Iterator:
    if not enabled:
        yield from stream
        return
    from tqdm import tqdm

    with tqdm(stream, total=total, desc=label, unit="tensor", file=sys.stderr) as bar:
        yield from bar


def _count_tensors(files: list[str]) -> int:
    from safetensors import safe_open

    total = 0
    for path in files:
        with safe_open(path, framework="pt") as handle:
            total += len(list(handle.keys()))
    return total


def _absmax(t: torch.Tensor) -> float:
    return float(t.detach().float().abs().max()) if t.numel() else 0.0


def run_verify(folder: str, reference: str | None = None, progress: bool = True) -> VerifyReport:
    """Build, load stock, load with the plugin, compare. See the module docstring."""
    folder = os.path.abspath(folder)
    report = VerifyReport(folder=folder, reference=reference)
    spec, config = _spec_for(folder)
    report.class_name = spec.class_name
    dtype = _dtype_of(config)
    report.dtype = str(dtype).replace("torch.", "")

    from .cpu_sglang import CpuDraftBuilder, prepare_cpu_process, safetensors_stream

    prepare_cpu_process(folder)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from .plugin import registered_targets

    if spec.target not in registered_targets():
        report.problems.append(
            f"sglang's load_plugins() did not hook {spec.target}: is the package installed "
            "(pip install -e .) and allowed by SGLANG_PLUGINS?"
        )
        return report

    builder = CpuDraftBuilder(folder, dtype=dtype)
    with torch.device("meta"):
        shape_only = builder.build_draft()
    report.estimated_bytes = sum(p.numel() * p.element_size() for p in shape_only.parameters())
    report.shared_bytes = sum(
        p.numel() * p.element_size()
        for n, p in shape_only.named_parameters()
        if n.split(".")[-2] in ("embed_tokens", "lm_head")
    )
    del shape_only
    model = builder.build_draft()
    is_draft = spec.draft_names(model)
    ckpt = Checkpoint.open(folder, wanted=is_draft)
    report.files_total = len(ckpt.files)
    report.files_streamed = sorted({info.file for info in ckpt.tensors.values()})
    total = _count_tensors(report.files_streamed)
    packed = getattr(model, "packed_modules_mapping", None)
    index = SourceIndex.from_checkpoint(ckpt, packed)
    method = type(model).load_weights
    inspected = parameters_to_inspect(model, None)

    def load(loader, label: str) -> set[str] | None:
        for _, param in inspected:
            param.data.fill_(float("nan"))  # a parameter the load skips shows as NaN
        stream = _progress(safetensors_stream(report.files_streamed), total, label, progress)
        loaded = loader(model, stream)
        return set(loaded) if isinstance(loaded, (set, list, tuple, frozenset)) else None

    try:
        loaded = load(method.__wrapped__, "stock load (load_weights.__wrapped__)")
    except Exception as exc:  # stock sglang may stop on packed codes: that is a finding
        report.stock_error = f"{type(exc).__name__}: {exc}"
        loaded = None
    stock = {n: p.detach().clone() for n, p in inspected if loaded is None or n in loaded}
    try:
        loaded = load(method, "plugin load (hooked load_weights)")
    except DraftWeightError as exc:
        report.plugin_error = str(exc)
        loaded = None
    names = [n for n, _ in inspected if loaded is None or n in loaded or n in stock]
    report.rows = _compare(dict(inspected), names, stock, index, ckpt, reference, report)
    return report


def _compare(params, names, stock, index, ckpt, reference, report) -> list[ParamRow]:
    from safetensors import safe_open

    ref: dict[str, torch.Tensor] = {}
    if reference is not None:
        with safe_open(reference, framework="pt") as handle:
            ref = {k: handle.get_tensor(k) for k in handle.keys()}
    raw: dict[str, torch.Tensor] = {}
    for info in ckpt.tensors.values():
        with safe_open(info.file, framework="pt") as handle:
            raw[info.name] = handle.get_tensor(info.name)
    rows = []
    for name in names:
        param = params[name].detach()
        sources = [s.name for s in index.sources_of(name)]
        row = ParamRow(name, sources)
        row.quantized = any(s in ckpt.tensors and ckpt.tensors[s].is_integer for s in sources)
        if name in stock:
            row.stock_absmax = _absmax(stock[name])
        if report.plugin_error is None:
            row.plugin_absmax = _absmax(param)
        parts = []
        for s in sources:
            deq = independent_dequantize(raw, s, ckpt.type_of(s))
            parts.append((s, deq))
        expected = None
        if parts and all(t is not None for _, t in parts):
            expected = assemble(name, tuple(param.shape), parts)
        if expected is not None and report.plugin_error is None:
            got = param.float()
            row.dequant_error = float((got - expected).abs().max())
            eps = torch.finfo(param.dtype).eps / 2
            row.dequant_bound = float((expected.abs() * eps).max())
            row.exact = bool(torch.equal(param, expected.to(param.dtype)))
        if ref:
            ref_parts = [(s, ref[s].float()) for s in sources if s in ref]
            wanted = assemble(name, tuple(param.shape), ref_parts) if ref_parts else None
            if wanted is not None and len(ref_parts) == len(sources):
                row.reference_absmax = _absmax(wanted)
                if name in stock:
                    row.stock_reference_error = float((stock[name].float() - wanted).abs().max())
                if report.plugin_error is None:
                    row.plugin_reference_error = float((param.float() - wanted).abs().max())
        rows.append(row)
    return rows


# -- output ----------------------------------------------------------------------------------


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


def render_verify(report: VerifyReport) -> str:
    lines = [
        f"sglang-mtp-dequant verify: {report.folder}",
        f"  draft class: {report.class_name} (sglang's own class, built on the CPU in "
        f"{report.dtype})",
        f"  memory: {_size(report.estimated_bytes)} of draft parameters "
        f"({_size(report.shared_bytes)} of them embedding + lm_head), estimated on "
        "the meta device before allocating",
        f"  streamed {len(report.files_streamed)} of {report.files_total} safetensors files "
        "(those holding draft tensors) through sglang's safetensors_weights_iterator",
        "  stock  = sglang's load_weights with the hook bypassed (load_weights.__wrapped__)",
        "  plugin = load_weights as hooked by sglang.srt.plugins.load_plugins()",
        "  dequant err = max |plugin - independent fp32 dequantization|"
        + (f"; reference = {report.reference}" if report.reference else ""),
        "",
    ]
    header = ["parameter", "checkpoint tensors", "stock absmax", "plugin absmax", "dequant err"]
    if report.reference:
        header += ["ref absmax", "stock err vs ref", "plugin err vs ref"]
    table = [header]
    for r in report.rows:
        exact = ""
        if r.exact:
            exact = " (exact)"
        elif r.matches_dequant is False:
            exact = " MISMATCH"
        cells = [
            r.parameter,
            _short_sources(r.sources),
            _num(r.stock_absmax),
            _num(r.plugin_absmax),
            _num(r.dequant_error) + exact,
        ]
        if report.reference:
            cells += [
                _num(r.reference_absmax),
                _num(r.stock_reference_error),
                _num(r.plugin_reference_error),
            ]
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    lines.append("")
    if report.stock_error:
        lines.append(f"  stock load stopped: {report.stock_error}")
    if report.plugin_error:
        lines.append(f"  plugin load refused: {report.plugin_error}")
    for problem in report.problems:
        lines.append(f"  problem: {problem}")
    mismatched = [r.parameter for r in report.rows if r.matches_dequant is False]
    if mismatched:
        lines.append(f"  mismatch: {', '.join(mismatched)} differ from the independent dequant")
    unchecked = [r.parameter for r in report.rows if r.quantized and r.matches_dequant is None]
    if unchecked and not report.plugin_error:
        lines.append(
            f"  unchecked: {', '.join(unchecked)}: verify has no independent rule for this "
            "layout (int4 other than W4A8_DYNAMIC V1)"
        )
    if report.ok:
        checked = sum(r.matches_dequant is True for r in report.rows)
        lines.append(
            f"verdict: ok - {checked} draft parameters match the independent dequantization "
            "within one rounding to the draft dtype"
        )
    else:
        lines.append("verdict: error - the plugin did not produce a correct draft (see above)")
    return "\n".join(lines)
