"""MoE layers a ModelSlim description marks FLOAT: built unquantized, per layer, or refused.

Usage (``plugin.register`` arranges the hook in every sglang process)::

    FLOAT_LAYER_HOOKS           # one AROUND hook on ModelSlimConfig
    # the same decision from a description alone: formats/description.py moe_layer_plan

Why: a model built under ``ModelSlimConfig`` (the target; the draft too under
``--quantization modelslim`` or ``--speculative-draft-model-quantization modelslim``) asks
``get_quant_method`` for each ``FusedMoE`` layer, and ``get_moe_scheme`` has no ``FLOAT``
scheme: experts marked FLOAT (the MTP experts of published Qwen3.6-35B-A3B exports) stop the
start-up (``Unsupported ModelSlim MoE schemes ... W13='FLOAT', W2='FLOAT'``, sglang #34211).
As vllm-ascend decides per layer (a FusedMoE whose expert shards are FLOAT gets the unquantized
MoE method, mixed shards raise) and as sglang #34353's reviewers asked (only experts ALL
explicitly FLOAT fall back; missing or unsupported schemes still raise), the hook answers None
for such a layer, so ``FusedMoE`` builds sglang's own ``UnquantizedFusedMoEMethod`` and the
float tensors load as stored. Experts part FLOAT, part quantized: no single method builds them
right, so ``MixedPrecisionLayerError`` names the layer and the launch that serves it. Any other
layer gets sglang's answer untouched, without a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import MixedPrecisionLayerError
from ..formats.description import ExpertPrecision, expert_entries
from . import context, sglang_private

logger = logging.getLogger("sglang_mtp_dequant")

#: the class whose ``get_quant_method`` every layer of a ModelSlim build asks
MODELSLIM_CLASS = "ModelSlimConfig"
GET_QUANT_METHOD_TARGET = (
    f"sglang.srt.layers.quantization.modelslim.modelslim.{MODELSLIM_CLASS}.get_quant_method"
)
#: the launch that builds an MTP draft unquantized (the plugin then dequantizes its codes)
DRAFT_WAY_OUT = (
    "launch with --speculative-draft-model-quantization unquant (or without --quantization, "
    "ModelSlim auto-detected for the target): sglang then builds the draft unquantized and "
    "the plugin dequantizes its quantized experts at load"
)
TARGET_WAY_OUT = (
    "no launch of this sglang builds this layer right: re-export the checkpoint with "
    "msmodelslim giving every expert of the layer one precision (all quantized, or all "
    "excluded from the recipe)"
)


def expert_precision(quant_config: Any, layer: str, num_experts: int) -> ExpertPrecision:
    """What ``quant_config``'s description says of ``layer``'s experts."""
    entries = expert_entries(
        quant_config.quant_description,
        layer,
        num_experts,
        lambda prefix: sglang_private.resolve_quant_prefix(quant_config, prefix),
    )
    return ExpertPrecision(layer, entries)


def is_draft_layer(layer: str) -> bool:
    """A layer of a Qwen-family MTP draft (built under ``mtp.``); NextN drafts are named like
    target layers, so their refusal names both ways out."""
    return layer.startswith("mtp.")


def refusal(precision: ExpertPrecision) -> MixedPrecisionLayerError:
    draft = is_draft_layer(precision.layer)
    hint = (
        DRAFT_WAY_OUT
        if draft
        else f"if this is a draft layer, {DRAFT_WAY_OUT}; if it is the target's, {TARGET_WAY_OUT}"
    )
    return MixedPrecisionLayerError(
        layer=precision.layer,
        problem=(
            "quant_model_description.json marks some of this MoE layer's expert projections "
            "FLOAT and others quantized; sglang's ModelSlim builds one method for all the "
            "experts of a layer, so either the float or the quantized experts would load wrong"
        ),
        hint=hint,
        details=[precision.summary()],
    )


#: layers built unquantized, said once per (layer, sglang process)
_SAID: set[str] = set()


def float_moe_quant_method(
    original: Callable[..., Any],
    quant_config: Any,
    layer: Any,
    prefix: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """AROUND ``ModelSlimConfig.get_quant_method``: None (sglang's unquantized MoE method) for a
    FusedMoE layer whose experts are all FLOAT, ``MixedPrecisionLayerError`` for one part FLOAT,
    sglang's own answer for every other layer, and inside ``plugin.bypassed()`` (the CLI's
    builds as stock sglang builds)."""
    num_experts = None if context.is_bypassed() else _fused_moe_experts(layer)
    if num_experts is None:
        return original(quant_config, layer, prefix, *args, **kwargs)
    precision = expert_precision(quant_config, prefix, num_experts)
    if precision.mixed:
        raise refusal(precision)
    if not precision.all_float:
        return original(quant_config, layer, prefix, *args, **kwargs)
    if prefix not in _SAID:
        _SAID.add(prefix)
        logger.info(
            "sglang-mtp-dequant: quant_model_description.json marks every expert of %s FLOAT "
            "(%d projections); built with sglang's unquantized MoE method and loaded as stored "
            "(sglang %s's ModelSlim has no FLOAT MoE scheme)",
            prefix,
            len(precision.schemes),
            context.sglang_version(),
        )
    return None


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
