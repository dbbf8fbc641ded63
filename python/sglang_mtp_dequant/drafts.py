"""The draft classes the plugin hooks, and which checkpoint names belong to each draft.

Usage::

    for spec in DRAFT_SPECS:
        print(spec.target)                      # dotted path of the load_weights to wrap
        is_draft = spec.draft_names(model)       # name -> bool, for this built model

Every draft that sglang can build unquantized from a quantized checkpoint gets one entry.
The name rule is per architecture because checkpoints differ: Qwen3.5/3.6 keep the MTP
head under ``mtp.``; DeepSeek/GLM NextN checkpoints store it as the layer after the last
decoder layer, ``model.layers.<num_hidden_layers>.``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftSpec:
    """One hooked draft class."""

    #: dotted path of the ``load_weights`` that runs for this draft
    target: str
    #: architectures (``config.json`` ``architectures``) whose draft this class is
    architectures: tuple[str, ...]
    #: builds the name predicate for a built draft model (or its config)
    name_rule: Callable[[object], Callable[[str], bool]]

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 2)[-2]

    def draft_names(self, model_or_config: object) -> Callable[[str], bool]:
        return self.name_rule(model_or_config)


def mtp_prefix(_model: object) -> Callable[[str], bool]:
    """Qwen3.5/3.6/Qwen3-Next style: the draft is every ``mtp.*`` tensor."""
    return lambda name: name.startswith("mtp.")


DRAFT_SPECS: tuple[DraftSpec, ...] = (
    DraftSpec(
        target="sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights",
        architectures=(
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
        ),
        name_rule=mtp_prefix,
    ),
)


def draft_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the draft's float parameters were built in (what its loaders expect).

    The most common floating dtype among the parameters: a few fp32 buffers (norm statistics,
    router gates) must not turn a bf16 draft's weights into fp32.
    """
    counts: dict[torch.dtype, int] = {}
    for param in model.parameters():
        if param.is_floating_point():
            counts[param.dtype] = counts.get(param.dtype, 0) + param.numel()
    if not counts:
        return torch.get_default_dtype()
    return max(counts, key=counts.__getitem__)
