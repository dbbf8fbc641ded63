"""A model's linear layers sglang built unquantized over ModelSlim codes, decoded as they stream.

Usage (``target_layers.checked_model`` arranges it for the model sglang just built)::

    decode_as_streamed(model, layers, model_config, load_config)
    model.load_weights(weights)   # the layers' codes arrive decoded, their companions dropped

Why: such a layer copies its int8 or float8 codes into a float weight and drops the scale. The
cure is the draft's plan and stream transform, restricted to those layers' shards, around this
one instance's ``load_weights``: no class or other model is touched, so a checkpoint with no
such layer loads exactly as stock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from ..formats.checkpoint import Checkpoint, dtype_name
from ..formats.plan import DequantPlan
from . import context, sources
from .stream import DequantizingStream

logger = logging.getLogger("sglang_mtp_dequant")


class StreamedLayers:
    """The decode of one model's unserved layers, for every load of it."""

    def __init__(self, model: Any, layers: Sequence[Any], model_config: Any, load_config: Any):
        self.class_name = type(model).__name__
        self.path = str(model_config.model_path)
        self.revision = getattr(model_config, "revision", None)
        self.download_dir = getattr(load_config, "download_dir", None)
        self.layers = list(layers)
        #: the checkpoint prefixes of their quantized shards: what the plan decides for
        self.prefixes = frozenset(s.name for layer in layers for s in layer.quantized)
        #: the dtype sglang built the layers' float weights in (what the decode is rounded to)
        self.dtype: torch.dtype = model.get_submodule(self.layers[0].module).weight.dtype
        self.stream: DequantizingStream | None = None

    def wanted(self, name: str) -> bool:
        return name.rpartition(".")[0] in self.prefixes

    def plan(self) -> DequantPlan:
        source = context.resolution_of(self.path) or sources.resolve_offline(
            self.path, download_dir=self.download_dir, revision=self.revision
        )
        plan = DequantPlan.build(Checkpoint.open(source, wanted=self.wanted))
        plan.raise_first_error()
        return plan

    def apply(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """sglang's stream with the layers' quantized shards decoded, their companions dropped."""
        self.stream = DequantizingStream(self.plan, self.dtype, self.wanted)
        yield from self.stream.apply(weights)
        stats = self.stream.stats
        if stats.dequantized:
            logger.info(
                "sglang-mtp-dequant: %s from %s: sglang built %d linear layer(s) with the "
                "unquantized method over ModelSlim codes (%s); dequantized %d tensors (%s) to "
                "%s as they streamed, %d companion tensors consumed, %.3f s decoding",
                self.class_name,
                self.path,
                len(self.layers),
                ", ".join(layer.layer for layer in self.layers[:3])
                + (f", ... ({len(self.layers) - 3} more)" if len(self.layers) > 3 else ""),
                stats.dequantized,
                ", ".join(f"{k} x{v}" for k, v in sorted(stats.schemes.items())),
                dtype_name(self.dtype),
                stats.companions_consumed,
                stats.seconds,
            )


def decode_as_streamed(
    model: Any, layers: Sequence[Any], model_config: Any, load_config: Any
) -> StreamedLayers:
    """Make ``model.load_weights`` decode the quantized shards of ``layers`` as they stream,
    outside ``plugin.bypassed()``. Returns the decode; its ``stream`` is the newest load's."""
    decode = StreamedLayers(model, layers, model_config, load_config)
    original = model.load_weights

    def load_weights(weights: Iterable[tuple[str, torch.Tensor]], *args: Any, **kwargs: Any) -> Any:
        if context.is_bypassed():
            return original(weights, *args, **kwargs)
        return original(decode.apply(weights), *args, **kwargs)

    model.load_weights = load_weights
    model.mtp_dequant_streamed_layers = decode
    return decode
