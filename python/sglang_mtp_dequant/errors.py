"""The package's errors: one hierarchy, one way to say what is wrong and what to do.

Usage::

    raise DraftWeightError(
        tensor="mtp.layers.0.mlp.up_proj.weight",
        file="/ckpt/quant_model_weights-00001-of-00002.safetensors",
        problem="int8 weight has no weight_scale",
        hint="re-export the checkpoint with msmodelslim, or serve the draft quantized",
    )
    # sglang-mtp-dequant: draft tensor 'mtp.layers.0.mlp.up_proj.weight' in /ckpt/...:
    #   int8 weight has no weight_scale. What to do: re-export the checkpoint ...

Why fields: an exception raised in ``load_weights`` stops sglang's server with its message in
the log, all an operator gets; ``explain`` renders subject, problem, details and what to do in
one place, so no raise site leaves the "What to do" out.
"""

from __future__ import annotations

from collections.abc import Sequence

PREFIX = "sglang-mtp-dequant"


def what_to_do(subject: str | None, problem: str, hint: str, details: Sequence[str] = ()) -> str:
    """``<subject>: <problem>. What to do: <hint>``, detail lines between problem and hint."""
    head = f"{subject}: {problem}" if subject else problem
    if details:
        return f"{head}:\n" + "\n".join(details) + f"\nWhat to do: {hint}"
    return f"{head}. What to do: {hint}"


def explain(subject: str | None, problem: str, hint: str, details: Sequence[str] = ()) -> str:
    """``what_to_do`` under the package's name: how every error of the package reads."""
    return f"{PREFIX}: {what_to_do(subject, problem, hint, details)}"


class MtpDequantError(Exception):
    """Base of every error the package raises."""

    def __init__(
        self, *, subject: str | None, problem: str, hint: str, details: Sequence[str] = ()
    ) -> None:
        self.subject = subject
        self.problem = problem
        self.hint = hint
        self.details = tuple(details)
        super().__init__(explain(subject, problem, hint, self.details))


class DraftWeightError(MtpDequantError, ValueError):
    """A quantized draft weight that cannot be turned into correct float weights."""

    def __init__(
        self,
        *,
        tensor: str,
        file: str | None,
        problem: str,
        hint: str,
        details: Sequence[str] = (),
        subject: str | None = None,
    ) -> None:
        self.tensor = tensor
        self.file = file
        where = f" in {file}" if file else ""
        if subject is None:
            subject = f"draft tensor {tensor!r}{where}"
        super().__init__(subject=subject, problem=problem, hint=hint, details=details)

    def also_refused(self, others: Sequence[str]) -> DraftWeightError:
        """The same error, saying which other tensors the same load refuses (first 3 named)."""
        if not others:
            return self
        shown = ", ".join(others[:3])
        more = "" if len(others) <= 3 else f" and {len(others) - 3} more"
        return DraftWeightError(
            tensor=self.tensor,
            file=self.file,
            problem=f"{self.problem} (also refused: {shown}{more})",
            hint=self.hint,
            details=self.details,
            subject=self.subject,
        )


class CheckpointFormatError(MtpDequantError, ValueError):
    """A checkpoint file (index, description, safetensors header) that cannot be read as claimed."""

    def __init__(self, *, file: str, problem: str, hint: str) -> None:
        self.file = file
        super().__init__(subject=file, problem=problem, hint=hint)


class SettingError(MtpDequantError, ValueError):
    """An environment setting of the plugin's with a value it does not know."""

    def __init__(self, *, setting: str, problem: str, hint: str) -> None:
        self.setting = setting  # the problem names it with its value
        super().__init__(subject=None, problem=problem, hint=hint)


class UnservedLayerError(MtpDequantError, ValueError):
    """Linear layers sglang built unquantized over quantized codes, raised at model build time."""

    def __init__(self, *, role: str, problem: str, hint: str, details: Sequence[str] = ()) -> None:
        self.role = role  # "target Qwen3_5ForCausalLM", "draft Qwen3_5ForCausalLMMTP"
        super().__init__(subject=role, problem=problem, hint=hint, details=details)


class MixedPrecisionLayerError(MtpDequantError, ValueError):
    """A ModelSlim MoE layer whose experts are part FLOAT, part quantized, raised at build."""

    def __init__(self, *, layer: str, problem: str, hint: str, details: Sequence[str] = ()) -> None:
        self.layer = layer  # the prefix sglang builds it with: "mtp.layers.0.mlp.experts"
        super().__init__(subject=f"MoE layer {layer}", problem=problem, hint=hint, details=details)
