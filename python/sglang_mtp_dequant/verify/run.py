"""Load sglang's real draft on the CPU three ways and compare: stock, reference, plugin.

Usage::

    report = run_verify("/ckpt")                      # or a cached hub id, download_dir=...
    report = run_verify("acme/q35-w8a8", download_dir="/data/hub", reference="mtp_float.safetensors")

What it does, in one process, the way an sglang scheduler does it: resolve the checkpoint with
sglang's own loader (offline), publish the server context, ``load_plugins()`` (which finds this
package through its entry point), build the draft class sglang's ``ModelConfig`` picks for the
checkpoint's architecture (``is_draft_model=True``), then load it through sglang's
``DefaultModelLoader`` stream, restricted (with sglang's own ``allow_patterns_overrides``) to the
files that hold draft tensors:

- **stock**: the class's ``load_weights.__wrapped__``, sglang's method with the hook bypassed;
- **reference**: the same stock method, fed the checkpoint with every weight the plugin would
  decode replaced by an *independent* dequantization (``independent.py``: whole-tensor fp32
  formulas, rounded once to the draft dtype), so sglang's own stacking and sharding place it;
- **plugin**: ``load_weights`` as hooked by ``load_plugins()``;
- with ``reference=``: the stock method fed the original float weights, for the error against
  them.

Every draft parameter the plugin load wrote must equal the reference load bit for bit.

Memory: the draft in its dtype, estimated on the ``meta`` device before anything is
allocated, plus one copy of the draft's own parameters per extra load (the embedding and
lm_head, which it takes from the target, are not compared).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from .. import context
from ..checkpoint import Checkpoint
from ..drafts import DRAFT_SPECS, DraftSpec
from ..guard import WriteRecorder
from ..plan import DequantPlan
from ..sources import resolve_offline
from .independent import independent_dequantize

Weights = Iterable[tuple[str, torch.Tensor]]


@dataclass
class ParamRow:
    """One draft parameter, as stock sglang, the reference and the plugin loaded it."""

    parameter: str
    sources: list[str]
    quantized: bool = False  # fed by codes the plugin decodes
    stock_absmax: float | None = None
    plugin_absmax: float | None = None
    check: str = "unchecked"  # exact | mismatch | unchecked
    why: str = ""  # why unchecked
    max_error: float | None = None  # max |plugin - reference| in fp32
    reference_absmax: float | None = None
    stock_reference_error: float | None = None
    plugin_reference_error: float | None = None


@dataclass
class VerifyReport:
    requested: str
    folder: str = ""
    resolved_by: str = ""
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
    def checked(self) -> int:
        return sum(r.check == "exact" for r in self.rows)

    @property
    def ok(self) -> bool:
        if self.problems or self.plugin_error or self.checked == 0:
            return False
        return all(r.check == "exact" for r in self.rows if r.quantized or r.check == "mismatch")


def spec_for_class(cls: type) -> DraftSpec | None:
    """The hooked spec whose ``load_weights`` runs for draft class ``cls`` (itself or a base)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__}
    for spec in DRAFT_SPECS:
        owner = spec.target.rsplit(".", 1)[0]
        if owner in names or names & set(spec.inherited_by):
            return spec
    return None


def run_verify(
    path: str,
    *,
    download_dir: str | None = None,
    revision: str | None = None,
    reference: str | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> VerifyReport:
    """Resolve, build, load three (or four) ways, compare. See the module docstring."""
    from ..cpu_sglang import build_draft, draft_model_config, prepare_cpu_process, sglang_weights

    report = VerifyReport(requested=path, reference=reference)
    source = resolve_offline(path, download_dir=download_dir, revision=revision)
    report.folder, report.resolved_by = source.folder, source.how
    report.files_total = len(source.files)
    say(f"resolved {path} -> {source.folder} ({source.how})")
    prepare_cpu_process(source.folder)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    model_config = draft_model_config(source.folder)
    report.dtype = str(model_config.dtype).replace("torch.", "")
    shapes = build_draft(model_config, device="meta")
    report.class_name = type(shapes).__name__
    spec = spec_for_class(type(shapes))
    if spec is None:
        report.problems.append(
            f"sglang builds {report.class_name} for this checkpoint's architecture, a draft "
            "class whose load_weights this plugin does not hook: nothing to verify"
        )
        return report
    if spec.target not in context.registered_targets():
        report.problems.append(
            f"sglang's load_plugins() did not hook {spec.target}: is the package installed "
            "(pip install -e .) and allowed by SGLANG_PLUGINS?"
        )
        return report
    shared = [n for n, _ in shapes.named_parameters() if _from_target(n, spec)]
    report.estimated_bytes = _bytes(p for _, p in shapes.named_parameters())
    report.shared_bytes = _bytes(p for n, p in shapes.named_parameters() if n in shared)
    del shapes
    say(f"building {report.class_name} on the CPU ({report.dtype})")
    model = build_draft(model_config)
    ckpt = Checkpoint.open(source, wanted=spec.draft_names(model))
    plan = DequantPlan.build(ckpt)
    report.files_streamed = sorted({info.file for info in ckpt.tensors.values()})
    # sglang's own file filter: the loader globs only these (relative) names
    model.allow_patterns_overrides = [os.path.relpath(f, source.folder) for f in report.files_streamed]
    companions = ckpt.read_many(
        c for entry in plan.to_dequantize.values() for c in entry.companions.values()
    )

    def weights() -> Weights:
        return sglang_weights(model_config, model)

    stock_method = type(model).load_weights.__wrapped__
    say("stock load (load_weights.__wrapped__)")
    stock, _, report.stock_error = _load(model, spec, stock_method, weights())
    say("reference load (independent dequantization, stock load_weights)")
    unverifiable: set[str] = set()
    expected, ref_writes, ref_error = _load(
        model, spec, stock_method, _reference_stream(weights(), plan, companions, model_config.dtype, unverifiable)
    )
    if ref_error:
        report.problems.append(f"the reference load failed: {ref_error}")
    floats: dict[str, torch.Tensor] = {}
    if reference is not None:
        say(f"float reference load ({reference})")
        floats, _, float_error = _load(
            model, spec, stock_method, _float_stream(weights(), plan, reference, model_config.dtype)
        )
        if float_error:
            report.problems.append(f"the float reference load failed: {float_error}")
    say("plugin load (hooked load_weights)")
    _, plugin_writes, report.plugin_error = _load(model, spec, type(model).load_weights, weights())
    params = {n: p for n, p in model.named_parameters() if not _from_target(n, spec)}
    for name, param in params.items():
        report.rows.append(
            _row(name, param, plan, plugin_writes, ref_writes, stock, expected, floats, unverifiable, report)
        )
    return report


def _from_target(name: str, spec: DraftSpec) -> bool:
    return any(token in spec.from_target for token in name.split("."))


def _bytes(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _load(
    model: torch.nn.Module, spec: DraftSpec, method, weights: Weights
) -> tuple[dict[str, torch.Tensor], WriteRecorder, str | None]:
    """One load into NaN-filled parameters: a copy of what it wrote, its writes, its error."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and not _from_target(name, spec):
            param.data.fill_(float("nan"))
    error = None
    with WriteRecorder(model, spec.from_target) as writes:
        try:
            method(model, weights)
        except Exception as exc:  # noqa: BLE001 - a load that stops is a finding, reported
            error = f"{type(exc).__name__}: {exc}"
    values = {n: writes.params[n].detach().clone() for n in writes.written_parameters()}
    return values, writes, error


def _reference_stream(
    weights: Weights,
    plan: DequantPlan,
    companions: dict[str, torch.Tensor],
    dtype: torch.dtype,
    unverifiable: set[str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint as the plugin hands it to sglang, decoded by ``independent.py``."""
    decode = plan.to_dequantize
    version = plan.checkpoint.format_version
    for name, tensor in weights:
        if name in plan.consumed:
            continue
        entry = decode.get(name)
        if entry is not None and (not tensor.is_floating_point() or tensor.element_size() == 1):
            tensors = {name: tensor, **companions}
            expected = independent_dequantize(tensors, name, entry.scheme, version)
            if expected is None:
                unverifiable.add(name)
            else:
                tensor = expected.to(dtype)
        yield name, tensor


def _float_stream(
    weights: Weights, plan: DequantPlan, reference: str, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint with each decoded weight replaced by its original float tensor."""
    from safetensors import safe_open

    with safe_open(reference, framework="pt") as handle:
        originals = set(handle.keys())
        for name, tensor in weights:
            if name in plan.consumed:
                continue
            if name in plan.to_dequantize and name in originals:
                tensor = handle.get_tensor(name).to(dtype)
            yield name, tensor


def _absmax(t: torch.Tensor) -> float:
    return float(t.detach().float().abs().max()) if t.numel() else 0.0


def _row(name, param, plan, plugin_writes, ref_writes, stock, expected, floats, unverifiable, report):
    sources = plugin_writes.fed_by.get(name) or ref_writes.fed_by.get(name, [])
    row = ParamRow(name, list(sources))
    row.quantized = any(s in plan.to_dequantize for s in sources)
    if name in stock:
        row.stock_absmax = _absmax(stock[name])
    if report.plugin_error is not None:
        row.why = "the plugin load was refused"
        return row
    row.plugin_absmax = _absmax(param)
    blocked = [s for s in ref_writes.fed_by.get(name, []) if s in unverifiable]
    if blocked:
        row.why = f"no independent rule for {blocked[0]}"
    elif name not in expected:
        row.why = "the reference load did not write it"
    else:
        got, want = param.detach(), expected[name]
        row.max_error = float((got.float() - want.float()).abs().nan_to_num(float("inf")).max())
        row.check = "exact" if torch.equal(got, want) else "mismatch"
    if name in floats:
        wanted = floats[name].float()
        row.reference_absmax = _absmax(wanted)
        row.plugin_reference_error = float((param.detach().float() - wanted).abs().max())
        if name in stock:
            row.stock_reference_error = float((stock[name].float() - wanted).abs().max())
    return row
