"""MoE layers a ModelSlim description marks FLOAT: built unquantized, per layer, or refused.

Usage (``plugin.register`` arranges the hook in every sglang process)::

    FLOAT_LAYER_HOOKS                # one AROUND hook on ModelSlimConfig.get_quant_method
    builds_as_the_plugin(config)     # the CLI's and benchmarks' build: the hook's own answers

Why: ``get_moe_scheme`` has no FLOAT scheme, so experts marked FLOAT stop a ModelSlim build
(sglang #34211). As vllm-ascend decides per layer, such a layer gets None (sglang's unquantized
MoE method, the floats loaded as stored); experts part FLOAT are refused naming the layer and the
launch that serves it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..errors import MixedPrecisionLayerError
from ..formats.description import ExpertPrecision, described_as, draft_layers, expert_entries
from . import context, sglang_private

logger = logging.getLogger("sglang_mtp_dequant")

#: the class whose ``get_quant_method`` every layer of a ModelSlim build asks
MODELSLIM_CLASS = "ModelSlimConfig"
GET_QUANT_METHOD_TARGET = (
    f"sglang.srt.layers.quantization.modelslim.modelslim.{MODELSLIM_CLASS}.get_quant_method"
)
#: the launches that build an MTP / NextN draft unquantized (the plugin then dequantizes it)
DRAFT_WAY_OUT = (
    "launch F1 (no quantization flag) or F3 (--speculative-draft-model-quantization unquant): "
    "sglang then builds the draft unquantized and the plugin dequantizes its quantized layers"
)
TARGET_WAY_OUT = (
    "no launch of this sglang builds this layer right: re-export the checkpoint with "
    "msmodelslim giving every expert of the layer one precision (all quantized, or all "
    "excluded from the recipe)"
)


def expert_precision(quant_config: Any, layer: str, num_experts: int) -> ExpertPrecision:
    """What the description says of the experts of ``layer``, under the name it gives it."""
    description = quant_config.quant_description
    named = described_as(description, layer)

    def resolve(prefix: str) -> str:
        return sglang_private.resolve_quant_prefix(quant_config, prefix)

    return ExpertPrecision(named, expert_entries(description, named, num_experts, resolve))


def refusal(precision: ExpertPrecision, is_draft: bool) -> MixedPrecisionLayerError:
    return MixedPrecisionLayerError(
        layer=precision.layer,
        problem=(
            "quant_model_description.json marks some of this MoE layer's expert projections "
            "FLOAT and others quantized; sglang's ModelSlim builds one method for all the "
            "experts of a layer, so either the float or the quantized experts would load wrong"
        ),
        hint=DRAFT_WAY_OUT if is_draft else TARGET_WAY_OUT,
        details=[precision.summary()],
    )


#: layers built unquantized, said once per (layer, sglang process)
_SAID: set[str] = set()


def quant_method(
    original: Callable[..., Any], quant_config: Any, layer: Any, prefix: str, *args: Any, **kw: Any
) -> Any:
    """None (sglang's unquantized MoE method) for a FusedMoE whose experts are all FLOAT,
    ``MixedPrecisionLayerError`` for one part FLOAT, sglang's own answer for any other layer."""
    num_experts = _fused_moe_experts(layer)
    if num_experts is None:
        return original(quant_config, layer, prefix, *args, **kw)
    precision = expert_precision(quant_config, prefix, num_experts)
    if precision.mixed:
        raise refusal(precision, draft_layers(quant_config.quant_description)(prefix))
    if not precision.all_float:
        return original(quant_config, layer, prefix, *args, **kw)
    if prefix not in _SAID:
        _SAID.add(prefix)
        logger.info(
            "sglang-mtp-dequant: quant_model_description.json marks every expert of %s FLOAT "
            "(%d projections); built with sglang's unquantized MoE method and loaded as stored "
            "(sglang %s's ModelSlim has no FLOAT MoE scheme)",
            precision.layer,
            len(precision.schemes),
            context.sglang_version(),
        )
    return None


def float_moe_quant_method(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND ``ModelSlimConfig.get_quant_method``: ``quant_method``, except inside
    ``plugin.bypassed()`` (the CLI's builds as stock sglang builds), where sglang answers."""
    if context.is_bypassed():
        return original(*args, **kwargs)
    return quant_method(original, *args, **kwargs)


def builds_as_the_plugin(quant_config: Any) -> None:
    """``quant_config`` answering every layer as the hook does, registered or not: the
    ``adjust_quant_config`` of the CLI's and the benchmarks' builds as the plugin's."""
    original = sglang_private.unwrapped(type(quant_config).get_quant_method)
    quant_config.get_quant_method = functools.partial(quant_method, original, quant_config)


def _fused_moe_experts(layer: Any) -> int | None:
    """The global expert count of a ``FusedMoE`` layer, None for any other layer."""
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE

    if not isinstance(layer, FusedMoE):
        return None
    return int(getattr(layer, "num_experts", 0) or 0)


#: (target, AROUND hook, class the target's module must define): registered by ``plugin.register``
FLOAT_LAYER_HOOKS: tuple[tuple[str, Callable[..., Any], str], ...] = (
    (GET_QUANT_METHOD_TARGET, float_moe_quant_method, MODELSLIM_CLASS),
)
