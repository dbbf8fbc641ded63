"""The one place that hooks sglang: the entry point and the wrapper around draft loading.

Usage (what ``pip install`` arranges; nothing to call by hand)::

    # pyproject.toml
    [project.entry-points."sglang.srt.plugins"]
    mtp_dequant = "sglang_mtp_dequant.serving.plugin:register"

    # every sglang process: sglang.srt.plugins.load_plugins() -> register() -> apply_hooks()

``register`` puts an AROUND hook on each draft class's ``load_weights`` (``drafts.py``), two
observing hooks on sglang's ``DefaultModelLoader`` (``sources.py``), two on its quant config and
model build (``target_layers.py``: target layers built unquantized over quantized codes) and the
Ray launch check (``ray_setup.py``). Every hooked draft load streams only the files holding the
draft's tensors (``narrowing.py``); a draft built unquantized gets the dequantizing stream
(``stream.py``), one built with a quant config the decode of its plain ``nn.Linear`` parts
(``quantized_load.py``); both are guarded (``guard/``). What each hook does: ``register``,
``make_load_weights_hook``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointFormatError
from ..formats.checkpoint import Checkpoint, WeightSource
from ..formats.naming import needles_of
from ..formats.plan import DequantPlan
from . import context, narrowing, sources, target_layers
from .drafts import DRAFT_SPECS, DraftSpec, draft_dtype
from .guard import WriteRecorder, check_loaded_draft
from .load_record import DraftLoad
from .ownership import ExpertOwnership
from .quantized_load import load_quantized_draft
from .ray_setup import register_launch_guard
from .stream import DequantizingStream

if TYPE_CHECKING:  # Concatenate[..., ...] is Python 3.11's
    from typing import Concatenate

    import torch

    from .sources import AroundHook
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
    ``eh_proj``), and is guarded the same way (``quantized_load.py``). The Ray launch check is armed
    here because sglang's Ray actors never load plugins themselves.

    sglang's plugin loader only logs exceptions, so a hook target that cannot be resolved (another
    sglang version, a module that fails to import) is reported here with a WARNING naming it, the
    sglang version and the module's own exception.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks: list[tuple[str, AroundHook, str | None]] = [
        (spec.target, make_load_weights_hook(spec), spec.class_name) for spec in specs
    ]
    hooks += [(target, hook, None) for target, hook in sources.LOADER_HOOKS]
    for target, hook, class_name in hooks:
        if target in context.registered_targets():
            continue
        problem = unresolvable(target)
        if problem is not None:
            effect = (
                f"{class_name} drafts load WITHOUT dequantization in this process"
                if class_name
                else "the plugin plans from the launch path instead of sglang's resolved files"
            )
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
    target_layers.register(unresolvable)
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


#: set while the CLI loads a draft "as stock sglang would" (``bypassed``)
_BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar("mtp_dequant_bypass", default=False)


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Within this block every hooked ``load_weights`` runs sglang's own code only.

    For the CLI's "stock" loads: unwrapping the hooked method is not enough for a class whose
    own ``load_weights`` override calls ``super().load_weights`` (GLM-5's NextN), which reaches
    the hook through the parent.
    """
    token = _BYPASS.set(True)
    try:
        yield
    finally:
        _BYPASS.reset(token)


#: the module sglang's own fix adds for every draft class (upstream/stack/): where it exists,
#: sglang dequantizes ModelSlim draft weights itself and the plugin steps aside
UPSTREAM_FIX = "sglang.srt.layers.quantization.modelslim.modelslim_draft"
#: what the first pull request alone (upstream/series/) defines in the module of the
#: ``load_weights`` it fixes (Qwen3.5's MTP, which Qwen4-Exp inherits)
UPSTREAM_FIX_MARKER = "ModelSlimDraftWeightError"


def sglang_dequantizes_drafts(load_weights: Callable[..., Any] | None = None) -> bool:
    """Whether this sglang has the fix itself (feature-detected, not by version): for every
    draft class, or for the one whose (unwrapped) ``load_weights`` is given."""
    try:
        if importlib.util.find_spec(UPSTREAM_FIX) is not None:
            return True
    except ImportError:
        pass
    module = sys.modules.get(getattr(load_weights, "__module__", None) or "")
    return module is not None and hasattr(module, UPSTREAM_FIX_MARKER)


def make_load_weights_hook(spec: DraftSpec) -> LoadWeightsHook:
    """The AROUND hook for ``spec``'s ``load_weights``, in sglang's ``HookRegistry`` form
    ``fn(original_fn, *args, **kwargs) -> result``: ``(original, model, weights, ...)``.

    Inside ``plugin.bypassed()`` it calls ``original`` untouched. Otherwise the load is narrowed
    to the draft's files and: a draft built quantized gets sglang's own load with its plain
    ``nn.Linear`` parts decoded (``quantized_load.py``); an sglang that dequantizes drafts itself
    (``sglang_dequantizes_drafts``) does it alone; any other draft loads through the dequantizing
    stream and the guard. The result is ``original``'s.
    """

    def load_weights_with_dequant(
        original: LoadWeights,
        model: torch.nn.Module,
        weights: Weights,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if _BYPASS.get():
            return original(model, weights, *args, **kwargs)
        with narrowing.draft_load(spec.kept_names(model)) as narrowed:
            if getattr(model, "quant_config", None) is not None:
                # built quantized: sglang's own load, its plain nn.Linear parts decoded, guarded
                return load_quantized_draft(
                    original, spec, model, weights, DraftPlanner, narrowed, *args, **kwargs
                )
            if sglang_dequantizes_drafts(original):
                logger.info(
                    "sglang-mtp-dequant: this sglang dequantizes ModelSlim draft weights itself "
                    "(%s); the plugin leaves the %s draft load to it",
                    getattr(original, "__module__", UPSTREAM_FIX),
                    spec.class_name,
                )
                result = original(model, weights, *args, **kwargs)
            else:
                return _dequantizing_load(spec, narrowed, original, model, weights, args, kwargs)
        line = narrowing.narrowing_line(spec.class_name, narrowed)
        if line is not None:
            logger.info("%s", line)
        return result

    load_weights_with_dequant.__qualname__ = f"sglang_mtp_dequant[{spec.class_name}]"
    return load_weights_with_dequant


def _dequantizing_load(
    spec: DraftSpec,
    narrowed: narrowing.DraftNarrowing,
    original: LoadWeights,
    model: torch.nn.Module,
    weights: Weights,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A draft built unquantized: sglang's load_weights on the dequantizing stream, recorded
    and checked by the guard."""
    is_draft = spec.draft_names(model)
    planner = DraftPlanner(is_draft, narrowed)
    with WriteRecorder(model, spec.from_target) as writes:
        stream = DequantizingStream(
            planner.plan,
            draft_dtype(model),
            is_draft,
            owned=ExpertOwnership.of(model),
            missing_plan_hint=planner.missing_hint(),
            observer=writes.on_streamed,
        )
        started = time.perf_counter()
        result = original(model, stream.apply(weights), *args, **kwargs)
        seconds = time.perf_counter() - started
    load = DraftLoad.of(
        spec.class_name, planner.folder, stream, writes, seconds, narrowing=narrowed
    )
    context.record_draft_load(load)
    check_loaded_draft(model, load)
    summary = load.summary()
    lines: tuple[str | None, ...] = (summary, load.already_float_summary())
    if summary is None:
        lines += (narrowing.narrowing_line(spec.class_name, narrowed),)
    for line in lines:
        if line is not None:
            logger.info("%s", line)
    return result


class DraftPlanner:
    """Plans one draft load from the files sglang resolved for it, once it starts streaming."""

    def __init__(
        self,
        is_draft: Callable[[str], bool],
        narrowed: narrowing.DraftNarrowing | None = None,
        wanted: Callable[[str], bool] | None = None,
    ) -> None:
        self.is_draft = is_draft
        self.narrowed = narrowed
        #: the checkpoint names the plan decides for (default: every draft name)
        self.wanted = wanted or is_draft
        self.launch = context.draft_launch()
        self.mark = len(context.weight_sources())
        self.folder: str | None = None

    def plan(self) -> DequantPlan | None:
        streamed = sources.streamed_source(self.mark, self.launch)
        fallback = streamed is None
        source = self._fallback_source() if streamed is None else streamed
        if source is None:
            return None
        self.folder = source.folder
        parsed = self.narrowed.take_indexes(source.folder) if self.narrowed else None
        ckpt = Checkpoint.open(
            source, wanted=self.wanted, indexes=parsed, needles=needles_of(self.wanted)
        )
        plan = DequantPlan.build(ckpt)
        if fallback and (plan.to_dequantize or plan.errors):
            logger.warning(
                "sglang-mtp-dequant: sglang's DefaultModelLoader did not report the draft's "
                "weight files (load format %r); planning from %s, resolved by %s",
                self.launch.load_format if self.launch else "?",
                source.folder,
                source.how,
            )
        plan.raise_first_error()
        return plan

    def _fallback_source(self) -> WeightSource | None:
        """Another loader streams the weights: resolve the launch path as sglang would."""
        if self.launch is None:
            return None
        try:
            return sources.resolve_offline(
                self.launch.path,
                download_dir=self.launch.download_dir,
                revision=self.launch.revision,
            )
        except CheckpointFormatError:
            return None

    def missing_hint(self) -> str:
        path = self.launch.path if self.launch else "no path in the sglang context"
        return (
            f"sglang-mtp-dequant could not find the files sglang streams (draft checkpoint "
            f"{path}); load it with the default loader from a local folder or a cached hub id"
        )
