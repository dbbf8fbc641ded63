"""Load sglang's real draft on the CPU three ways and compare: stock, reference, plugin.

Usage::

    report = run_verify("/ckpt")                      # or a cached hub id, download_dir=...
    report = run_verify("acme/q35-w8a8", download_dir="/data/hub", reference="mtp.safetensors")

Every draft parameter the plugin load wrote must equal the reference load (stock, fed an
*independent* dequantization, ``independent.py``) bit for bit; the steps on ``run_verify``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from ...formats.checkpoint import Checkpoint, WeightSource, dtype_name
from ...formats.library import MODELOPT_NVFP4
from ...formats.plan import DequantPlan
from ...serving import context
from ...serving.drafts import DraftSpec, spec_for_class
from ...serving.guard import WriteRecorder
from ...serving.load import LoadSetting
from ...serving.plugin import bypassed
from ..preflight import check_model_path, check_reference, reference_names
from ..resolve import resolve_checkpoint
from ..target_check import report_into
from .independent import reference_stream
from .report import ParamRow, VerifyReport
from .target import target_rows

if TYPE_CHECKING:
    from ..launch import Launch

Weights = Iterable[tuple[str, torch.Tensor]]


def run_verify(
    path: str,
    *,
    download_dir: str | None = None,
    revision: str | None = None,
    reference: str | None = None,
    say: Callable[[str], None] = lambda _line: None,
    launch: Launch | None = None,
) -> VerifyReport:
    """Resolve, build, load three (or four) ways, compare.

    ``launch``: the user's sglang launch flags (None: as on NPU). In one process, as an sglang
    scheduler, the draft class sglang picks is built and loaded through sglang's own stream:

    - **stock**: ``load_weights`` with the hook bypassed (``plugin.bypassed``);
    - **reference**: the same stock method, fed each weight the plugin would decode as an
      *independent* fp32 dequantization rounded once, so sglang's own stacking places it;
    - **plugin**: ``load_weights`` as hooked by ``load_plugins()``;
    - with ``reference=``: the stock method fed the original float weights.

    Memory: the draft (estimated on the ``meta`` device first), plus one copy of its own
    parameters per extra load.
    """
    from ..cpu_sglang import build_draft
    from ..launch import DEFAULT_ANSWER

    report = VerifyReport(requested=path, reference=reference)
    report.launch = launch.describe() if launch is not None else DEFAULT_ANSWER
    if not _inputs_usable(report, path, download_dir, reference):
        return report
    session = _start_sglang(report, path, download_dir, revision, launch, say)
    spec = _hooked_spec(report, session)
    if spec is None:
        return report
    say(f"building {report.class_name} on the CPU ({report.dtype})")
    with session.launch.platform():
        model = build_draft(session.model_config)
    planned = _plan(report, session, model, spec)
    if planned is not None:
        _compare_loads(report, session, model, spec, *planned, say)
    if session.target is not None:
        say("target layers built unquantized over codes: stock, reference and plugin loads")
        target_rows(report, session.target, session.source)
    return report


@dataclass
class _Session:
    """What the steps of one verify share."""

    source: WeightSource
    launch: Launch
    model_config: Any
    #: the target check of the launch (``report_into``), whose decoded layers verify loads too
    target: Any = None


def _inputs_usable(
    report: VerifyReport, path: str, download_dir: str | None, reference: str | None
) -> bool:
    """The path and ``--reference`` checked before anything is imported or loaded."""
    wrong = check_model_path(path, download_dir=download_dir)
    if wrong is None and reference is not None:
        wrong = check_reference(reference)
    if wrong is not None:
        report.problems.append(str(wrong))
        return False
    if reference is not None:
        report.reference = os.path.abspath(reference)
    return True


def _start_sglang(
    report: VerifyReport,
    path: str,
    download_dir: str | None,
    revision: str | None,
    launch: Launch | None,
    say: Callable[[str], None],
) -> _Session:
    """Resolve the checkpoint with sglang's own loader (offline) and start this process as an
    sglang scheduler: the server context published, ``load_plugins()``, the draft's config."""
    from ..cpu_sglang import draft_model_config, prepare_cpu_process
    from ..launch import default_launch

    source = resolve_checkpoint(path, download_dir=download_dir, revision=revision)
    report.folder, report.resolved_by = os.path.abspath(source.folder), source.how
    report.files_total = len(source.files)
    say(f"resolved {path} -> {source.folder} ({source.how})")
    launch = launch or default_launch(source.folder)
    prepare_cpu_process(source.folder, **launch.server_args())
    from sglang.srt.plugins import load_plugins

    load_plugins()
    model_config = draft_model_config(source.folder)
    report.dtype = dtype_name(model_config.dtype)
    return _Session(source, launch, model_config)


def _hooked_spec(report: VerifyReport, session: _Session) -> DraftSpec | None:
    """The hooked spec of the class sglang builds (sized on the meta device), or None."""
    from ..cpu_sglang import build_draft

    with session.launch.platform():
        shapes = build_draft(session.model_config, device="meta")
    report.class_name = type(shapes).__name__
    spec = spec_for_class(type(shapes))
    if spec is None:
        report.unsupported = (
            f"sglang builds {report.class_name} for this checkpoint's architecture, a draft "
            "class this plugin does not hook (not supported yet): nothing to verify"
        )
        return None
    if spec.target not in context.registered_targets():
        from ..activation import plugin_activation

        found = plugin_activation()
        why = found.why if not found.active else "sglang loaded it, but its hook is not applied"
        report.inactive = f"sglang's load_plugins() did not hook {spec.target}: {why}"
        return None
    session.target = report_into(
        report.notes, report.problems, session.source.folder, session.launch
    )
    shared = [n for n, _ in shapes.named_parameters() if _from_target(n, spec)]
    report.estimated_bytes = _bytes(p for _, p in shapes.named_parameters())
    report.shared_bytes = _bytes(p for n, p in shapes.named_parameters() if n in shared)
    return spec


def _plan(
    report: VerifyReport, session: _Session, model: torch.nn.Module, spec: DraftSpec
) -> tuple[DequantPlan, dict[str, torch.Tensor]] | None:
    """The plugin's plan for the built draft and the companions the reference decodes with;
    None (a problem in the report) when ``--reference`` holds none of the decoded tensors."""
    setting = LoadSetting.of(model, spec.draft_names(model))
    report.built_quantized = setting.quantization
    source = session.source
    ckpt = Checkpoint.open(source, wanted=setting.wanted)
    plan = DequantPlan.build(ckpt)
    draft_files = sorted({info.file for info in ckpt.tensors.values()})
    if len(draft_files) == 1 and report.built_quantized is None:
        # sglang's own file filter (it stops at the first pattern that matches: one file only)
        cast(Any, model).allow_patterns_overrides = [os.path.relpath(draft_files[0], source.folder)]
        report.files_streamed = draft_files
    else:
        report.files_streamed = list(source.files)
    if report.reference is not None:
        decoded = set(plan.to_dequantize)
        if decoded and not decoded & reference_names(report.reference):
            report.problems.append(
                f"{report.reference} (--reference) holds none of the {len(decoded)} draft "
                f"tensors the plugin decodes (e.g. {sorted(decoded)[0]}): pass the file of the "
                "original float draft tensors, under the checkpoint's names"
            )
            return None
    companions = ckpt.read_many(
        c for entry in plan.to_dequantize.values() for c in entry.companions.values()
    )
    return plan, companions


def _compare_loads(
    report: VerifyReport,
    session: _Session,
    model: torch.nn.Module,
    spec: DraftSpec,
    plan: DequantPlan,
    companions: dict[str, torch.Tensor],
    say: Callable[[str], None],
) -> None:
    """The three (or four) loads of the built draft, and one row per draft parameter."""
    from ..cpu_sglang import sglang_weights

    dtype = session.model_config.dtype

    def weights() -> Weights:
        return sglang_weights(session.model_config, model)

    say("stock load (load_weights with the hook bypassed)")
    stock = _load(model, spec, weights(), hooked=False)
    report.stock_error = stock.error
    say("reference load (independent dequantization, stock load_weights)")
    unverifiable: set[str] = set()
    independent = reference_stream(weights(), plan, companions, dtype, unverifiable)
    expected = _load(model, spec, independent, hooked=False)
    if expected.error:
        report.problems.append(f"the reference load failed: {expected.error}")
    floats = None
    if report.reference is not None:
        say(f"float reference load ({report.reference})")
        originals = _float_stream(weights(), plan, report.reference, dtype)
        floats = _load(model, spec, originals, hooked=False)
        if floats.error:
            report.problems.append(f"the float reference load failed: {floats.error}")
    say("plugin load (hooked load_weights)")
    report.plugin_error = _load(model, spec, weights(), hooked=True).error
    for name, param in model.named_parameters():
        if not _from_target(name, spec):
            row = _row(name, param.detach(), plan, stock, expected, unverifiable)
            if report.plugin_error is not None:
                row.plugin_absmax, row.check, row.why = None, "unchecked", "the plugin refused"
            if floats is not None:
                _against_originals(row, param.detach(), stock, floats)
            report.rows.append(row)


@dataclass
class Loaded:
    """One load: a copy of every parameter it wrote, its write record, how it ended."""

    values: dict[str, torch.Tensor]
    writes: WriteRecorder
    error: str | None


#: ModelOpt multiplies by weight_scale_2; compressed-tensors' converter divides by its fp32
#: reciprocal and computes in bf16 (the fixture's CHECK.txt counts the elements)
ONE_ULP_FORMATS = {MODELOPT_NVFP4}


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units of the last place between two float tensors of one dtype."""
    if a.dtype != b.dtype or a.dtype not in (torch.bfloat16, torch.float16):
        return 1 << 30
    x, y = (a + 0.0).view(torch.int16).int(), (b + 0.0).view(torch.int16).int()
    return int((x - y).abs().max()) if x.numel() else 0


def _from_target(name: str, spec: DraftSpec) -> bool:
    return any(token in spec.from_target for token in name.split("."))


def _bytes(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _load(model: torch.nn.Module, spec: DraftSpec, weights: Weights, *, hooked: bool) -> Loaded:
    """One load into NaN-filled parameters, hooked or stock."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and not _from_target(name, spec):
            param.data.fill_(float("nan"))
    error = None
    is_draft = spec.draft_names(model)
    with WriteRecorder(model, spec.from_target) as writes:
        try:
            with contextlib.nullcontext() if hooked else bypassed():
                cast(Any, model).load_weights(writes.follow(writes.observe(weights, is_draft)))
        except Exception as exc:  # noqa: BLE001 - a load that stops is a finding, reported
            error = f"{type(exc).__name__}: {exc}"
    values = {n: writes.params[n].detach().clone() for n in writes.written_parameters()}
    return Loaded(values, writes, error)


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


def _row(
    name: str,
    param: torch.Tensor,
    plan: DequantPlan,
    stock: Loaded,
    expected: Loaded,
    unverifiable: set[str],
) -> ParamRow:
    """``param`` (as the plugin loaded it) against the reference load."""
    # the reference load hands sglang the very tensors it writes (traced by storage); the
    # plugin's decoded tensors are made inside its hook, out of a recorder's sight out here
    sources = expected.writes.fed_by.get(name, [])
    decoded = {n for e in plan.to_dequantize.values() for n in (e.info.name, e.output_name)}
    row = ParamRow(name, list(sources), quantized=any(s in decoded for s in sources))
    if name in stock.values:
        row.stock_absmax = _absmax(stock.values[name])
    row.plugin_absmax = _absmax(param)
    blocked = [s for s in sources if s in unverifiable]
    if blocked:
        row.why = f"no independent rule for {blocked[0]}"
    elif name not in expected.values:
        row.why = "the reference load did not write it"
    else:
        want = expected.values[name]
        row.compare(param, want)
        rounding = {plan.to_dequantize[s].format for s in sources if s in plan.to_dequantize}
        if row.check == "mismatch" and rounding & ONE_ULP_FORMATS and _ulps(param, want) <= 1:
            row.check = "ulp"
            row.why = "within 1 ulp: compressed-tensors rounds ModelOpt NVFP4 scales its own way"
    return row


def _against_originals(row: ParamRow, param: torch.Tensor, stock: Loaded, floats: Loaded) -> None:
    """The errors against the original float weights (``--reference``)."""
    if row.parameter not in floats.values:
        return
    wanted = floats.values[row.parameter].float()
    row.reference_absmax = _absmax(wanted)
    row.plugin_reference_error = float((param.float() - wanted).abs().max())
    if row.parameter in stock.values:
        row.stock_reference_error = float(
            (stock.values[row.parameter].float() - wanted).abs().max()
        )
