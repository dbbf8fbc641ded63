"""What the doctor finds: ``diagnose`` fills a ``Diagnosis`` for one checkpoint path (usage, on
the package).

The very decisions the plugin will take at load time, on the files sglang would stream
(``sources.resolve_offline``: sglang's own resolution, offline), ``Checkpoint`` + ``DequantPlan``
(the same code), what stock sglang would do instead, and, from a dry run of sglang's own draft
class on the meta device (``dryrun.py``), which draft parameters no checkpoint tensor will fill
and which names the class will skip. It reads headers, ``config.json``, the description and the
small companion tensors only (never a weight).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...errors import CheckpointFormatError
from ...formats.checkpoint import Checkpoint, TensorInfo, WeightSource
from ...formats.config import CheckpointConfig
from ...formats.naming import (
    QUAROT_FILE,
    QUAROT_FLAG,
    QUAROT_TENSOR,
    NameRule,
    mtp_prefix,
    nextn_layer,
    split_companion,
)
from ...formats.plan import DequantPlan, PlannedTensor
from ...serving.context import sglang_version
from ...serving.drafts import DraftSpec, spec_for_architecture, spec_for_class
from ...serving.narrowing import NARROW_ENV, FileChoice, choose_files, count_walk
from ..preflight import check_model_path
from ..resolve import resolve_checkpoint
from ..target_check import report_into
from .model import Diagnosis, TensorRow

if TYPE_CHECKING:
    from ..dryrun import Built
    from ..launch import Launch


def diagnose(
    path: str,
    *,
    download_dir: str | None = None,
    revision: str | None = None,
    dry_run: bool = True,
    launch: Launch | None = None,
    forms: bool = False,
) -> Diagnosis:
    """Everything the doctor reports about ``path``; never raises on a bad checkpoint.

    ``path`` is what sglang gets as ``--model-path``: a folder, a snapshot folder, or a hub id
    in the local cache (``download_dir`` and ``revision`` as sglang's ``--download-dir`` and
    ``--revision``). ``dry_run=False`` skips building the draft class: no parameter coverage
    and no answer from the class's own quantization rule (the verdict is then ``unchecked``).
    ``launch``: the user's sglang launch flags (``tools/launch.py``); None: as on NPU with the
    draft quantization unset. ``forms`` (the CLI's default): also answer every launch form
    (``forms.FORMS``) for
    the same checkpoint, with the draft's memory, and recommend the cheapest that serves right.
    """
    from ..cpu_env import forget_stand_ins
    from ..launch import DEFAULT_ANSWER

    forget_stand_ins()
    report = Diagnosis(requested=path)
    report.launch = launch.describe() if launch is not None else DEFAULT_ANSWER
    if launch is not None:
        report.notes.extend(launch.notes())
    source = _resolve(report, path, download_dir, revision)
    if source is None:
        return report
    config = _read_config(report)
    spec, built = _draft_class(report, source, config, launch, dry_run)
    is_draft = _draft_names(spec, built, config)
    try:
        ckpt = Checkpoint.open(source, wanted=is_draft)
        plan = DequantPlan.build(ckpt)
    except CheckpointFormatError as exc:
        report.problems.append(str(exc))
        return report
    _tensors(report, source, spec, built, config, ckpt, plan)
    plain_plan = _who_decodes(report, spec, built, ckpt, is_draft)
    _notes(report, ckpt, built)
    if built is not None:
        _target_layers(report, source, launch)
    if built is not None and report.tensors:
        _load_dry_run(report, built, ckpt, plan, plain_plan, spec)
    if forms and dry_run:
        from .form_table import answer_every_form

        def for_launch(form_launch: Launch) -> Diagnosis:
            return diagnose(
                path, download_dir=download_dir, revision=revision, launch=form_launch, forms=False
            )

        answer_every_form(report, for_launch, path, launch)
    return report


def _target_layers(report: Diagnosis, source: WeightSource, launch: Launch | None) -> None:
    """The target of the same launch, built on meta as sglang builds it: its linear layers
    built unquantized over quantized codes, and what the plugin does about them."""
    from ..launch import default_launch

    target_launch = launch or default_launch(source.folder)
    report_into(report.notes, report.problems, source.folder, target_launch)


def _resolve(
    report: Diagnosis, path: str, download_dir: str | None, revision: str | None
) -> WeightSource | None:
    """The files sglang would stream for ``path`` (its own resolution, offline); None, with
    the problem in the report, for a path that is no checkpoint."""
    wrong = check_model_path(path, download_dir=download_dir)
    if wrong is not None:
        report.error_kind = wrong.kind
        report.problems.append(str(wrong))
        return None
    try:
        source = resolve_checkpoint(path, download_dir=download_dir, revision=revision)
    except CheckpointFormatError as exc:
        report.problems.append(str(exc))
        return None
    report.folder, report.resolved_by = os.path.abspath(source.folder), source.how
    report.files = len(source.files)
    return source


def _draft_class(
    report: Diagnosis,
    source: WeightSource,
    config: CheckpointConfig | None,
    launch: Launch | None,
    dry_run: bool,
) -> tuple[DraftSpec | None, Built | None]:
    """The hooked spec for the checkpoint's architecture and, with the dry run, the draft
    class sglang builds (on the meta device) and the spec that hooks it."""
    spec = _draft_spec(report, config)
    built = _build(report, source, launch) if dry_run and config is not None else None
    if built is not None:
        spec = spec_for_class(type(built.model))
        report.hooked = spec is not None
        report.hooked_by = spec.class_name if spec is not None else None
    elif not dry_run:
        report.unchecked.append(
            "the dry run was skipped (--no-dry-run): how sglang builds the draft and whether "
            "every parameter is filled"
        )
    return spec, built


def _tensors(
    report: Diagnosis,
    source: WeightSource,
    spec: DraftSpec | None,
    built: Built | None,
    config: CheckpointConfig | None,
    ckpt: Checkpoint,
    plan: DequantPlan,
) -> None:
    """One row per draft tensor (and per companion nothing uses), what each load walks, and
    the problem of a checkpoint with no weights or no draft."""
    report.description_file = ckpt.description_file
    _draft_walk(report, source, spec, built, config)
    if not ckpt.files:
        report.problems.append(
            f"{report.folder} holds no *.safetensors file sglang would stream: no weights"
        )
    report.tensors = [_row(entry) for entry in plan.entries.values()]
    report.tensors += _orphan_companions(ckpt, plan)
    report.tensors.sort(key=lambda row: row.name)
    if not report.tensors and ckpt.files:
        report.problems.append(
            "the checkpoint holds no draft (MTP) tensors: sglang's draft would keep "
            "uninitialised weights; use a checkpoint that includes the MTP layers"
        )


def _who_decodes(
    report: Diagnosis,
    spec: DraftSpec | None,
    built: Built | None,
    ckpt: Checkpoint,
    is_draft: NameRule,
) -> DequantPlan | None:
    """Which codes the plugin decodes (every one of a draft built unquantized; of one built
    quantized, its plain ``nn.Linear`` parts'), whether it is needed and active, and what stock
    sglang would do; returns a quantized draft's plan of its plain parts."""
    codes = [t for t in report.tensors if t.codes and t.action != "pass"]
    report.plugin_acts = spec is not None and (built is None or built.quant_config is None)
    plain_plan = None
    if built is not None and built.quant_config is not None:
        _left_to_sglang(report, built)
        codes = []
        if spec is not None:
            plain_plan = _plain_parts(report, built, ckpt, is_draft)
            codes = [t for t in report.tensors if t.codes and t.action != "pass"]
    if codes and spec is None:
        report.unsupported = (
            f"{len(codes)} draft tensors hold codes, but sglang builds "
            f"{report.draft_class or 'a draft class'} for architecture {report.architecture!r}, "
            "which this plugin does not hook (not supported yet): serve the draft quantized "
            "(--speculative-draft-model-quantization) or re-export the MTP layers as FLOAT"
        )
    # a quantized draft needs the plugin when it decodes the codes of a plain nn.Linear part
    _activation(report, needed=bool(codes) and (report.plugin_acts or plain_plan is not None))
    report.stock = _stock_summary(report, codes)
    _stock_outcome(report, codes)
    return plain_plan


def _load_dry_run(
    report: Diagnosis,
    built: Built,
    ckpt: Checkpoint,
    plan: DequantPlan,
    plain_plan: DequantPlan | None,
    spec: DraftSpec | None,
) -> None:
    """The load on the meta device, unless the plugin refuses tensors before it."""
    refused = plan.errors if report.plugin_acts else (plain_plan.errors if plain_plan else [])
    if refused:
        report.unchecked.append(
            "no dry run of the load: the plugin refuses the tensors above before sglang's "
            "loaders would see any; run the doctor again once they are fixed"
        )
    elif built.quant_config is not None:
        _dry_run(report, built, ckpt, plain_plan, spec, quantized=True)
    else:
        _dry_run(report, built, ckpt, plan if report.plugin_acts else None, spec)


def _draft_walk(
    report: Diagnosis,
    source: WeightSource,
    spec: DraftSpec | None,
    built: Built | None,
    config: CheckpointConfig | None,
) -> None:
    """How many tensors and files the draft load walks, stock and with the plugin (which
    streams only the files the index says hold the draft's tensors: ``narrowing.py``)."""
    if spec is not None:
        keeps = spec.kept_names(built.model if built is not None else config)
        choice = choose_files(source.folder, source.files, keeps)
    else:
        keeps = _draft_names(spec, built, config)
        files = tuple(source.files)
        choice = FileChoice(source.folder, files, files, not_narrowed="the plugin hooks no class")
    try:
        walk = count_walk(choice, keeps)
    except CheckpointFormatError as exc:
        report.unchecked.append(f"how many tensors the draft load walks: {exc}")
        return
    report.walk = walk.to_json()
    for path, name in walk.missed.items():
        report.problems.append(
            f"{path} holds the draft tensor {name!r}, but {', '.join(choice.indexes)} lists no "
            "draft tensor in it: the plugin would not stream that file (and the guard would "
            "refuse the draft if a parameter is left unwritten); fix the index, or set "
            f"{NARROW_ENV}=off to stream every file"
        )


def _build(report: Diagnosis, source: WeightSource, launch: Launch | None) -> Built | None:
    """sglang's draft on the meta device, or None (said as what could not be checked). Where
    stock sglang cannot build it (a ModelSlim build meeting FLOAT layers), the draft as the
    plugin builds it, or None with the plugin's refusal as a problem (``form_table``)."""
    from ..dryrun import build_meta_draft
    from .form_table import build_as_plugin

    report.form = _form_text(launch)
    built: Built | None
    try:
        built = build_meta_draft(source.folder, launch)
    except Exception as exc:  # noqa: BLE001 - no build, said so; the rest still stands
        built = build_as_plugin(report, source, launch, exc)
        if built is None and not report.problems:
            report.dry_run = f"not run ({type(exc).__name__}: {exc})"
            report.unchecked.append(
                "sglang's draft class could not be built on this machine, so neither how "
                "sglang quantizes the draft nor whether every parameter is filled was checked: "
                f"{type(exc).__name__}: {exc}"
            )
        if built is None:
            return None
    _describe_build(report, built, launch)
    return built


def _form_text(launch: Launch | None) -> str:
    from .forms import form_of

    namespace = launch.namespace if launch is not None else None
    quantization = getattr(namespace, "quantization", None)
    form = form_of(quantization, getattr(namespace, "speculative_draft_model_quantization", None))
    return f"{form.key} ({form.label})" if form is not None else "another quantization"


def _describe_build(report: Diagnosis, built: Built, launch: Launch | None) -> None:
    """The ``built:`` line: sglang's draft quantization, where it came from, and the class."""
    from ..draft_memory import draft_parameter_bytes
    from .forms import why_built

    namespace = launch.namespace if launch is not None else None
    quantization = getattr(namespace, "quantization", None)
    given = getattr(namespace, "speculative_draft_model_quantization", None)
    report.draft_class = built.class_name
    report.draft_dtype = built.dtype  # what sglang's --dtype auto builds
    report.draft_quantization = built.quantization
    report.built_quantized = built.quant_config
    report.draft_bytes = draft_parameter_bytes(built.model)
    why = why_built(sglang_version(), quantization, given)
    if built.quantization and quantization is None and given is None:
        why = "config.json's quantization_config"
    picked = f"sglang's draft ModelConfig picks quantization {built.quantization!r} ({why})"
    if built.quant_config is None:
        report.built = (
            f"{picked}; {built.class_name} is built unquantized: the plugin's hook acts"
            if built.quantization is None
            else f"{picked}; {built.class_name}'s own rule builds it unquantized: the "
            "plugin's hook acts"
        )
    else:
        report.built = (
            f"{picked}; {built.class_name} is built quantized ({built.quant_config}): its "
            "quantized layers consume their codes; the plugin's hook keeps sglang's stream, "
            "decodes what its plain nn.Linear parts receive and checks every write"
        )


def _plain_parts(
    report: Diagnosis, built: Built, ckpt: Checkpoint, is_draft: NameRule
) -> DequantPlan:
    """A quantized draft: the plugin's plan for the tensors of its plain ``nn.Linear`` parts
    (``fc`` / ``eh_proj``), which no quantization method reads; their rows replace the
    'pass' rows."""
    from dataclasses import replace

    from ...serving.plain_parts import feeds_plain_linear, plain_linears

    linears = plain_linears(built.model)
    mine = {n: i for n, i in ckpt.tensors.items() if is_draft(n) and feeds_plain_linear(n, linears)}
    plan = DequantPlan.build(replace(ckpt, tensors=mine))
    rows = {entry.info.name: _row(entry) for entry in plan.entries.values()}
    for row in rows.values():
        if row.action == "dequantize":
            row.reason += (
                " (a plain nn.Linear of the quantized draft: no quantization method reads it)"
            )
            row.stock = _stock_quantized(row)
    consumed = plan.consumed
    report.tensors = [
        rows.get(t.name, t) for t in report.tensors if t.name not in consumed or t.name in rows
    ]
    return plan


def _stock_quantized(row: TensorRow) -> str:
    """What stock sglang does with a code tensor meant for a plain ``nn.Linear``."""
    if row.name.endswith(".weight"):
        return "copies the raw codes into the float parameter, its scale dropped: silent misload"
    return "skipped by sglang's loader (no such parameter): the float parameter stays unwritten"


def _draft_names(
    spec: DraftSpec | None, built: Built | None, config: CheckpointConfig | None
) -> NameRule:
    if spec is not None:
        return spec.draft_names(built.model if built is not None else config)
    if built is not None and _is_nextn(built.class_name):
        return nextn_layer(built.model)
    return mtp_prefix(config)


def _is_nextn(class_name: str) -> bool:
    return "NextN" in class_name


def _left_to_sglang(report: Diagnosis, built: Built) -> None:
    """A draft sglang builds quantized: its codes go to sglang's quantized layers."""
    for row in report.tensors:
        if row.codes and row.action != "pass":
            row.action = "pass"
            row.reason = (
                f"{row.format or 'codes'} for sglang's {built.quant_config} layers (the draft is "
                "built quantized); the plugin does not touch it"
            )
            row.problem = row.hint = ""
            row.stock = "loaded by sglang's quantized layers"


def _activation(report: Diagnosis, needed: bool) -> None:
    try:
        from ..activation import plugin_activation

        found = plugin_activation()
    except Exception as exc:  # noqa: BLE001 - sglang's plugin loader itself failed
        report.plugin_activation = f"not asked ({type(exc).__name__}: {exc})"
        if needed:
            report.unchecked.append(f"whether sglang would load the plugin: {exc}")
        return
    report.plugin_active = found.active
    report.plugin_activation = found.why
    report.notes.extend(found.notes)
    if not found.active:
        if needed:
            report.inactive = (
                f"the draft needs the plugin, but sglang here would not load it: {found.why}"
            )
        else:
            report.notes.append(f"sglang here would not load the plugin: {found.why}")


def _notes(report: Diagnosis, ckpt: Checkpoint, built: Built | None) -> None:
    from ..cpu_env import stand_ins_used

    described_float = [
        t.name
        for t in report.tensors
        if t.action == "keep" and t.reason.startswith(f"described as {t.description} but")
    ]  # fmt: skip
    if described_float:
        report.notes.append(
            f"{len(described_float)} tensor(s) are described as quantized but stored as float "
            f"(e.g. {described_float[0]}): passed to sglang as they are; the misload guard "
            "checks their values when sglang loads them (codes stored as floats are refused)"
        )
    attention = [t for t in report.tensors if t.action == "pass" and "attention" in t.reason]
    if attention:
        report.notes.append(
            f"{len(attention)} FA3/C8 attention-quantization tensor(s) (e.g. "
            f"{attention[0].name}) are no weights: left to sglang, which has no parameter for "
            "them in an unquantized draft"
        )
    _quarot_note(report, ckpt, built)
    if ckpt.declared is not None:
        report.notes.append(
            f"config.json declares {ckpt.declared.label} quantization (not a ModelSlim export)"
        )
    for note in stand_ins_used().values():
        report.notes.append(note)


def _quarot_note(report: Diagnosis, ckpt: Checkpoint, built: Built | None) -> None:
    flag = ckpt.description_flags.get(QUAROT_FLAG)
    rot = os.path.join(ckpt.folder, QUAROT_FILE)
    if not flag and not os.path.isfile(rot):
        return
    where = f"{QUAROT_FILE} ({QUAROT_TENSOR})" if os.path.isfile(rot) else "no " + QUAROT_FILE
    said = f"QuaRot: the description says {QUAROT_FLAG}={flag!r}, the folder holds {where}"
    if built is not None and built.applies_rotation():
        report.notes.append(
            f"{said}; left to sglang: {built.class_name} rotates the target's hidden states "
            f"with it itself on NPU (deepseek_nextn.py reads <model path>/{QUAROT_FILE}); the "
            "plugin does not touch it"
        )
    else:
        name = built.class_name if built is not None else (report.draft_class or "the draft")
        report.notes.append(
            f"{said}; left to sglang, but sglang 0.5.23's {name} has no step that applies it "
            "(only DeepSeek's NextN draft reads it): its hidden-state input stays rotated"
        )


def _dry_run(
    report: Diagnosis,
    built: Built,
    ckpt: Checkpoint,
    plan: DequantPlan | None,
    spec: DraftSpec | None,
    quantized: bool = False,
) -> None:
    try:
        from ..dryrun import simulate_load

        coverage = simulate_load(built, ckpt, plan, spec, quantized=quantized)
    except Exception as exc:  # noqa: BLE001 - no coverage, said so; the rest still stands
        report.dry_run = f"not run ({type(exc).__name__}: {exc})"
        report.unchecked.append(
            "sglang's loader could not be dry-run, so no check that every parameter is "
            f"filled: {type(exc).__name__}: {exc}"
        )
        return
    how = "through the plugin's stream" if plan is not None else "as stock sglang"
    if quantized:
        how = f"built quantized ({built.quant_config}), through the plugin's stream"
    report.dry_run = f"{coverage.class_name} on the meta device, {how}"
    if plan is not None and any(t.action == "dequantize" for t in report.tensors):
        _stock_dry_run(report, built, ckpt, spec, quantized)
    report.unfilled = coverage.unwritten
    report.skipped = coverage.skipped
    # an unhooked class: the misload is why the draft is unsupported, said beside it
    found = report.notes if spec is None and built.quant_config is None else report.problems
    for parameter, sources in coverage.codes_in_float.items():
        who = (
            "sglang's loader copies"
            if spec is not None
            else "stock sglang copies (the plugin does not hook this class)"
        )
        found.append(
            f"{parameter} is a float parameter of {coverage.class_name} that no quantization "
            f"method owns, but {who} the raw codes of {', '.join(sources)} into it, with no "
            "scale: the draft proposes garbage; export that layer unquantized or in a format "
            "compressed-tensors decodes"
        )


def _stock_dry_run(
    report: Diagnosis,
    built: Built,
    ckpt: Checkpoint,
    spec: DraftSpec | None,
    quantized: bool = False,
) -> None:
    """Stock sglang's own loader on the same meta draft, without the plugin's stream.

    The per-tensor prediction (``_stock_for``) cannot see a loader that stops on a companion
    it has no parameter for: DeepSeek's NextN ``load_weights`` raises KeyError on the fused
    shared expert's ``weight_offset`` / ``weight_scale``, so stock sglang does not start at all
    on those exports. What its loader raises here is what the user would see."""
    from ..dryrun import simulate_load

    if report.startup_error:  # stock sglang never gets to load: its start-up stopped
        return
    try:
        stock = simulate_load(built, ckpt, None, spec)
        if quantized and (stock.unwritten or stock.codes_in_float):
            broken = [*stock.unwritten, *stock.codes_in_float]
            report.stock_serves = False
            report.stock_outcome = f"serves garbage ({', '.join(broken)} raw codes or unwritten)"
            report.stock = (
                f"stock sglang {sglang_version()} builds {built.class_name} quantized "
                f"({built.quant_config}) and loads it with no error, but {', '.join(broken)} "
                "would hold uninitialised memory or raw codes (seen in a dry run of sglang's "
                "own load_weights without the plugin): the draft proposes garbage"
            )
    except Exception as exc:  # noqa: BLE001 - stock sglang's own failure, reported as such
        report.stock_serves = False
        report.stock_outcome = f"does not start (its loader: {type(exc).__name__}: {exc})"
        report.stock = (
            f"stock sglang {sglang_version()} builds {built.class_name} unquantized and its "
            f"loader stops: {type(exc).__name__}: {exc} (the server does not start; seen in a "
            "dry run of sglang's own load_weights without the plugin)"
        )


# -- the pieces ------------------------------------------------------------------------------


def _read_config(report: Diagnosis) -> CheckpointConfig | None:
    try:
        config = CheckpointConfig.read(report.folder)
    except CheckpointFormatError as exc:
        report.problems.append(f"{exc.file} {exc.problem}")
        return None
    report.draft_dtype = config.dtype
    return config


def _draft_spec(report: Diagnosis, config: CheckpointConfig | None) -> DraftSpec | None:
    if config is None:
        return None
    report.architecture = config.architecture
    if report.architecture is None:
        report.problems.append("config.json names no architectures: sglang cannot pick a class")
        return None
    spec = spec_for_architecture(report.architecture)
    if spec is not None:
        report.draft_class = report.hooked_by = spec.class_name
        report.hooked = True
    return spec


STOCK_SILENT = "copies the raw codes into a float parameter: silent misload"
STOCK_LOUD = "fails sglang's shape check (packed 4-bit codes): the load stops"
STOCK_UNKNOWN = (
    "copies the raw codes into a float parameter (silent misload), or fails "
    "sglang's shape check if they are packed"
)


def _stock_for(entry: PlannedTensor) -> str:
    """What sglang's unwrapped loader does with this tensor (checked in test_doctor.py)."""
    info = entry.info
    if not info.holds_codes:
        return "loads as is"
    if entry.decoder is None:  # undecodable: its logical shape is unknown
        return STOCK_UNKNOWN
    return STOCK_LOUD if entry.decoder.shape != info.shape else STOCK_SILENT


def _row(entry: PlannedTensor) -> TensorRow:
    info = entry.info
    return TensorRow(
        name=info.name,
        dtype=info.dtype_name,
        shape=list(info.shape),
        description=entry.description_type,
        scheme=entry.scheme,
        companions=sorted(c.name for c in entry.companions.values()),
        action=entry.action,
        reason=entry.reason,
        stock=_stock_for(entry) if entry.action != "pass" else "passed to sglang by name",
        problem=entry.error.problem if entry.error is not None else "",
        hint=entry.error.hint if entry.error is not None else "",
        codes=info.holds_codes,
        format=entry.format,
    )


def _orphan_companions(ckpt: Checkpoint, plan: DequantPlan) -> list[TensorRow]:
    """Companion-named tensors whose weight the checkpoint does not hold: listed, kept."""
    attached = {c.name for e in plan.entries.values() for c in e.companions.values()}
    rows = []
    for name, info in ckpt.tensors.items():
        split = split_companion(name)
        if name in plan.entries or name in attached or split is None:
            continue
        rows.append(_orphan_row(info, ckpt.type_of(name), f"{split[0]}.weight"))
    return rows


def _orphan_row(info: TensorInfo, described: str | None, weight: str) -> TensorRow:
    return TensorRow(
        name=info.name,
        dtype=info.dtype_name,
        shape=list(info.shape),
        description=described,
        scheme=None,
        companions=[],
        action="keep",
        reason=f"companion of {weight}, which the checkpoint does not hold; passed to sglang",
        stock="passed to sglang (skipped or warned about by name)",
        codes=info.holds_codes,
    )


def _stock_outcome(report: Diagnosis, integer: list[TensorRow]) -> None:
    """Whether stock sglang serves this draft right, short (the dry run may say otherwise)."""
    if report.startup_error:
        report.stock_serves = False
        report.stock_outcome = f"does not start ({report.startup_error})"
        report.stock = (
            f"stock sglang {sglang_version()} does not start: building "
            f"{report.draft_class or 'the draft'} quantized stops with {report.startup_error} "
            "(sglang #34211: its ModelSlim MoE schemes have no FLOAT)"
        )
    elif not report.tensors:
        report.stock_serves, report.stock_outcome = None, "no draft tensors"
    elif report.built_quantized or not integer:
        report.stock_serves, report.stock_outcome = True, "serves right"
    elif all(t.stock == STOCK_SILENT for t in integer):
        report.stock_serves = False
        report.stock_outcome = "serves garbage (raw codes in the bf16 draft: accept length ~1)"
    else:
        report.stock_serves = False
        report.stock_outcome = "does not load right (packed codes stop the load, or raw codes)"


def _stock_summary(report: Diagnosis, integer: list[TensorRow]) -> str:
    draft = report.draft_class or "the draft"
    version = f"stock sglang {sglang_version()}"
    if not report.tensors:
        return f"{version} finds no draft tensors to load"
    if report.built_quantized:
        return f"{version} builds {draft} quantized ({report.built_quantized}), as with the plugin"
    if not integer:
        return f"{version} loads every {draft} tensor as the float it is: nothing to fix"
    silent = [t for t in integer if t.stock == STOCK_SILENT]
    loud = sum(t.stock == STOCK_LOUD for t in integer)
    unknown = len(integer) - len(silent) - loud
    said = [f"{version} builds {draft} unquantized"]
    if silent:
        said.append(
            f"copies the codes of {len(silent)} draft tensor(s) into "
            f"{report.draft_dtype} parameters with no error: the draft proposes garbage and "
            "the accept length drops to about 1"
        )
    if loud:
        said.append(f"stops on a shape mismatch for {loud} packed 4-bit tensor(s)")
    if unknown:
        said.append(
            f"copies or, if packed, fails on {unknown} tensor(s) in a scheme this plugin "
            "does not decode"
        )
    return "; ".join(said)
