"""The one place that hooks sglang: the entry point and the wrapper around draft loading.

Usage (what ``pip install`` arranges; nothing to call by hand)::

    # pyproject.toml
    [project.entry-points."sglang.srt.plugins"]
    mtp_dequant = "sglang_mtp_dequant.serving.plugin:register"

    # every sglang process: sglang.srt.plugins.load_plugins() -> register() -> apply_hooks()

``register`` puts an AROUND hook on each draft class's ``load_weights`` (``drafts.py``), two
hooks on sglang's ``DefaultModelLoader`` (``load.py``: the resolution of the draft's files,
narrowed inside a draft load), two on its quant config and model build (``target_layers.py``:
linear layers built unquantized over quantized codes, target and draft), one on ModelSlim's
``get_quant_method`` (``float_layers.py``: MoE layers the description marks FLOAT built
unquantized) and the Ray launch check (``ray_setup.py``). Each hooked draft load is one
``load.DraftLoad``: narrowed to the files holding the draft's tensors, planned, streamed
through the decoding stream, recorded and guarded. What each hook does: ``register``,
``make_load_weights_hook``.
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

    When a draft built unquantized (``quant_config is None``) loads, the hook hands sglang's own
    ``load_weights`` the transformed stream (``stream.py``), planned from exactly the files sglang
    streams, while recording every parameter write (``guard/writes.py``); afterwards the guard
    refuses a draft left partly unwritten or holding raw codes. A draft built with a quant config
    keeps sglang's own stream, except for the codes of its plain ``nn.Linear`` parts (``fc``,
    ``eh_proj``), and is guarded the same way (``load.LoadSetting``). The Ray launch check is armed
    here because sglang's Ray actors never load plugins themselves.

    sglang's plugin loader only logs exceptions, so a hook target that cannot be resolved (another
    sglang version, a module that fails to import) is reported here with a WARNING naming it, the
    sglang version and the module's own exception. Below the supported sglang releases
    (``releases.py``) it registers nothing and logs one WARNING naming the version and the
    range; a draft family whose module this sglang does not have at all is skipped quietly.
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
    """Within this block every hooked ``load_weights`` runs sglang's own code only, and the
    FLOAT-layer hook (``float_layers``) gives sglang's own answer.

    For the CLI's "stock" loads: unwrapping the hooked method is not enough for a class whose
    own ``load_weights`` override calls ``super().load_weights`` (GLM-5's NextN), which reaches
    the hook through the parent.
    """
    token = context.BYPASS.set(True)
    try:
        yield
    finally:
        context.BYPASS.reset(token)


def sglang_dequantizes_drafts(load_weights: Callable[..., Any] | None = None) -> bool:
    """Whether this sglang dequantizes the draft of the (unwrapped) ``load_weights`` given
    itself, feature-detected per class by what the code does (``upstream_fix``): it calls
    sglang's decode helper, and its module's NPU check, which gates that call, is true."""
    from .upstream_fix import calls_sglang_decode

    module = sys.modules.get(getattr(load_weights, "__module__", None) or "")
    if load_weights is None or module is None:
        return False
    return calls_sglang_decode(load_weights, module)


def make_load_weights_hook(spec: DraftSpec) -> LoadWeightsHook:
    """The AROUND hook for ``spec``'s ``load_weights``, in sglang's ``HookRegistry`` form
    ``fn(original_fn, *args, **kwargs) -> result``: ``(original, model, weights, ...)``.

    Inside ``plugin.bypassed()`` it calls ``original`` untouched. Otherwise the load is one
    ``load.DraftLoad``: an sglang that dequantizes drafts itself (``sglang_dequantizes_drafts``)
    loads a draft built unquantized alone, on the files it resolved: no narrowing, since no
    guard checks such a load (docs/design.md, "The draft load"); any other draft loads
    through the planned, decoding stream and the guard (a draft built quantized with only its
    plain ``nn.Linear`` parts decoded, ``load.LoadSetting``). The result is ``original``'s.
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
