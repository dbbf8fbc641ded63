"""The draft's vocab-sized layers: never allocated where sglang binds the target's into them.

Usage (``plugin.register`` arranges the hooks in every sglang process)::

    VOCAB_HOOKS                   # AROUND each draft class's __init__ and the vocab weights' build
    held_back(model)              # bytes of the draft's embed_tokens / lm_head left unallocated

Why: an MTP/NextN draft builds its own vocab-sized ``embed_tokens`` and ``lm_head``, and sglang's
EAGLE worker swaps both for the target's only after the KV pool was sized from free memory, so
their bytes never reach the KV cache (sglang #32468, #35996, #37155, #38147). Made on the meta
device instead, they hold no storage, and ``set_embed_and_head`` binds the target's as in stock
(docs/design.md, "The draft's vocabulary", lists what is left as sglang builds it).
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import context, sglang_private
from .drafts import DRAFT_SPECS, DraftSpec
from .settings import SHARE_VOCAB_ENV, env_choice

logger = logging.getLogger("sglang_mtp_dequant")

#: the vocab layers (and the quant method, device each was built with) of the draft being built
_BUILDING: contextvars.ContextVar[list[tuple[Any, Any, torch.device]] | None] = (
    contextvars.ContextVar("mtp_dequant_draft_vocab", default=None)
)
#: the parameters left on the meta device, by ``id``: what ``held_back`` counts
_HELD: weakref.WeakValueDictionary[int, torch.nn.Parameter] = weakref.WeakValueDictionary()


def launch_shares_vocab() -> bool:
    """Whether the draft worker will bind the target's embedding and head into this draft: an
    EAGLE (NEXTN) launch without pipeline parallelism, the switch on, not bypassed."""
    if context.is_bypassed() or env_choice(SHARE_VOCAB_ENV, "on", ("on", "off")) == "off":
        return False
    args = sglang_private.published_server_args()
    algorithm = str(getattr(args, "speculative_algorithm", None)).upper()
    return algorithm in ("EAGLE", "NEXTN") and getattr(args, "pp_size", 1) == 1


def build_vocab_weights(original: Callable[..., Any], method: Any, layer: Any, *args: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
    """AROUND ``UnquantizedEmbeddingMethod.create_weights``: on the meta device while a hooked
    draft class is built (the layer is judged when the class is done), else sglang's own."""
    building = _BUILDING.get()
    if building is None:
        return original(method, layer, *args, **kwargs)
    building.append((layer, method, torch.get_default_device()))
    with torch.device("meta"):
        return original(method, layer, *args, **kwargs)


def make_build_hook(spec: DraftSpec) -> Callable[..., Any]:
    """The AROUND hook on a draft class's ``__init__``: vocab weights on the meta device when
    the launch shares them; those not taken from the target, or whose method sglang swapped,
    then allocated as sglang would."""

    def build_draft(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
        if _BUILDING.get() is not None or not launch_shares_vocab():
            return original(model, *args, **kwargs)  # a nested __init__, or sglang's own build
        built: list[tuple[Any, Any, torch.device]] = []
        token = _BUILDING.set(built)
        try:
            result = original(model, *args, **kwargs)
        finally:
            _BUILDING.reset(token)
        names = {id(module): name for name, module in model.named_modules()}
        shared = []
        for layer, method, device in built:
            name = names.get(id(layer), "")
            if layer.quant_method is method and set(name.split(".")) & set(spec.from_target):
                shared.append(name)
                _HELD.update((id(p), p) for p in layer.parameters(recurse=False))
            else:
                _allocate(layer, device)
        if shared:
            logger.info(
                "sglang-mtp-dequant: the %s draft takes %s from the target: %s bytes on this "
                "rank never allocated before the KV pool is sized (%s=off allocates them)",
                type(model).__name__, ", ".join(shared), f"{held_back(model):,}", SHARE_VOCAB_ENV,
            )  # fmt: skip
        return result

    build_draft.__qualname__ = f"sglang_mtp_dequant_vocab[{spec.class_name}]"
    return build_draft


def _allocate(layer: torch.nn.Module, device: torch.device) -> None:
    """``layer``'s meta parameters allocated on ``device``, their attributes kept."""
    for name, param in list(layer.named_parameters(recurse=False)):
        allocated = torch.nn.Parameter(torch.empty_like(param, device=device), param.requires_grad)
        allocated.__dict__.update(param.__dict__)
        setattr(layer, name, allocated)


def held_back(model: torch.nn.Module) -> int:
    """The bytes of ``model``'s parameters still left on the meta device by this module."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if _HELD.get(id(p)) is p)


#: every class whose ``__init__`` builds a hooked draft (nested hooks pass)
_CLASSES = {s.target.rsplit(".", 1)[0]: s for s in DRAFT_SPECS} | {
    path: s for s in DRAFT_SPECS for path in s.inherited_by
}
#: (target, AROUND hook, class the target's module must define): registered by ``plugin.register``
VOCAB_HOOKS: tuple[tuple[str, Callable[..., Any], str | None], ...] = (
    *((f"{p}.__init__", make_build_hook(s), p.rsplit(".", 1)[1]) for p, s in _CLASSES.items()),
    (sglang_private.VOCAB_WEIGHTS_TARGET, build_vocab_weights, None),
)
