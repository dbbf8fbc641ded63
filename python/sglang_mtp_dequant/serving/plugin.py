"""The one place that hooks sglang: the entry point and the wrapper around draft loading.

Usage (what ``pip install`` arranges; nothing to call by hand)::

    # pyproject.toml
    [project.entry-points."sglang.srt.plugins"]
    mtp_dequant = "sglang_mtp_dequant.serving.plugin:register"

    # every sglang process: sglang.srt.plugins.load_plugins() -> register() -> apply_hooks()

``register`` hooks each draft class's ``load_weights`` (``drafts.py``), sglang's loader
(``load.py``), its quant config and model build (``target_layers.py``), ModelSlim's
``get_quant_method`` (``float_layers.py``), the draft vocab (``draft_vocab.py``) and the Ray
launch (``ray_setup.py``); docs/design.md says what each does.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import context, draft_vocab, float_layers, releases, target_layers
from .drafts import DRAFT_SPECS, DraftSpec
from .load import LOADER_HOOKS, DraftLoad
from .ray_setup import register_launch_guard

if TYPE_CHECKING:  # Concatenate[..., ...] is Python 3.11's
    from typing import Concatenate

    import torch

    from .load import AroundHook
    from .stream import Weights

    #: a draft class's ``load_weights``, unbound: ``(model, weights, *args, **kwargs)``
    LoadWeights = Callable[Concatenate[torch.nn.Module, Weights, ...], Any]
    #: the AROUND hook on it: ``(original load_weights, model, weights, *args, **kwargs)``
    LoadWeightsHook = Callable[Concatenate[LoadWeights, torch.nn.Module, Weights, ...], Any]

logger = logging.getLogger("sglang_mtp_dequant")


def register(specs: tuple[DraftSpec, ...] = DRAFT_SPECS) -> None:
    """Entry point for sglang's general-plugin group: hook every draft class we know.

    The Ray launch check is armed here because sglang's Ray actors never load plugins
    themselves. sglang's plugin loader only logs exceptions, so an unresolvable hook target is
    reported here with a WARNING (``unresolvable``); outside the supported releases nothing is
    registered, and a draft family whose module this sglang lacks is skipped quietly.
    """
    support = releases.installed()
    if not support.supported:
        logger.warning("%s", support.out_of_range())
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks: list[tuple[str, AroundHook, str | None, str]] = [
        (
            spec.target,
            make_load_weights_hook(spec),
            spec.class_name,
            f"{spec.class_name} drafts load WITHOUT dequantization in this process",
        )
        for spec in specs
    ]
    hooks += [
        (
            target,
            hook,
            None,
            "the plugin plans from the launch path instead of sglang's resolved files",
        )
        for target, hook in LOADER_HOOKS
    ]
    hooks += [
        (
            target,
            hook,
            None,
            "target layers sglang builds unquantized over quantized codes are "
            "neither supplied nor refused in this process",
        )
        for target, hook in target_layers.TARGET_HOOKS
    ]
    hooks += [
        (
            target,
            hook,
            class_name,
            "MoE layers a ModelSlim description marks FLOAT stop sglang's start-up (or, part "
            "FLOAT, are not refused) in this process",
        )
        for target, hook, class_name in float_layers.FLOAT_LAYER_HOOKS
    ]
    hooks += [
        (
            target,
            hook,
            class_name,
            "the draft's own embed_tokens / lm_head are allocated before the KV pool is sized "
            "in this process",
        )
        for target, hook, class_name in draft_vocab.VOCAB_HOOKS
    ]
    for target, hook, class_name, effect in hooks:
        if target in context.registered_targets():
            continue
        if class_name and releases.module_absent(target.rsplit(".", 2)[0]):
            logger.debug("sglang-mtp-dequant: sglang %s has no %s", support.version, target)
            continue
        problem = unresolvable(target)
        if problem is not None:
            logger.warning(
                "sglang-mtp-dequant: hook target %s is not available in sglang %s (%s); %s",
                target,
                context.sglang_version(),
                problem,
                effect,
            )
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        context.mark_registered(target)
    register_launch_guard()


def unresolvable(target: str) -> str | None:
    """Why ``target`` cannot be hooked, naming the module's own exception, or None.

    ``pkgutil.resolve_name`` turns a module that fails to import (a missing native dependency)
    into ``AttributeError: module ... has no attribute ...``; importing the module first keeps
    its real error.
    """
    module_path, _, attributes = target.rpartition(".")
    while module_path:
        try:
            module = importlib.import_module(module_path)
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_path.startswith(exc.name):
                return f"importing {module_path} failed: {type(exc).__name__}: {exc}"
            module_path, _, head = module_path.rpartition(".")
            attributes = f"{head}.{attributes}"
        except Exception as exc:  # noqa: BLE001 - the module's own failure, reported as is
            return f"importing {module_path} failed: {type(exc).__name__}: {exc}"
    else:
        return f"no module in {target!r} can be imported"
    obj: Any = module
    for attribute in attributes.split("."):
        if not hasattr(obj, attribute):
            return f"{getattr(obj, '__name__', obj)!s} has no attribute {attribute!r}"
        obj = getattr(obj, attribute)
    return None


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Within this block every hook runs sglang's own code only (the CLI's "stock" loads):
    unwrapping is not enough where an override's ``super().load_weights`` reaches the hook."""
    token = context.BYPASS.set(True)
    try:
        yield
    finally:
        context.BYPASS.reset(token)


def sglang_dequantizes_drafts(load_weights: Callable[..., Any] | None = None) -> bool:
    """Whether this sglang dequantizes this ``load_weights``'s draft itself (``upstream_fix``)."""
    from .upstream_fix import calls_sglang_decode

    module = sys.modules.get(getattr(load_weights, "__module__", None) or "")
    if load_weights is None or module is None:
        return False
    return calls_sglang_decode(load_weights, module)


def make_load_weights_hook(spec: DraftSpec) -> LoadWeightsHook:
    """The AROUND hook for ``spec``'s ``load_weights``, in sglang's ``HookRegistry`` form
    ``fn(original_fn, *args, **kwargs) -> result``: ``(original, model, weights, ...)``.

    Inside ``plugin.bypassed()`` it calls ``original`` untouched, and an sglang that dequantizes
    drafts itself loads alone, unnarrowed (docs/design.md, "The draft load"); any other load is
    one ``load.DraftLoad``. The result is ``original``'s.
    """

    def load_weights_with_dequant(
        original: LoadWeights,
        model: torch.nn.Module,
        weights: Weights,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if context.is_bypassed():
            return original(model, weights, *args, **kwargs)
        load = DraftLoad(spec, model)
        if load.quantization is None and sglang_dequantizes_drafts(original):
            logger.info(
                "sglang-mtp-dequant: this sglang dequantizes ModelSlim draft weights itself "
                "(%s); the plugin leaves the %s draft load to it",
                original.__module__,
                spec.class_name,
            )
            return original(model, weights, *args, **kwargs)  # files as sglang resolved them
        return load.run(original, model, weights, args, kwargs)

    load_weights_with_dequant.__qualname__ = spec.hook_name
    return load_weights_with_dequant
