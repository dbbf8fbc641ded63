"""What this process knows: the sglang version, its hooks, the files sglang resolved.

Usage::

    context.sglang_version()                        # "0.5.23", or "unknown"
    context.mark_registered(target); context.registered_targets()
    context.record_resolution(WeightSource(...))    # sglang resolved files outside a draft load
    context.resolution_of("/ckpt")                  # the newest such resolution of a path
    context.draft_launch()                          # the draft's path, revision, --download-dir

Why one module: the hooks, the Ray set-up and the CLI need these facts, and one copy keeps them
agreeing. A hooked draft load keeps its own (``load.py``).
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass

from ..formats.checkpoint import WeightSource
from . import releases

#: hook targets registered in this process (``plugin.register()`` may run more than once)
_registered: set[str] = set()
#: requested path -> sglang's newest resolution of it outside a hooked draft load
_resolved_outside: dict[str, WeightSource] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class DraftLaunch:
    """The server arguments that decide where the draft's weights come from."""

    path: str
    revision: str | None
    download_dir: str | None
    load_format: str


#: set while the CLI builds or loads a draft "as stock sglang would" (``plugin.bypassed``)
BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar("mtp_dequant_bypass", default=False)


def is_bypassed() -> bool:
    """Inside ``plugin.bypassed()``, where every hook leaves sglang's own answer alone."""
    return BYPASS.get()


def sglang_version() -> str:
    """The installed sglang's version, or "unknown"."""
    return releases.installed_version()


def resolver_name() -> str:
    """Who resolved a checkpoint's files, for the messages that name it."""
    return f"sglang {sglang_version()} DefaultModelLoader"


def mark_registered(target: str) -> None:
    _registered.add(target)


def registered_targets() -> frozenset[str]:
    """The hook targets this process registered with sglang's ``HookRegistry``."""
    return frozenset(_registered)


def record_resolution(source: WeightSource) -> None:
    """sglang resolved ``source`` outside any hooked draft load (the newest per path)."""
    with _lock:
        _resolved_outside.pop(source.requested, None)  # the newest last
        _resolved_outside[source.requested] = source


def requested_of(folder: str) -> str:
    """The path whose newest resolution outside a draft load is ``folder`` (else itself)."""
    with _lock:
        found = [s.requested for s in _resolved_outside.values() if s.folder == folder]
    return found[-1] if found else folder


def resolution_of(path: str) -> WeightSource | None:
    """The newest resolution sglang made of ``path`` outside a hooked draft load, or None."""
    with _lock:
        return _resolved_outside.get(path)


def draft_launch() -> DraftLaunch | None:
    """The draft's checkpoint as sglang's draft worker loads it, or None outside sglang."""
    try:
        from .sglang_private import draft_server_args

        model, spec = draft_server_args()
        path = spec.speculative_draft_model_path or model.model_path
        revision = (
            spec.speculative_draft_model_revision
            if spec.speculative_draft_model_path
            else model.revision
        )
        load_format = spec.speculative_draft_load_format or model.load_format
        download_dir = model.download_dir
    except Exception:  # noqa: BLE001 - no context published: not inside sglang's start-up
        return None
    if not path:
        return None
    return DraftLaunch(path, revision, download_dir, str(load_format or "auto"))
