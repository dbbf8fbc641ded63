"""The draft classes the plugin hooks, and which checkpoint names belong to each draft.

Usage::

    for spec in DRAFT_SPECS:
        print(spec.target)                      # dotted path of the load_weights to wrap
        is_draft = spec.draft_names(model)       # name -> bool, for this built model
    spec = spec_for_architecture("Qwen3_5ForConditionalGeneration")

One entry per ``load_weights`` that runs, never per class: hooking a subclass that only
inherits the method would run the hook twice, so such subclasses are ``inherited_by``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..formats.config import CheckpointConfig
from ..formats.naming import NameRule, mtp_prefix, nextn_layer, nextn_layer_multimodal

#: what a name rule reads the draft's layout from: a built draft, config.json, or nothing
DraftSource = torch.nn.Module | CheckpointConfig | None
NameRuleFactory = Callable[[DraftSource], NameRule]


@dataclass(frozen=True)
class DraftSpec:
    """One hooked draft class."""

    target: str  # dotted path of the ``load_weights`` that runs for this draft
    architectures: tuple[str, ...]  # config.json architectures whose draft this class is
    name_rule: NameRuleFactory  # ``naming.mtp_prefix``, ``naming.nextn_layer``, ...
    inherited_by: tuple[str, ...] = ()  # draft classes that inherit this ``load_weights``
    #: parameter tokens the draft takes from the target after loading (``set_embed_and_head``)
    from_target: tuple[str, ...] = ("embed_tokens", "lm_head")
    loads_besides: tuple[str, ...] = ()  # names its ``load_weights`` reads besides the rule's

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 2)[-2]

    @property
    def hook_name(self) -> str:
        """The ``__qualname__`` of the plugin's hook on this ``load_weights`` (``ray_setup``)."""
        return f"sglang_mtp_dequant[{self.class_name}]"

    def draft_names(self, model_or_config: DraftSource) -> NameRule:
        return self.name_rule(model_or_config)

    def kept_names(self, model_or_config: DraftSource) -> NameRule:
        """Every checkpoint name the class's ``load_weights`` keeps: what the narrowing keeps."""
        rule, besides = self.name_rule(model_or_config), frozenset(self.loads_besides)
        return lambda name: rule(name) or name in besides


_MODELS = "sglang.srt.models"

DRAFT_SPECS: tuple[DraftSpec, ...] = (
    DraftSpec(
        target=f"{_MODELS}.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights",
        architectures=(
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
            "Qwen4ExpForConditionalGeneration",
        ),
        name_rule=mtp_prefix,
        # the target's embedding, into the draft's own copy (kept by a last-stage draft under PP)
        loads_besides=("model.embed_tokens.weight", "model.language_model.embed_tokens.weight"),
        inherited_by=(f"{_MODELS}.qwen4_exp_mtp.Qwen4ExpForCausalLMMTP",),
    ),
    DraftSpec(
        # its load_weights calls the target's (is_mtp=True): only the MTP subclass is hooked
        target=f"{_MODELS}.qwen3_next_mtp.Qwen3NextForCausalLMMTP.load_weights",
        architectures=("Qwen3NextForCausalLM",),
        name_rule=mtp_prefix,
    ),
    DraftSpec(
        target=f"{_MODELS}.qwen3_moe_mtp.Qwen3MoeForCausalLMMTP.load_weights",
        architectures=("Qwen3MoeForCausalLM",),
        name_rule=mtp_prefix,
    ),
    DraftSpec(
        target=f"{_MODELS}.glm4_moe_nextn.Glm4MoeForCausalLMNextN.load_weights",
        architectures=("Glm4MoeForCausalLM",),
        name_rule=nextn_layer,
    ),
    DraftSpec(
        target=f"{_MODELS}.glm4_moe_lite_nextn.Glm4MoeLiteForCausalLMNextN.load_weights",
        architectures=("Glm4MoeLiteForCausalLM",),
        name_rule=nextn_layer,
    ),
    DraftSpec(
        # a DeepseekV3ForCausalLMNextN subclass whose load_weights never calls super()
        target=f"{_MODELS}.glm5_next_nextn.Glm5NextForConditionalGenerationNextN.load_weights",
        architectures=("Glm5NextForConditionalGeneration",),
        name_rule=nextn_layer_multimodal,
    ),
    DraftSpec(
        # GLM-5's GlmMoeDsaForCausalLMNextN ends its load_weights in super()'s: this one
        target=f"{_MODELS}.deepseek_nextn.DeepseekV3ForCausalLMNextN.load_weights",
        architectures=("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
        name_rule=nextn_layer,
    ),
)


def spec_for_architecture(architecture: str | None) -> DraftSpec | None:
    """The hooked draft class for a checkpoint's ``config.json`` architecture, if any."""
    for spec in DRAFT_SPECS:
        if architecture in spec.architectures:
            return spec
    return None


def spec_for_class(cls: type) -> DraftSpec | None:
    """The hooked spec whose ``load_weights`` runs for draft class ``cls`` (its own or a base's)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__}
    for spec in DRAFT_SPECS:
        owner = spec.target.rsplit(".", 1)[0]
        if owner in names or names & set(spec.inherited_by):
            return spec
    return None


def draft_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the draft's float parameters were built in: the most common floating dtype."""
    counts: dict[torch.dtype, int] = {}
    for param in model.parameters():
        if param.is_floating_point():
            counts[param.dtype] = counts.get(param.dtype, 0) + param.numel()
    if not counts:
        return torch.get_default_dtype()
    return max(counts, key=counts.__getitem__)
