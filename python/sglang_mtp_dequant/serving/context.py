"""What this process knows: the sglang version, its hooks, where the draft's weights came from.

Usage::

    context.sglang_version()                        # "0.5.23", or "unknown"
    context.mark_registered(target); context.registered_targets()
    context.record_weight_source(WeightSource(...))  # by the loader hooks (sources.py)
    context.weight_sources()                        # every resolution sglang made, oldest first
    context.draft_launch()                          # the draft's path, revision, --download-dir

Why one module: the hooks (``plugin.py``), the Ray set-up (``ray_setup.py``) and the CLI all
need these facts, and one copy of them keeps them agreeing. It imports only ``formats/`` at
run time (the draft-load record only for type checking), so any ``serving/`` module can
import it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..formats.checkpoint import WeightSource
from . import releases

if TYPE_CHECKING:  # the record imports the stream and the guard; this module stays a leaf
    from .load_record import DraftLoad

#: hook targets registered in this process (``plugin.register()`` may run more than once)
_registered: set[str] = set()
#: weight resolutions sglang's loader made in this process, oldest first
_weight_sources: list[WeightSource] = []
_lock = threading.Lock()
_last_draft_load: DraftLoad | None = None


@dataclass(frozen=True)
class DraftLaunch:
    """The server arguments that decide where the draft's weights come from."""

    path: str
    revision: str | None
    download_dir: str | None
    load_format: str


def sglang_version() -> str:
    """The installed sglang's version, or "unknown" (``releases.installed_version``)."""
    return releases.installed_version()


def mark_registered(target: str) -> None:
    _registered.add(target)


def registered_targets() -> frozenset[str]:
    """The hook targets this process registered with sglang's ``HookRegistry``."""
    return frozenset(_registered)


def record_weight_source(source: WeightSource) -> None:
    with _lock:
        _weight_sources.append(source)


def weight_sources() -> tuple[WeightSource, ...]:
    with _lock:
        return tuple(_weight_sources)


def record_draft_load(load: DraftLoad) -> None:
    """Keep ``load`` as this process's newest draft load (only the newest: a record holds
    the model's parameters, and a process that builds many drafts must not keep them all)."""
    global _last_draft_load
    _last_draft_load = load


def last_draft_load() -> DraftLoad | None:
    """The newest draft load of this process, or None."""
    return _last_draft_load


def draft_launch() -> DraftLaunch | None:
    """The draft's checkpoint as sglang's draft worker loads it, or None outside sglang.

    The draft worker builds its ``ModelConfig`` from the resolved
    ``speculative_draft_model_path`` / ``speculative_draft_model_revision`` (sglang fills them
    from ``--model-path`` / ``--revision`` for an MTP draft), and its ``LoadConfig`` from
    ``--download-dir`` and ``--speculative-draft-load-format`` (else ``--load-format``).
    """
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
