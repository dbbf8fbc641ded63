"""The one exception type the plugin raises for bad draft weights.

Why a dedicated type: sglang's start-up catches nothing around ``load_weights``, so an
exception raised there stops the server with its message in the log. That message is all an
operator gets, so it must name the tensor, the file, what was found and what to do; the
fields here force every raise site to supply them.
"""

from __future__ import annotations


class DraftWeightError(ValueError):
    """A quantized draft weight that cannot be turned into correct float weights.

    Example::

        raise DraftWeightError(
            tensor="mtp.layers.0.mlp.up_proj.weight",
            file="/ckpt/quant_model_weights-00001-of-00002.safetensors",
            problem="int8 weight has no weight_scale",
            hint="re-export the checkpoint with msmodelslim, or serve the draft quantized",
        )
    """

    def __init__(self, *, tensor: str, file: str | None, problem: str, hint: str) -> None:
        self.tensor = tensor
        self.file = file
        self.problem = problem
        self.hint = hint
        where = f" in {file}" if file else ""
        super().__init__(
            f"sglang-mtp-dequant: draft tensor {tensor!r}{where}: {problem}. What to do: {hint}"
        )


class CheckpointFormatError(ValueError):
    """A checkpoint file (index, description, safetensors header) that cannot be read as claimed."""

    def __init__(self, *, file: str, problem: str, hint: str) -> None:
        self.file = file
        self.problem = problem
        self.hint = hint
        super().__init__(f"sglang-mtp-dequant: {file}: {problem}. What to do: {hint}")
