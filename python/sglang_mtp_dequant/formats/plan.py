"""What to do with each draft tensor of a checkpoint: dequantize, keep, or refuse.

Usage::

    ckpt = Checkpoint.open(source, wanted=lambda n: n.startswith("mtp."))
    plan = DequantPlan.build(ckpt)
    plan.raise_first_error()            # the hook does this; `doctor` lists instead
    plan.entries["mtp.layers.0.mlp.up_proj.weight"].decoder.decompress(q, torch.bfloat16)

Built from headers and the small companion tensors before sglang hands a weight to the
draft's loaders, so a bad checkpoint stops the load before a parameter is written, and the
doctor shows the same verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from ..errors import CheckpointFormatError, DraftWeightError
from . import foreign, library, naming
from .checkpoint import Checkpoint, TensorInfo
from .library import LibraryDecoder
from .schemes import AffineDecoder, Scheme, infer_type, known_types, scheme_for
from .schemes.base import refused

#: dequantize: codes the plugin decodes; keep: a float tensor; pass: no weight (FA3 / C8),
#: handed to sglang as it is; error: codes the plugin cannot decode (the load is refused)
Action = Literal["dequantize", "keep", "pass", "error"]


@dataclass
class PlannedTensor:
    """One draft tensor and the plugin's decision about it."""

    info: TensorInfo
    description_type: str | None
    action: Action
    reason: str
    scheme: str | None = None
    companions: dict[str, TensorInfo] = field(default_factory=dict)
    decoder: AffineDecoder | LibraryDecoder | None = None
    error: DraftWeightError | None = None
    format: str | None = None  # the foreign format it is stored in (``foreign.py``), if any

    @property
    def output_name(self) -> str:
        """The name the decoded weight is handed on under (``X.weight`` for ``X.weight_packed``)."""
        return getattr(self.decoder, "output_name", None) or self.info.name


@dataclass
class DequantPlan:
    """Per-draft-tensor decisions for one checkpoint, plus the companions they consume."""

    checkpoint: Checkpoint
    entries: dict[str, PlannedTensor] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, checkpoint: Checkpoint) -> DequantPlan:
        """Decide for every tensor ``checkpoint`` recorded (it records the draft's only)."""
        plan = cls(checkpoint)
        names = checkpoint.tensors
        pending: list[tuple[PlannedTensor, Scheme]] = []
        for name, info in sorted(names.items()):
            if naming.is_companion(name, names) or _is_foreign_companion(name):
                continue
            entry, scheme = plan._classify(info)
            plan.entries[name] = entry
            if scheme is not None:
                pending.append((entry, scheme))
        plan._prepare(pending)
        for entry in plan.entries.values():
            if entry.action == "dequantize":
                plan.consumed.update(c.name for c in entry.companions.values())
        return plan

    @property
    def to_dequantize(self) -> dict[str, PlannedTensor]:
        return {n: e for n, e in self.entries.items() if e.action == "dequantize"}

    @property
    def errors(self) -> list[PlannedTensor]:
        return [e for e in self.entries.values() if e.action == "error"]

    def raise_first_error(self) -> None:
        """Stop the load on the first refused tensor, saying how many more there are."""
        errors = self.errors
        if not errors:
            return
        first = errors[0].error
        assert first is not None
        raise first.also_refused([e.info.name for e in errors[1:]])

    def _classify(self, info: TensorInfo) -> tuple[PlannedTensor, Scheme | None]:
        """keep, pass, error, or the scheme to prepare it with."""
        described = self.checkpoint.type_of(info.name)
        kind = naming.attention_quant_kind(info.name)
        if kind is not None:
            return PlannedTensor(info, described, "pass", _ATTENTION_QUANT_WHY[kind]), None
        companions = self._companions_of(info.name)
        fmt = None
        if info.holds_codes and described in (None, "FLOAT"):
            dtypes = {n: t.dtype for n, t in self.checkpoint.tensors.items()}
            fmt = foreign.tensor_format(info.name, dtypes, self.checkpoint.declared)
            if fmt is not None and library.decodes(fmt.name):
                return self._library(info, described, fmt), None
            if fmt is not None and (
                foreign.has_foreign_parts(fmt, info.name) or info.dtype == torch.uint8
            ):
                return self._foreign(info, described, fmt), None
        if not info.holds_codes:
            why = (
                "float tensor"
                if described in (None, "FLOAT")
                else f"described as {described} but stored as {info.dtype_name}: already float"
            )
            return PlannedTensor(info, described, "keep", why, companions=companions), None
        type_name = infer_type(info, companions) if described in (None, "FLOAT") else described
        entry = PlannedTensor(info, described, "error", "", scheme=type_name, companions=companions)
        entry.format = fmt.name if fmt is not None else None
        try:
            scheme = _scheme_named(info, described, type_name)
            scheme.check_storage(info, companions)
        except DraftWeightError as exc:
            return self._refused(entry, exc), None
        return entry, scheme

    def _prepare(self, pending: list[tuple[PlannedTensor, Scheme]]) -> None:
        """Read every pending weight's companions in one pass per file, build the decoders."""
        wanted = [
            c
            for entry, s in pending
            for suffix, c in entry.companions.items()
            if suffix in s.companions
        ]
        try:
            values = self.checkpoint.read_many(wanted)
        except CheckpointFormatError as exc:
            for entry, _ in pending:
                self._refused(entry, _as_draft_error(entry.info, exc))
            return
        ckpt = self.checkpoint
        for entry, scheme in pending:
            mine = {
                suffix: values[c.name]
                for suffix, c in entry.companions.items()
                if suffix in scheme.companions
            }
            try:
                entry.decoder = scheme.prepare(
                    entry.info, mine, ckpt.group_size, format_version=ckpt.format_version
                )
            except DraftWeightError as exc:
                self._refused(entry, exc)
                continue
            entry.action = "dequantize"
            entry.reason = (
                f"{scheme.name} {entry.info.dtype_name} codes with "
                f"{', '.join(sorted(entry.companions))}"
            )
            if entry.format is not None:
                entry.reason = f"{entry.format}, decoded by the {entry.reason}"

    def _library(
        self, info: TensorInfo, described: str | None, fmt: foreign.TensorFormat
    ) -> PlannedTensor:
        """A weight in a format compressed-tensors decodes (``library.py``)."""
        companions = {p.rpartition(".")[2]: self.checkpoint.tensors[p] for p in fmt.parts}
        entry = PlannedTensor(
            info, described, "error", "", scheme=fmt.name, companions=companions, format=fmt.name
        )
        try:
            entry.decoder = library.library_decoder(info, companions, self.checkpoint, fmt.name)
        except DraftWeightError as exc:
            return self._refused(entry, exc)
        except CheckpointFormatError as exc:
            return self._refused(entry, _as_draft_error(info, exc))
        entry.action = "dequantize"
        read = sorted(n.rpartition(".")[2] for n in entry.decoder.consumed)
        entry.reason = (
            f"{fmt.name} {info.dtype_name} codes with {', '.join(read)}, decoded by "
            f"{library.LIBRARY}"
        )
        return entry

    def _foreign(
        self, info: TensorInfo, described: str | None, fmt: foreign.TensorFormat
    ) -> PlannedTensor:
        """A weight stored in another quantizer's format that no ModelSlim rule reads."""
        companions = {p.rpartition(".")[2]: self.checkpoint.tensors[p] for p in fmt.parts}
        method = self.checkpoint.declared.method if self.checkpoint.declared else None
        served = f" ({'--speculative-draft-model-quantization ' + method})" if method else ""
        entry = PlannedTensor(info, described, "error", "", companions=companions, format=fmt.name)
        error = refused(
            info,
            (
                f"is stored as {fmt.name} ({info.dtype_name}, with "
                f"{', '.join(sorted(companions)) or 'no companion'}), not a ModelSlim export: "
                "this plugin decodes ModelSlim schemes only"
            ),
            (
                f"serve the draft quantized with sglang's own support for it{served}, or export "
                "the MTP layers unquantized"
            ),
        )
        return self._refused(entry, error)

    @staticmethod
    def _refused(entry: PlannedTensor, exc: DraftWeightError) -> PlannedTensor:
        entry.action = "error"
        entry.error = exc
        entry.reason = str(exc)
        return entry

    def _companions_of(self, weight_name: str) -> dict[str, TensorInfo]:
        found = {}
        for suffix, candidates in naming.companion_names(weight_name).items():
            for candidate in candidates:
                info = self.checkpoint.tensors.get(candidate)
                if info is not None:
                    found[suffix] = info
        return found


_ATTENTION_QUANT_WHY = {
    "FA3": (
        "FA3 attention-quantization scale (FAQuant): an input of Ascend's quantized attention "
        "kernel, not a weight; an unquantized draft's attention runs in float and has no "
        "parameter for it. Left to sglang (its loader drops the name)"
    ),
    "C8": (
        "C8 KV-cache quantization scale: for an int8 KV cache, not a weight; left to sglang "
        "(sglang 0.5.23 reads no ModelSlim C8 tensor, its loader drops the name)"
    ),
}


def _is_foreign_companion(name: str) -> bool:
    """``X.weight_shape``, ``X.weight_zero_point``, ...: listed with their weight."""
    return foreign.foreign_base(name) is not None and not name.endswith(".weight_packed")


def _as_draft_error(info: TensorInfo, exc: CheckpointFormatError) -> DraftWeightError:
    return DraftWeightError(tensor=info.name, file=info.file, problem=exc.problem, hint=exc.hint)


def _scheme_named(info: TensorInfo, described: str | None, type_name: str | None) -> Scheme:
    """The scheme that decodes ``info``'s codes, or the error saying why none does."""
    scheme = scheme_for(type_name) if type_name else None
    if scheme is not None:
        return scheme
    if type_name is None:
        problem = (
            f"is {info.dtype_name} (codes), described as {described!r}, and has no scale beside "
            "it that says how to decode it"
        )
        hint = (
            "the checkpoint is incomplete or not a ModelSlim export; re-export it, or serve the "
            "draft quantized (--speculative-draft-model-quantization)"
        )
    else:
        problem = (
            f"is {type_name}, a scheme this plugin does not decode (it decodes "
            f"{', '.join(known_types())})"
        )
        hint = (
            "serve the draft quantized with --speculative-draft-model-quantization modelslim, "
            "or report the scheme to sglang-mtp-dequant"
        )
    raise DraftWeightError(tensor=info.name, file=info.file, problem=problem, hint=hint)
