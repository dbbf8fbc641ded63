"""What to do with each draft tensor of a checkpoint: dequantize, keep, or refuse.

Usage::

    ckpt = Checkpoint.open(folder, wanted=lambda n: n.startswith("mtp."))
    plan = DequantPlan.build(ckpt)
    plan.raise_first_error()            # the hook does this; `doctor` lists instead
    plan.entries["mtp.layers.0.mlp.up_proj.weight"].decoder.decompress(q, torch.bfloat16)

The plan is built from headers and the small companion tensors only, before sglang streams
any weight, so a bad checkpoint stops the load before a single parameter is written and the
doctor can show the same verdicts without building a model. Weight and scale may sit in
different shards in any order: the plan knows both locations up front.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from .checkpoint import Checkpoint, TensorInfo
from .errors import CheckpointFormatError, DraftWeightError
from .schemes import AffineDecoder, infer_type, known_types, scheme_for

# Tensors that travel beside a quantized ``X.weight`` as ``X.<suffix>``. They belong to the
# quantized GEMM; once the weight is dequantized they have nothing to load into, so they are
# consumed (stock sglang would log "not found" for some of them, or assert on others).
COMPANION_SUFFIXES = (
    "weight_scale",
    "weight_offset",
    "deq_scale",
    "input_scale",
    "input_offset",
    "quant_bias",
    "scale_bias",
    "weight_scale_second",
    "weight_offset_second",
)

Action = Literal["dequantize", "keep", "error"]


@dataclass
class PlannedTensor:
    """One draft tensor and the plugin's decision about it."""

    info: TensorInfo
    description_type: str | None
    action: Action
    reason: str
    scheme: str | None = None
    companions: dict[str, TensorInfo] = field(default_factory=dict)
    decoder: AffineDecoder | None = None
    error: DraftWeightError | None = None


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
        companion_names = {
            name
            for name in checkpoint.tensors
            if _split_companion(name) is not None or _fused_companion_base(name, checkpoint)
        }
        for name, info in sorted(checkpoint.tensors.items()):
            if name in companion_names:
                continue
            plan.entries[name] = plan._decide(info)
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

    def scheme_counts(self) -> Counter[str]:
        return Counter(e.scheme for e in self.to_dequantize.values() if e.scheme)

    def raise_first_error(self) -> None:
        """Stop the load on the first refused tensor, saying how many more there are."""
        errors = self.errors
        if not errors:
            return
        first = errors[0].error
        assert first is not None
        if len(errors) > 1:
            others = ", ".join(e.info.name for e in errors[1:4])
            more = "" if len(errors) <= 4 else f" and {len(errors) - 4} more"
            first.args = (f"{first.args[0]} (also refused: {others}{more})",)
        raise first

    # -- one decision -------------------------------------------------------------------

    def _decide(self, info: TensorInfo) -> PlannedTensor:
        ckpt = self.checkpoint
        described = ckpt.type_of(info.name)
        companions = self._companions_of(info.name)
        if not info.is_integer:
            why = (
                "float tensor"
                if described in (None, "FLOAT")
                else (f"described as {described} but stored as {info.dtype_name}: already float")
            )
            return PlannedTensor(info, described, "keep", why, companions=companions)
        type_name = described if described not in (None, "FLOAT") else infer_type(set(companions))
        entry = PlannedTensor(info, described, "error", "", scheme=type_name, companions=companions)
        scheme = scheme_for(type_name) if type_name else None
        try:
            if type_name is None:
                raise DraftWeightError(
                    tensor=info.name,
                    file=info.file,
                    problem=(
                        f"is {info.dtype_name} (integer codes), described as {described!r}, "
                        "and has no weight_scale or deq_scale beside it"
                    ),
                    hint=(
                        "the checkpoint is incomplete or not a ModelSlim export; re-export "
                        "it, or serve the draft quantized (--speculative-draft-model-"
                        "quantization)"
                    ),
                )
            if scheme is None:
                raise DraftWeightError(
                    tensor=info.name,
                    file=info.file,
                    problem=(
                        f"is {type_name}, a scheme this plugin does not decode "
                        f"(it decodes {', '.join(known_types())})"
                    ),
                    hint=(
                        "serve the draft quantized with --speculative-draft-model-quantization "
                        "modelslim, or report the scheme to sglang-mtp-dequant"
                    ),
                )
            values = {
                suffix: ckpt.read(c) for suffix, c in companions.items() if suffix in scheme.reads
            }
            entry.decoder = scheme.prepare(
                info, values, ckpt.group_size, format_version=ckpt.format_version
            )
        except (DraftWeightError, CheckpointFormatError) as exc:
            if isinstance(exc, CheckpointFormatError):
                exc = DraftWeightError(
                    tensor=info.name, file=info.file, problem=exc.problem, hint=exc.hint
                )
            entry.error = exc
            entry.reason = str(exc)
            return entry
        entry.action = "dequantize"
        entry.reason = f"{type_name} {info.dtype_name} codes with {', '.join(sorted(companions))}"
        return entry

    def _companions_of(self, weight_name: str) -> dict[str, TensorInfo]:
        if weight_name.endswith(".weight"):
            patterns = (f"{weight_name[: -len('.weight')]}.{{}}",)
        elif _is_fused_expert_name(weight_name):
            patterns = (f"{weight_name}.{{}}", f"{weight_name}_{{}}")
        else:
            return {}
        found = {}
        for suffix in COMPANION_SUFFIXES:
            for pattern in patterns:
                info = self.checkpoint.tensors.get(pattern.format(suffix))
                if info is not None:
                    found[suffix] = info
        return found


def _split_companion(name: str) -> tuple[str, str] | None:
    base, _, suffix = name.rpartition(".")
    return (base, suffix) if base and suffix in COMPANION_SUFFIXES else None


def _is_fused_expert_name(name: str) -> bool:
    """A weight stored without ``.weight``: Qwen3.5/3.6 fused experts ``experts.gate_up_proj``
    [E, 2I, H] and ``experts.down_proj`` [E, H, I] (any ``*_proj`` last component)."""
    return name.rpartition(".")[2].endswith("_proj")


def _fused_companion_base(name: str, checkpoint: Checkpoint) -> bool:
    """``<fused weight>_<suffix>`` (``experts.gate_up_proj_weight_scale``): a companion only
    when that fused weight is in the checkpoint, so no other name is ever swallowed."""
    for suffix in COMPANION_SUFFIXES:
        base = name[: -len(suffix) - 1]
        if name.endswith(f"_{suffix}") and _is_fused_expert_name(base):
            if base in checkpoint.tensors:
                return True
    return False
