"""What the doctor finds: ``diagnose`` fills a ``Diagnosis`` for one checkpoint path.

Usage::

    report = diagnose("/models/Qwen3.5-27B-w8a8")          # a folder, a snapshot, a hub id
    report = diagnose("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision="main")
    print(render_text(report))              # a table, the verdict last
    print(json.dumps(report.to_json()))     # {"schema_version": 2, "verdict": "ok"|"error", ...}
    sys.exit(0 if report.verdict == "ok" else 1)

Why it exists: the bug this package fixes is silent (stock sglang serves raw int8 codes and
logs nothing), so an operator needs a way to ask, before starting a server, "will this
checkpoint's draft load correctly?". The doctor answers with the very decisions the plugin
will take at load time, on the files sglang would stream (``sources.resolve_offline``: sglang's
own resolution, offline), ``Checkpoint`` + ``DequantPlan`` (the same code), what stock sglang
would do instead, and, from a dry run of sglang's own draft class on the meta device
(``dryrun.py``), which draft parameters no checkpoint tensor will fill and which names the
class will skip. It reads headers, ``config.json``, the description and the small companion
tensors only (never a weight).
"""

from __future__ import annotations

from ...errors import CheckpointFormatError
from ...formats.checkpoint import Checkpoint, TensorInfo
from ...formats.config import CheckpointConfig
from ...formats.naming import mtp_prefix, split_companion
from ...formats.plan import DequantPlan, PlannedTensor
from ...serving.context import sglang_version
from ...serving.drafts import DraftSpec, spec_for_architecture
from ..resolve import resolve_checkpoint
from .model import Diagnosis, TensorRow


def diagnose(
    path: str,
    *,
    download_dir: str | None = None,
    revision: str | None = None,
    dry_run: bool = True,
) -> Diagnosis:
    """Everything the doctor reports about ``path``; never raises on a bad checkpoint.

    ``path`` is what sglang gets as ``--model-path``: a folder, a snapshot folder, or a hub id
    in the local cache (``download_dir`` and ``revision`` as sglang's ``--download-dir`` and
    ``--revision``). ``dry_run=False`` skips building the draft class (no parameter coverage).
    """
    report = Diagnosis(requested=path)
    try:
        source = resolve_checkpoint(path, download_dir=download_dir, revision=revision)
    except CheckpointFormatError as exc:
        report.problems.append(str(exc))
        return report
    report.folder, report.resolved_by = source.folder, source.how
    report.files = len(source.files)
    config = _read_config(report)
    spec = _draft_spec(report, config)
    is_draft = spec.draft_names(config) if spec is not None else mtp_prefix(config)
    try:
        ckpt = Checkpoint.open(source, wanted=is_draft)
        plan = DequantPlan.build(ckpt)
    except CheckpointFormatError as exc:
        report.problems.append(str(exc))
        return report
    report.description_file = ckpt.description_file
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
    codes = [t for t in report.tensors if t.codes]
    if codes and spec is None:
        report.problems.append(
            f"{len(codes)} draft tensors hold codes, but this plugin hooks no draft class for "
            f"architecture {report.architecture!r}; serve the draft quantized "
            "(--speculative-draft-model-quantization) or re-export the MTP layers as FLOAT"
        )
    report.stock = _stock_summary(report, codes)
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
    if spec is not None and dry_run and report.tensors:
        if plan.errors:
            report.notes.append(
                "no dry run of the draft class: the plugin refuses the tensors above before "
                "sglang's loaders would see any; run the doctor again once they are fixed"
            )
        else:
            _dry_run(report, source, ckpt, plan, spec)
    return report


def _dry_run(report: Diagnosis, source, ckpt: Checkpoint, plan: DequantPlan, spec: DraftSpec):
    try:
        from ..dryrun import simulate_load

        coverage = simulate_load(source, ckpt, plan, spec)
    except Exception as exc:  # noqa: BLE001 - no coverage, said so; the rest still stands
        report.dry_run = f"not run ({type(exc).__name__}: {exc})"
        report.notes.append(
            "no dry run of the draft class, so no check that every parameter is filled: "
            f"{type(exc).__name__}: {exc}"
        )
        return
    report.dry_run = f"{coverage.class_name} on the meta device"
    report.draft_dtype = coverage.dtype  # what sglang's --dtype auto builds
    report.unfilled = coverage.unwritten
    report.skipped = coverage.skipped


# -- the pieces ------------------------------------------------------------------------------


def _read_config(report: Diagnosis) -> CheckpointConfig | None:
    try:
        config = CheckpointConfig.read(report.folder)
    except CheckpointFormatError as exc:
        report.problems.append(f"{exc.file} {exc.problem}")
        return None
    report.draft_dtype = config.dtype or report.draft_dtype
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
        report.draft_class = spec.class_name
        report.hooked = True
    return spec


STOCK_SILENT = "copies the raw codes into a float parameter: silent misload"
STOCK_LOUD = "fails sglang's shape check (packed int4 codes): the load stops"
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
        stock=_stock_for(entry),
        problem=entry.error.problem if entry.error is not None else "",
        hint=entry.error.hint if entry.error is not None else "",
        codes=info.holds_codes,
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


def _stock_summary(report: Diagnosis, integer: list[TensorRow]) -> str:
    draft = report.draft_class or "the draft"
    version = f"stock sglang {sglang_version()}"
    if not report.tensors:
        return f"{version} finds no draft tensors to load"
    if not integer:
        return f"{version} loads every {draft} tensor as the float it is: nothing to fix"
    silent = [t for t in integer if t.stock == STOCK_SILENT]
    loud = sum(t.stock == STOCK_LOUD for t in integer)
    unknown = len(integer) - len(silent) - loud
    said = [
        f"{version} builds {draft} unquantized (unless --speculative-draft-model-"
        "quantization is given)"
    ]
    if silent:
        said.append(
            f"copies the codes of {len(silent)} draft tensor(s) into "
            f"{report.draft_dtype} parameters with no error: the draft proposes garbage and "
            "the accept length drops to about 1"
        )
    if loud:
        said.append(f"stops on a shape mismatch for {loud} packed int4 tensor(s)")
    if unknown:
        said.append(
            f"copies or, if packed, fails on {unknown} tensor(s) in a scheme this plugin "
            "does not decode"
        )
    return "; ".join(said)
