"""The weight-stream transform: sglang's ``(name, tensor)`` stream in, float draft weights out.

Usage::

    stream = DequantizingStream(planner, torch.bfloat16, is_draft, owned=owned,
                                observer=writes.on_streamed)
    model_load_weights(stream.apply(weights))   # names unchanged, before sglang's name mapping
    print(stream.stats.dequantized, stream.stats.seconds)

Why the stream and not a fix-up of parameters afterwards: sglang's loaders shard, stack and
scatter by name, so a float tensor under the checkpoint's own name works on every path and rank.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ..errors import DraftWeightError
from ..formats import naming
from ..formats.checkpoint import dtype_name, is_code_dtype
from ..formats.plan import DequantPlan, PlannedTensor
from .ownership import ExpertOwnership

Weights = Iterable[tuple[str, torch.Tensor]]


@dataclass
class StreamStats:
    """What one pass of the stream did, for the INFO line, the benchmarks and tests."""

    dequantized: int = 0
    schemes: Counter[str] = field(default_factory=Counter)
    quantized_bytes: int = 0
    decoded_codes: int = 0  # codes turned into weights (experts of other ranks excluded)
    left_to_other_ranks: int = 0  # expert tensors passed on undecoded (sglang drops them)
    companions_consumed: int = 0
    already_float: int = 0
    seconds: float = 0.0


class DequantizingStream:
    """Dequantizes the planned draft weights of one load and drops their companions; planned on
    the first tensor (sglang resolves its files then). A planned weight already float, or an
    expert this rank drops, passes untouched; a code weight the plan does not know is refused."""

    def __init__(
        self,
        planner: Callable[[], DequantPlan | None],
        dtype: torch.dtype,
        is_draft: Callable[[str], bool],
        owned: ExpertOwnership | None = None,
        missing_plan_hint: str = "",
        observer: Callable[[str, torch.Tensor], None] | None = None,
        refuse_raw_codes: bool = True,
    ) -> None:
        self.planner = planner
        self.plan: DequantPlan | None = None
        self.dtype = dtype
        self.is_draft = is_draft
        self.owned = owned
        self.missing_plan_hint = missing_plan_hint
        self.stats = StreamStats()
        self.streamed: dict[str, torch.dtype] = {}  # draft name -> the dtype it streamed as
        self.observer = observer  # told of each draft tensor handed on (the completeness audit)
        #: off for a draft built quantized, whose quantized layers consume codes
        self.refuse_raw_codes = refuse_raw_codes

    def apply(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        iterator = iter(weights)
        first = next(iterator, None)  # sglang resolves its weight files on this first pull
        if first is None:
            return
        self.plan = self.planner()
        entries = self.plan.to_dequantize if self.plan is not None else {}
        consumed = self.plan.consumed if self.plan is not None else set()
        for name, tensor in itertools.chain((first,), iterator):
            draft = self.is_draft(name)
            if draft:
                self.streamed[name] = tensor.dtype
            entry = entries.get(name)
            if entry is not None:
                decoded = self._decode(name, tensor, entry)
                if decoded is not tensor and entry.output_name != name:
                    yield self._hand_on(name, decoded, draft, as_name=entry.output_name)
                else:
                    yield self._hand_on(name, decoded, draft)
            elif name in consumed:
                self.stats.companions_consumed += 1
            else:
                if draft and self.refuse_raw_codes and _is_code_weight(name, tensor):
                    raise DraftWeightError(
                        tensor=name,
                        file=None,
                        problem=(
                            f"streamed as {dtype_name(tensor.dtype)} codes into "
                            "an unquantized draft, and the plugin has no scale for it"
                        ),
                        hint=self.missing_plan_hint
                        or "serve the draft quantized, or load it from a local checkpoint folder",
                    )
                yield self._hand_on(name, tensor, draft)

    def _hand_on(
        self, name: str, tensor: torch.Tensor, draft: bool, as_name: str | None = None
    ) -> tuple[str, torch.Tensor]:
        """``(as_name or name, tensor)`` for sglang; the observer is told the stored name."""
        if draft and self.observer is not None:
            self.observer(name, tensor)
        return as_name or name, tensor

    def _decode(self, name: str, tensor: torch.Tensor, entry: PlannedTensor) -> torch.Tensor:
        if not is_code_dtype(tensor.dtype):
            self.stats.already_float += 1
            return tensor
        info = entry.info
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
        decoder = entry.decoder
        assert decoder is not None
        only = None
        if self.owned is not None:
            if not self.owned.keeps(name):
                self.stats.left_to_other_ranks += 1
                return tensor
            if naming.is_fused_experts(name) and len(decoder.shape) >= 3:
                only = self.owned.kept_experts(name, decoder.shape[0])
        started = time.perf_counter()
        decoded = decoder.decompress(tensor, self.dtype, only=only)
        self.stats.seconds += time.perf_counter() - started
        self.stats.dequantized += 1
        self.stats.schemes[entry.scheme or "?"] += 1
        self.stats.quantized_bytes += tensor.numel() * tensor.element_size()
        total = decoded.numel()
        self.stats.decoded_codes += total if only is None else total // decoded.shape[0] * len(only)
        return decoded


def _is_code_weight(name: str, tensor: torch.Tensor) -> bool:
    """A weight (not a companion: those are left to sglang) streaming as codes."""
    return is_code_dtype(tensor.dtype) and (name.endswith("weight") or naming.is_bare_proj(name))
