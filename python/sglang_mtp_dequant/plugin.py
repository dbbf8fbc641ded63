"""The one place that hooks sglang: the entry point and the wrapper around draft loading.

Usage (what ``pip install`` arranges; nothing to call by hand)::

    # pyproject.toml
    [project.entry-points."sglang.srt.plugins"]
    mtp_dequant = "sglang_mtp_dequant.plugin:register"

    # every sglang process: sglang.srt.plugins.load_plugins() -> register() -> apply_hooks()

``register`` puts an AROUND hook on each draft class's ``load_weights`` (``drafts.py``).
When the draft was built unquantized (``quant_config is None``) the hook reads the checkpoint
folder's headers, plans what to dequantize, and hands sglang's own ``load_weights`` the
transformed stream (``stream.py``). With a quant config, or with nothing quantized in the
draft, sglang's loading is what it would be without the plugin. After sglang's own loading,
the guard (``guard.py``) refuses a draft whose float parameters still hold integer codes,
whatever the format. ``register`` also arms the Ray launch check (``ray_setup.py``), since
sglang's Ray actors never load plugins themselves, and puts a BEFORE hook on
``ModelRunner.load_model`` that starts the bf16 kernel's warm-up (``schemes/fused_bf16.py``)
while the target model loads, when the draft will need it.

sglang's plugin loader only logs exceptions, so a hook target that does not exist (another
sglang version) is reported here with a WARNING naming it and the sglang version.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import time
from collections.abc import Callable
from typing import Any

from .checkpoint import Checkpoint
from .doctor import diagnose
from .drafts import DRAFT_SPECS, DraftSpec, draft_dtype
from .guard import check_loaded_draft
from .plan import DequantPlan
from .ray_setup import register_launch_guard
from .schemes import fused_bf16
from .stream import DequantizingStream

logger = logging.getLogger("sglang_mtp_dequant")

#: hook targets registered in this process (register() may be called more than once)
_registered: set[str] = set()


def register(specs: tuple[DraftSpec, ...] = DRAFT_SPECS) -> None:
    """Entry point for sglang's general-plugin group: hook every draft class we know."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for spec in specs:
        if spec.target in _registered:
            continue
        try:
            pkgutil.resolve_name(spec.target)
        except Exception as exc:  # ImportError, AttributeError, or the module's own failure
            logger.warning(
                "sglang-mtp-dequant: hook target %s is not available in sglang %s (%s: %s); "
                "%s drafts load WITHOUT dequantization in this process",
                spec.target,
                sglang_version(),
                type(exc).__name__,
                exc,
                spec.class_name,
            )
            continue
        HookRegistry.register(spec.target, make_load_weights_hook(spec), HookType.AROUND)
        _registered.add(spec.target)
    # sglang's Ray SchedulerActor never calls load_plugins(): activate it there, or refuse the
    # launch (ray_setup.py); registers nothing where Ray is not installed
    register_launch_guard()
    register_kernel_warm_up()


#: runs before every model load of a scheduler process: the target's first, the draft's later
WARM_UP_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def register_kernel_warm_up() -> None:
    """BEFORE hook on ``ModelRunner.load_model`` that starts the kernel warm-up early.

    Optional: without it the warm-up starts when the draft load does, and the first decode
    waits for it (about a second). So a missing target is logged at DEBUG, not WARNING.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if WARM_UP_TARGET in _registered:
        return
    try:
        pkgutil.resolve_name(WARM_UP_TARGET)
    except Exception as exc:  # noqa: BLE001 - any failure: just no early warm-up
        logger.debug("sglang-mtp-dequant: no early kernel warm-up (%s: %s)", WARM_UP_TARGET, exc)
        return
    HookRegistry.register(WARM_UP_TARGET, warm_up_before_model_load, HookType.BEFORE)
    _registered.add(WARM_UP_TARGET)


def warm_up_before_model_load(*_args: Any, **_kwargs: Any) -> None:
    """Start the kernel warm-up if this process will decode a quantized draft; changes nothing
    of the load (returns None: sglang keeps the arguments). The check (speculative decoding on,
    and the draft checkpoint holds draft weights to dequantize: doctor's diagnosis: headers
    and the small scale tensors, never a weight) runs in the warm-up thread."""
    fused_bf16.warm_up(when=draft_needs_dequantization)


def draft_needs_dequantization() -> bool:
    """Whether the draft sglang will load has weights the plugin would dequantize."""
    try:
        from sglang.srt.runtime_context import get_spec

        if not get_spec().speculative_algorithm:
            return False
    except Exception:  # noqa: BLE001 - context not published: not a scheduler's model load
        return False
    folder = checkpoint_folder()
    return folder is not None and diagnose(folder).counts()["dequantize"] > 0


def registered_targets() -> frozenset[str]:
    """The targets ``register`` hooked in this process (for tests and diagnostics)."""
    return frozenset(_registered)


def make_load_weights_hook(spec: DraftSpec) -> Callable[..., Any]:
    def load_weights_with_dequant(original, model, weights, *args, **kwargs):
        if getattr(model, "quant_config", None) is not None:
            # the user asked for a quantized draft: its quantized layers consume the codes
            return original(model, weights, *args, **kwargs)
        is_draft = spec.draft_names(model)
        folder = checkpoint_folder()
        plan = None
        if folder is not None:
            plan = DequantPlan.build(Checkpoint.open(folder, wanted=is_draft))
            plan.raise_first_error()
        stream = DequantizingStream(
            plan,
            draft_dtype(model),
            is_draft,
            missing_plan_hint=(
                f"sglang-mtp-dequant could not find the checkpoint folder (looked for "
                f"{checkpoint_paths() or 'no path in the sglang context'}); pass a local "
                "folder as --model-path / --speculative-draft-model-path"
            ),
        )
        started = time.perf_counter()
        result = original(model, stream.apply(weights), *args, **kwargs)
        # values, not names: refuse a draft whose float parameters still hold codes (guard.py)
        check_loaded_draft(model, result, stream, spec.class_name, folder)
        stats = stream.stats
        if stats.dequantized:
            schemes = ", ".join(f"{k} x{v}" for k, v in sorted(stats.schemes.items()))
            logger.info(
                "sglang-mtp-dequant: %s draft from %s: dequantized %d tensors (%s) to %s, "
                "%d quantized bytes, %d companion tensors consumed, %.3f s decoding "
                "(%.3f s whole load)",
                spec.class_name,
                folder,
                stats.dequantized,
                schemes,
                str(stream.dtype).replace("torch.", ""),
                stats.quantized_bytes,
                stats.companions_consumed,
                stats.seconds,
                time.perf_counter() - started,
            )
        if stats.already_float:
            logger.info(
                "sglang-mtp-dequant: %d quantized draft tensors arrived already float "
                "(dequantized upstream); left as they were",
                stats.already_float,
            )
        return result

    load_weights_with_dequant.__qualname__ = f"sglang_mtp_dequant[{spec.class_name}]"
    return load_weights_with_dequant


def checkpoint_paths() -> list[str]:
    """The draft checkpoint path sglang loads: the draft path if set, else the target path."""
    try:
        from sglang.srt.runtime_context import get_model, get_spec

        draft = get_spec().speculative_draft_model_path
        target = get_model().model_path
    except Exception:  # context not published (not inside sglang's start-up)
        return []
    return [p for p in (draft or target,) if p]


def checkpoint_folder() -> str | None:
    """The local folder behind sglang's checkpoint path (a hub id resolves to its cache)."""
    for path in checkpoint_paths():
        local = local_folder(path)
        if local is not None:
            return local
    return None


def local_folder(path: str) -> str | None:
    """``path`` itself if it is a folder, else the local snapshot of the hub id ``path``."""
    return path if os.path.isdir(path) else _hub_snapshot(path)


def _hub_snapshot(repo_id: str) -> str | None:
    """sglang has already downloaded a hub model before loading it: find that snapshot."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:
        return None


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return "unknown"
