"""MoE layers a ModelSlim description marks FLOAT: built unquantized, per layer, or refused.

Usage (``plugin.register`` arranges the hook in every sglang process)::

    FLOAT_LAYER_HOOKS                                   # one AROUND hook on ModelSlimConfig
    plan = moe_layer_plan(description)                  # the doctor's answer, no sglang needed
    plan.built_unquantized, plan.refused, plan.stock, plan.stock_fails

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
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import MixedPrecisionLayerError
from . import context, sglang_private

logger = logging.getLogger("sglang_mtp_dequant")

#: the scheme ``quant_model_description.json`` gives a tensor stored as it is
FLOAT = "FLOAT"
#: the class whose ``get_quant_method`` every layer of a ModelSlim build asks
MODELSLIM_CLASS = "ModelSlimConfig"
GET_QUANT_METHOD_TARGET = (
    f"sglang.srt.layers.quantization.modelslim.modelslim.{MODELSLIM_CLASS}.get_quant_method"
)
#: the expert projection names ``get_moe_scheme`` tries, in its order: (gate, up, down)
NAMING_CONVENTIONS: tuple[tuple[str, str, str], ...] = (
    ("gate_proj", "up_proj", "down_proj"),
    ("w1", "w3", "w2"),
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


@dataclass(frozen=True)
class ExpertPrecision:
    """The description's schemes for one FusedMoE layer's expert projections."""

    layer: str  # the prefix sglang builds the layer with
    #: description entry -> scheme, every expert and projection the description lists
    schemes: Mapping[str, str] = field(default_factory=dict)

    @property
    def float_entries(self) -> list[str]:
        return [name for name, scheme in self.schemes.items() if scheme == FLOAT]

    @property
    def quantized_entries(self) -> list[str]:
        return [name for name, scheme in self.schemes.items() if scheme != FLOAT]

    @property
    def all_float(self) -> bool:
        """Every projection of every expert the description lists is FLOAT (and it lists some)."""
        return bool(self.schemes) and not self.quantized_entries

    @property
    def mixed(self) -> bool:
        return bool(self.float_entries) and bool(self.quantized_entries)

    def summary(self) -> str:
        quantized = sorted(set(self.schemes[n] for n in self.quantized_entries))
        return (
            f"{self.layer}: {len(self.float_entries)} expert projection(s) FLOAT "
            f"(e.g. {self.float_entries[0]}), {len(self.quantized_entries)} "
            f"{'/'.join(quantized)} (e.g. {self.quantized_entries[0]})"
        )


def expert_entries(
    description: Mapping[str, Any],
    layer: str,
    num_experts: int,
    resolve: Callable[[str], str] = lambda prefix: prefix,
) -> dict[str, str]:
    """Description entry -> scheme of every ``layer.<e>.<proj>.weight`` listed, for the first
    naming convention that lists expert 0 (as ``get_moe_scheme`` picks it); ``resolve`` maps a
    module prefix to the one its entry is stored under (sglang's ``_resolve_quant_prefix``)."""
    for names in NAMING_CONVENTIONS:
        found: dict[str, str] = {}
        for expert in range(num_experts):
            for proj in names:
                key = f"{resolve(f'{layer}.{expert}.{proj}')}.weight"
                scheme = description.get(key)
                if isinstance(scheme, str):
                    found[key] = scheme
        if any(key.endswith(f".0.{names[0]}.weight") for key in found):
            return found
    return {}


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


# -- the doctor's view (no sglang) --------------------------------------------------------------


@dataclass(frozen=True)
class MoeLayerPlan:
    """What the plugin does with each FusedMoE layer of a ModelSlim build (F2 / F4)."""

    built_unquantized: tuple[str, ...]  # all experts FLOAT: sglang's unquantized MoE method
    refused: tuple[ExpertPrecision, ...]  # part FLOAT: the start-up stops
    stock: tuple[str, ...]  # left to sglang (quantized, or not described)

    @property
    def stock_fails(self) -> tuple[str, ...]:
        """Layers stock sglang stops at (any FLOAT expert entry reaches ``get_moe_scheme``)."""
        return (*self.built_unquantized, *(p.layer for p in self.refused))


#: a routed expert's projection entry: (layer, expert, projection)
EXPERT_ENTRY = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def moe_layers(description: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(layer, experts)`` of every routed-expert layer the description lists per expert
    (``<layer>.<e>.gate_proj.weight``...), in the description's order; ``experts`` is one more
    than the highest expert index listed."""
    highest: dict[str, int] = {}
    for name in description:
        match = EXPERT_ENTRY.match(name) if isinstance(name, str) else None
        if match:
            layer, expert = match.group(1), int(match.group(2))
            highest[layer] = max(highest.get(layer, -1), expert)
    return [(layer, top + 1) for layer, top in highest.items()]


def moe_layer_plan(
    description: Mapping[str, Any], layers: Iterable[tuple[str, int]] | None = None
) -> MoeLayerPlan:
    """The hook's decision for each ``(prefix, num_experts)`` FusedMoE layer (default: every
    layer ``moe_layers`` finds), from the parsed description alone: what the plugin does when
    sglang builds a model with this description under ``ModelSlimConfig`` (the target in every
    launch form of a ModelSlim folder; the draft too under ``--quantization modelslim`` or
    ``--speculative-draft-model-quantization modelslim``). Prefixes are the checkpoint's;
    sglang's aliases (``language_model.``, ``block_sparse_moe``) are not applied here."""
    if layers is None:
        layers = moe_layers(description)
    unquantized: list[str] = []
    refused: list[ExpertPrecision] = []
    stock: list[str] = []
    for layer, num_experts in layers:
        precision = ExpertPrecision(layer, expert_entries(description, layer, num_experts))
        if precision.mixed:
            refused.append(precision)
        elif precision.all_float:
            unquantized.append(layer)
        else:
            stock.append(layer)
    return MoeLayerPlan(tuple(unquantized), tuple(refused), tuple(stock))


#: (target, AROUND hook, class the target's module must define): registered by ``plugin.register``
FLOAT_LAYER_HOOKS: tuple[tuple[str, Callable[..., Any], str], ...] = (
    (GET_QUANT_METHOD_TARGET, float_moe_quant_method, MODELSLIM_CLASS),
)
