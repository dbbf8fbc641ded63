"""What the doctor finds: ``diagnose`` fills a ``Diagnosis`` for one checkpoint path.

The plugin's load-time decisions, by the same code, on the files sglang would stream; what stock
sglang does instead; and, from a dry run of sglang's own draft class (``dryrun.py``), which
parameters nothing fills. No weight is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...errors import CheckpointFormatError, MixedPrecisionLayerError
from ...formats.checkpoint import Checkpoint, TensorInfo, WeightSource
from ...formats.config import CheckpointConfig
from ...formats.description import draft_layers, moe_layer_plan
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
from ...serving.float_layers import DRAFT_WAY_OUT as WAY_OUT
from ...serving.float_layers import refusal
from ...serving.narrowing import NARROW_ENV, FileChoice, choose_files, count_walk
from ..forms import MODELSLIM, draft_quantization, form_of, why_built
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
    ``launch``: the user's sglang flags (None: as on NPU); ``forms``: every launch form too."""
    from ..cpu_env import forget_stand_ins
    from ..launch import DEFAULT_ANSWER, default_launch

    forget_stand_ins()
    report = Diagnosis(requested=path)
    report.launch = launch.describe() if launch is not None else DEFAULT_ANSWER
    report.notes.extend(launch.notes() if launch is not None else [])
    source = _resolve(report, path, download_dir, revision)
    if source is None:
        return report
    config = _read_config(report)
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
    is_draft = _draft_names(spec, built, config)
    try:
        ckpt = Checkpoint.open(source, wanted=is_draft)
        plan = DequantPlan.build(ckpt)
    except CheckpointFormatError as exc:
        report.problems.append(str(exc))
        return report
    asked = _Asked(source, launch or default_launch(source.folder), config, spec, built, ckpt)
    _tensors(report, asked, plan, is_draft)
    plain_plan = _who_decodes(report, asked, is_draft)
    _notes(report, asked)
    _target(report, asked, is_draft)
    if built is not None and report.tensors:
        _load_dry_run(report, asked, plan, plain_plan)
    _settle_stock(report)
    if forms and dry_run:
        from .form_table import answer_every_form

        def for_launch(form_launch: Launch) -> Diagnosis:
            return diagnose(path, download_dir=download_dir, revision=revision, launch=form_launch)

        answer_every_form(report, for_launch, path, launch)
    return report


@dataclass(frozen=True)
class _Asked:
    """One launch of one checkpoint, as the doctor found it."""

    source: WeightSource
    launch: Launch
    config: CheckpointConfig | None
    spec: DraftSpec | None  # the hooked class whose load_weights runs for the draft
    built: Built | None
    ckpt: Checkpoint  # the draft's tensors


def _target(report: Diagnosis, asked: _Asked, is_draft: NameRule) -> None:
    """The target of the same launch: its MoE layers described with FLOAT experts (stock stops
    there in every form) and its linear layers built unquantized over codes (``target_check``)."""
    cells = []
    plan = moe_layer_plan(asked.ckpt.description)
    stops = plan.target_stops(is_draft) if asked.launch.device == "npu" else ()
    if stops:
        where = stops[0] + (f" and {len(stops) - 1} more MoE layer(s)" if len(stops) > 1 else "")
        report.target_stop = (
            f"the target's {where} described with FLOAT experts, which sglang's ModelSlim MoE "
            "schemes lack (sglang #34211)"
        )
        refused = [p for p in plan.refused if p.layer in stops]
        report.problems += [f"the plugin stops the start-up: {refusal(p, False)}" for p in refused]
        done = "refuses it (experts part FLOAT)" if refused else "builds them unquantized"
        cells.append(f"stock does not start at {where} (FLOAT experts), the plugin {done}")
    if asked.built is not None:
        check = report_into(report.notes, report.problems, asked.source.folder, asked.launch)
        outcome = check.outcome() if check is not None else None
        if outcome is not None:  # its layers are named in the notes: the counts here
            report.target_garbage = outcome.stock.split(" (")[0]
            cells.append(f"stock {report.target_garbage}, with the plugin {outcome.plugin}")
    report.target = "; ".join(cells)


def _resolve(
    report: Diagnosis, path: str, download_dir: str | None, revision: str | None
) -> WeightSource | None:
    """The files sglang would stream for ``path``; None, the problem said, for no checkpoint."""
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


def _tensors(report: Diagnosis, asked: _Asked, plan: DequantPlan, is_draft: NameRule) -> None:
    """One row per draft tensor (and per companion nothing uses), and what each load walks."""
    ckpt = asked.ckpt
    report.description_file = ckpt.description_file
    _draft_walk(report, asked, is_draft)
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


def _who_decodes(report: Diagnosis, asked: _Asked, is_draft: NameRule) -> DequantPlan | None:
    """Which codes the plugin decodes and whether sglang loads it; a quantized draft's plan."""
    spec, built = asked.spec, asked.built
    codes = [t for t in report.tensors if t.codes and t.action != "pass"]
    report.plugin_acts = spec is not None and (built is None or built.quant_config is None)
    plain_plan = None
    if built is not None and built.quant_config is not None:
        _left_to_sglang(report, built)
        codes = []
        if spec is not None:
            plain_plan = _plain_parts(report, built, asked.ckpt, is_draft)
            codes = [t for t in report.tensors if t.codes and t.action != "pass"]
    if codes and spec is None:
        report.unsupported = (
            f"{len(codes)} draft tensors hold codes, but sglang builds "
            f"{report.draft_class or 'a draft class'} for architecture {report.architecture!r}, "
            "which this plugin does not hook (not supported yet): serve the draft quantized "
            "(--speculative-draft-model-quantization) or re-export the MTP layers as FLOAT"
        )
    _activation(report, needed=bool(codes) and (report.plugin_acts or plain_plan is not None))
    return plain_plan


def _load_dry_run(
    report: Diagnosis, asked: _Asked, plan: DequantPlan, plain_plan: DequantPlan | None
) -> None:
    """The load on the meta device, stock and through the plugin's stream."""
    built = asked.built
    assert built is not None
    quantized = built.quant_config is not None
    mine = plain_plan if quantized else (plan if report.plugin_acts else None)
    if mine is not None and mine.errors:
        report.unchecked.append(
            "no dry run of the load: the plugin refuses the tensors above before sglang's "
            "loaders would see any; run the doctor again once they are fixed"
        )
        return
    if not report.startup_error and (quantized or (mine is not None and mine.to_dequantize)):
        _stock_dry_run(report, built, asked.ckpt, asked.spec)
    _dry_run(report, built, asked.ckpt, mine, asked.spec)


def _draft_walk(report: Diagnosis, asked: _Asked, is_draft: NameRule) -> None:
    """How many tensors and files the draft load walks, stock and with the plugin."""
    source, spec = asked.source, asked.spec
    keeps = is_draft
    if spec is not None:
        keeps = spec.kept_names(asked.built.model if asked.built is not None else asked.config)
        choice = choose_files(source.folder, source.files, keeps)
    else:
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
    """sglang's draft on the meta device as stock builds it, else as the plugin does, or None."""
    from ..dryrun import build_meta_draft, draft_architecture

    report.form = _form_text(launch)
    built: Built | None
    try:
        built = build_meta_draft(source.folder, launch)
    except Exception as exc:  # noqa: BLE001 - sglang's own failure, said as such
        report.draft_class = draft_architecture(source.folder) or report.draft_class
        built = _built_by_the_plugin(report, source, launch, exc)
        if built is None:
            return None
    _describe_build(report, built, launch)
    return built


def _built_by_the_plugin(
    report: Diagnosis, source: WeightSource, launch: Launch | None, exc: Exception
) -> Built | None:
    """Stock sglang could not build the draft (``exc``): with ModelSlim the server's start-up
    stop, so the draft is built again with the plugin's hook; any other failure is unchecked."""
    from ...formats.description import read_description
    from ...serving.float_layers import builds_as_the_plugin
    from ..dryrun import build_meta_draft

    error = quoted(exc)
    if draft_quantization(*_flags(launch)) != MODELSLIM:
        report.dry_run = f"not run ({error})"
        report.unchecked.append(
            "sglang's draft class could not be built on this machine, so neither how sglang "
            f"quantizes the draft nor whether every parameter is filled was checked: {error}"
        )
        return None
    report.startup_error = error
    try:
        built = build_meta_draft(source.folder, launch, builds_as_the_plugin)
    except MixedPrecisionLayerError as refused:
        report.problems.append(f"the plugin stops the start-up: {refused}")
        return None
    except Exception as again:  # noqa: BLE001 - sglang's own stop, with the plugin too
        said = "as stock does" if quoted(again) == error else f"with {quoted(again)}"
        report.problems.append(f"with the plugin too sglang stops at start-up ({said}): {WAY_OUT}")
        return None
    entries = read_description(source.folder).entries
    floats = [x for x in moe_layer_plan(entries).built_unquantized if draft_layers(entries)(x)]
    if floats:
        report.plugin_builds = (
            f"the plugin builds {', '.join(floats)} (described FLOAT) unquantized and loads "
            "their floats as stored; the other layers are sglang's quantized layers"
        )
    return built


def quoted(exc: BaseException) -> str:
    """sglang's own error, as it words it."""
    return f"{type(exc).__name__}: {exc}"


def _flags(launch: Launch | None) -> tuple[str | None, str | None]:
    """The launch's ``--quantization`` and draft quantization flags as given."""
    namespace = launch.namespace if launch is not None else None
    return (
        getattr(namespace, "quantization", None),
        getattr(namespace, "speculative_draft_model_quantization", None),
    )


def _form_text(launch: Launch | None) -> str:
    form = form_of(*_flags(launch))
    return f"{form.key} ({form.label})" if form is not None else "another quantization"


def _describe_build(report: Diagnosis, built: Built, launch: Launch | None) -> None:
    """The ``built:`` line: sglang's draft quantization, where it came from, the class."""
    from ..draft_memory import draft_parameter_bytes, vocab_copy_bytes

    quantization, given = _flags(launch)
    report.draft_class, report.draft_dtype = built.class_name, built.dtype
    report.draft_quantization, report.built_quantized = built.quantization, built.quant_config
    report.draft_bytes = draft_parameter_bytes(built.model)
    report.vocab_bytes = vocab_copy_bytes(built.model)
    why = why_built(sglang_version(), quantization, given)
    if built.quantization and quantization is None and given is None:
        why = "config.json's quantization_config"
    picked = f"sglang's draft ModelConfig picks quantization {built.quantization!r} ({why})"
    if built.quant_config is not None:
        report.built = (
            f"{picked}; {built.class_name} is built quantized ({built.quant_config}): its "
            "quantized layers consume their codes; the plugin's hook keeps sglang's stream, "
            "decodes what its plain parts receive and checks every write"
        )
    else:
        rule = " is built" if built.quantization is None else "'s own rule builds it"
        report.built = f"{picked}; {built.class_name}{rule} unquantized: the plugin's hook acts"


def _plain_parts(
    report: Diagnosis, built: Built, ckpt: Checkpoint, is_draft: NameRule
) -> DequantPlan:
    """A quantized draft: the plan for its plain parts; their rows replace the 'pass' rows."""
    from ...serving.plain_parts import feeds_plain_linear, plain_linears

    linears = plain_linears(built.model)
    mine = {n: i for n, i in ckpt.tensors.items() if is_draft(n) and feeds_plain_linear(n, linears)}
    plan = DequantPlan.build(replace(ckpt, tensors=mine))
    rows = {entry.info.name: _row(entry) for entry in plan.entries.values()}
    for row in rows.values():
        if row.action == "dequantize":
            row.reason += " (a layer sglang builds unquantized: no quantization method reads it)"
            row.stock = (
                "copies the raw codes into the float parameter, its scale dropped: silent misload"
                if row.name.endswith(".weight")
                else "skipped by sglang's loader (no such parameter): the parameter stays unwritten"
            )
    report.tensors = [
        rows.get(t.name, t) for t in report.tensors if t.name not in plan.consumed or t.name in rows
    ]
    return plan


def _draft_names(
    spec: DraftSpec | None, built: Built | None, config: CheckpointConfig | None
) -> NameRule:
    """The draft class's own name rule, or, for a class the plugin does not hook, its family's."""
    if spec is not None:
        return spec.draft_names(built.model if built is not None else config)
    if built is not None and "NextN" in built.class_name:
        return nextn_layer(built.model)
    return mtp_prefix(config)


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
    report.plugin_active, report.plugin_activation = found.active, found.why
    report.notes.extend(found.notes)
    if not found.active and needed:
        report.inactive = (
            f"the draft needs the plugin, but sglang here would not load it: {found.why}"
        )
    elif not found.active:
        report.notes.append(f"sglang here would not load the plugin: {found.why}")


def _notes(report: Diagnosis, asked: _Asked) -> None:
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
    _quarot_note(report, asked.ckpt, asked.built)
    if asked.ckpt.declared is not None:
        report.notes.append(
            f"config.json declares {asked.ckpt.declared.label} quantization (not a ModelSlim "
            "export)"
        )
    report.notes.extend(stand_ins_used().values())


def _quarot_note(report: Diagnosis, ckpt: Checkpoint, built: Built | None) -> None:
    flag = ckpt.description_flags.get(QUAROT_FLAG)
    rot = os.path.join(ckpt.folder, QUAROT_FILE)
    if not flag and not os.path.isfile(rot):
        return
    where = f"{QUAROT_FILE} ({QUAROT_TENSOR})" if os.path.isfile(rot) else "no " + QUAROT_FILE
    said = f"QuaRot: the description says {QUAROT_FLAG}={flag!r}, the folder holds {where}"
    if built is None:
        report.notes.append(f"{said}; left to sglang (the plugin does not touch it)")
    elif built.applies_rotation():
        report.notes.append(
            f"{said}; left to sglang: {built.class_name} rotates the target's hidden states "
            f"with it itself on NPU (deepseek_nextn.py reads <model path>/{QUAROT_FILE}); the "
            "plugin does not touch it"
        )
    else:
        report.notes.append(
            f"{said}; left to sglang, but sglang 0.5.23's {built.class_name} has no step that "
            "applies it (only DeepSeek's NextN draft reads it): its hidden-state input stays "
            "rotated"
        )


def _dry_run(
    report: Diagnosis,
    built: Built,
    ckpt: Checkpoint,
    plan: DequantPlan | None,
    spec: DraftSpec | None,
) -> None:
    """sglang's loader on the meta draft, through the plugin's stream where ``plan``."""
    from ..dryrun import simulate_load

    quantized = built.quant_config is not None
    modelslim = built.quant_config == MODELSLIM
    try:
        coverage = simulate_load(built, ckpt, plan, spec, quantized=quantized)
    except Exception as exc:  # noqa: BLE001 - sglang's loader stops: said, the rest stands
        error = quoted(exc)
        same = error == report.stock_loader_error
        report.dry_run = f"not run ({error})"
        if modelslim:  # a server of this form stops loading the draft, the plugin's or not
            report.dry_run = "not run (its loader stops as stock's)" if same else report.dry_run
            said = "as stock's does" if same else f"with {error}"
            report.problems.append(f"with the plugin too sglang's loader stops ({said}): {WAY_OUT}")
        else:
            report.unchecked.append(
                "sglang's loader could not be dry-run, so no check that every parameter is "
                f"filled: {error}"
            )
        return
    how = "through the plugin's stream" if plan is not None else "as stock sglang"
    if quantized:
        how = f"built quantized ({built.quant_config}), through the plugin's stream"
    report.dry_run = f"{coverage.class_name} on the meta device, {how}"
    report.unfilled = coverage.unwritten
    report.skipped = coverage.skipped
    # an unhooked class: the misload is why the draft is unsupported, a note
    found = report.notes if spec is None and not quantized else report.problems
    who = "sglang's loader copies" if spec is not None else "stock sglang copies"
    for parameter, sources in coverage.codes_in_float.items():
        found.append(
            f"{parameter} is a float parameter of {coverage.class_name} that no quantization "
            f"method owns, but {who} the raw codes of {', '.join(sources)} into it, with no "
            "scale: the draft proposes garbage; "
            + (WAY_OUT if modelslim else "export that layer unquantized or in a format it decodes")
        )


def _stock_dry_run(
    report: Diagnosis, built: Built, ckpt: Checkpoint, spec: DraftSpec | None
) -> None:
    """Stock sglang's loader on the same meta draft: what it raises, or what it leaves wrong."""
    from ..dryrun import simulate_load

    try:
        stock = simulate_load(built, ckpt, None, spec)
    except Exception as exc:  # noqa: BLE001 - stock sglang's own failure, reported as such
        report.stock_loader_error = quoted(exc)
        return
    if built.quant_config is not None:
        report.stock_garbage = [*stock.unwritten, *stock.codes_in_float]


def _settle_stock(report: Diagnosis) -> None:
    """What stock sglang does with this launch, short (``stock_outcome``) and said (``stock``)."""
    version, draft = f"stock sglang {sglang_version()}", report.draft_class or "the draft"
    how = f"quantized ({report.built_quantized})" if report.built_quantized else "unquantized"
    seen = "(seen in a dry run of sglang's own load_weights without the plugin)"
    if report.target_stop or report.startup_error or report.stock_loader_error:
        report.stock_serves = False
        if report.target_stop:
            report.stock_outcome = "does not start (at the target)"
            report.stock = f"{version} does not start: {report.target_stop}, in every form"
        elif report.startup_error:
            report.stock_outcome = f"does not start ({report.startup_error})"
            report.stock = (
                f"{version} does not start: building {draft} quantized stops with "
                f"{report.startup_error}"
            )
        else:
            report.stock_outcome = f"does not start (its loader: {report.stock_loader_error})"
            report.stock = (
                f"{version} builds {draft} {how} and its loader stops: "
                f"{report.stock_loader_error} (the server does not start; {seen[1:-1]})"
            )
    elif report.stock_garbage:
        broken = ", ".join(report.stock_garbage)
        report.stock_serves = False
        report.stock_outcome = (
            f"serves garbage ({len(report.stock_garbage)} float parameter(s) left unwritten or "
            f"holding raw codes, e.g. {report.stock_garbage[0]})"
        )
        report.stock = (
            f"{version} builds {draft} {how} and loads it with no error, but {broken} would "
            f"hold uninitialised memory or raw codes {seen}: the draft proposes garbage"
        )
    else:
        _stock_by_tensor(report, version, draft)
    if report.target_garbage and not report.target_stop:
        report.stock_serves = False
        report.stock += f"; its target: {report.target_garbage}"
        if report.stock_outcome in ("serves right", "no draft tensors"):
            report.stock_outcome = "serves garbage (at the target)"


STOCK_SILENT = "copies the raw codes into a float parameter: silent misload"
STOCK_LOUD = "fails sglang's shape check (packed 4-bit codes): the load stops"
STOCK_UNKNOWN = (
    "copies the raw codes into a float parameter (silent misload), or fails "
    "sglang's shape check if they are packed"
)


def _stock_by_tensor(report: Diagnosis, version: str, draft: str) -> None:
    """Stock's answer from each draft tensor's fate, where no dry run said otherwise."""
    codes = [t for t in report.tensors if t.codes and t.action != "pass"]
    silent = [t for t in codes if t.stock == STOCK_SILENT]
    loud = sum(t.stock == STOCK_LOUD for t in codes)
    if not report.tensors:
        report.stock_serves, report.stock_outcome = None, "no draft tensors"
        report.stock = f"{version} finds no draft tensors to load"
        return
    if report.built_quantized or not codes:
        report.stock_serves, report.stock_outcome = True, "serves right"
        report.stock = (
            f"{version} builds {draft} quantized ({report.built_quantized}), as with the plugin"
            if report.built_quantized
            else f"{version} loads every {draft} tensor as the float it is: nothing to fix"
        )
        return
    report.stock_serves = False
    report.stock_outcome = (
        f"serves garbage (raw codes in the {report.draft_dtype} draft: accept length ~1)"
        if len(silent) == len(codes)
        else "does not load right (packed codes stop the load, or raw codes)"
    )
    said = [f"{version} builds {draft} unquantized"]
    if silent:
        said.append(
            f"copies the codes of {len(silent)} draft tensor(s) into {report.draft_dtype} "
            "parameters with no error: the draft proposes garbage and the accept length drops "
            "to about 1"
        )
    if loud:
        said.append(f"stops on a shape mismatch for {loud} packed 4-bit tensor(s)")
    if len(codes) - len(silent) - loud:
        said.append(
            f"copies or, if packed, fails on {len(codes) - len(silent) - loud} tensor(s) in a "
            "scheme this plugin does not decode"
        )
    report.stock = "; ".join(said)


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


def _stock_for(entry: PlannedTensor) -> str:
    """What sglang's unwrapped loader does with this tensor."""
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
