"""The weight-stream transform: sglang's ``(name, tensor)`` stream in, float draft weights out.

Usage::

    stream = DequantizingStream(plan, dtype=torch.bfloat16, is_draft=lambda n: n.startswith("mtp."))
    model_load_weights(stream.apply(weights))   # names unchanged, before sglang's name mapping
    print(stream.stats.dequantized, stream.stats.seconds)

Why a transform of the stream and not a fix-up of parameters afterwards: sglang's loaders
shard, stack (q/k/v into qkv_proj) and scatter experts by name; handing them the right float
tensor under the checkpoint's own name lets every one of those paths (and every TP rank) work
unchanged. One tensor is decoded at a time, as it streams by, so no fp32 copy of more than
one weight block ever exists.

Two rules make it safe to stack with anything else:
- a planned weight that arrives already floating point (an upstream fix, another plugin) is
  passed through untouched: no double dequantization;
- an integer draft weight the plan does not know is refused: it would otherwise be copied
  into a float parameter as raw codes, which is the bug this package exists for.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from .errors import DraftWeightError
from .plan import DequantPlan
from .schemes import fused_bf16

Weights = Iterable[tuple[str, torch.Tensor]]


@dataclass
class StreamStats:
    """What one pass of the stream did, for the INFO line and for tests."""

    dequantized: int = 0
    schemes: Counter[str] = field(default_factory=Counter)
    quantized_bytes: int = 0
    companions_consumed: int = 0
    already_float: int = 0
    seconds: float = 0.0


class DequantizingStream:
    """Dequantizes the planned draft weights of one load and drops their companions."""

    def __init__(
        self,
        plan: DequantPlan | None,
        dtype: torch.dtype,
        is_draft: Callable[[str], bool],
        missing_plan_hint: str = "",
    ) -> None:
        self.plan = plan
        self.dtype = dtype
        self.is_draft = is_draft
        self.missing_plan_hint = missing_plan_hint
        self.stats = StreamStats()
        #: draft checkpoint name -> dtype it streamed as (read by guard.py after the load)
        self.streamed: dict[str, torch.dtype] = {}

    def apply(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        entries = self.plan.to_dequantize if self.plan is not None else {}
        consumed = self.plan.consumed if self.plan is not None else set()
        if entries and self.dtype == torch.bfloat16:
            fused_bf16.warm_up()  # a no-op when the target load already started it
        for name, tensor in weights:
            self._note_streamed(name, tensor)
            entry = entries.get(name)
            if entry is not None:
                if tensor.is_floating_point():
                    self.stats.already_float += 1
                    yield name, tensor
                    continue
                started = time.perf_counter()
                self._check_matches_header(name, tensor)
                decoded = entry.decoder.decompress(tensor, self.dtype)
                self.stats.seconds += time.perf_counter() - started
                self.stats.dequantized += 1
                self.stats.schemes[entry.scheme or "?"] += 1
                self.stats.quantized_bytes += tensor.numel() * tensor.element_size()
                yield name, decoded
                del decoded  # the loader has copied it: do not keep it alive until the next one
            elif name in consumed:
                self.stats.companions_consumed += 1
            else:
                if self._is_unplanned_code(name, tensor):
                    raise DraftWeightError(
                        tensor=name,
                        file=None,
                        problem=(
                            f"streamed as {str(tensor.dtype).replace('torch.', '')} integer "
                            "codes into an unquantized draft, and the plugin has no scale for it"
                        ),
                        hint=self.missing_plan_hint
                        or "serve the draft quantized, or load it from a local checkpoint folder",
                    )
                yield name, tensor

    def _note_streamed(self, name: str, tensor: torch.Tensor) -> None:
        """Remember each draft name and its on-disk dtype: the misload guard (``guard.py``)
        names the checkpoint tensors behind a suspect parameter from this record."""
        if self.is_draft(name):
            self.streamed[name] = tensor.dtype

    def _check_matches_header(self, name: str, tensor: torch.Tensor) -> None:
        info = self.plan.entries[name].info
        if tensor.dtype != info.dtype or tuple(tensor.shape) != info.shape:
            raise DraftWeightError(
                tensor=name,
                file=info.file,
                problem=(
                    f"streamed as {tensor.dtype}{list(tensor.shape)}, but the header said "
                    f"{info.dtype_name}{list(info.shape)}"
                ),
                hint="the checkpoint changed during loading, or two files hold this name",
            )

    def _is_unplanned_code(self, name: str, tensor: torch.Tensor) -> bool:
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            return False
        if not self.is_draft(name):
            return False
        # integer companions (quant_bias, int64 deq_scale, ...) of float weights are left to
        # sglang as stock would; a weight itself must never arrive as codes
        return name.endswith("weight") or name.endswith("_proj")
