"""Resolve what the CLI is given as ``--model-path`` to the files sglang would stream, offline.

Usage::

    source = resolve_checkpoint("/models/Qwen3.5-27B-w8a8")
    source = resolve_checkpoint("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision="v1")

A CLI process has no server to record sglang's resolution, so it asks sglang's functions
offline (``serving/sources.py``); without sglang importable, a folder's every ``*.safetensors``.
"""

from __future__ import annotations

import glob
import os

from ..errors import CheckpointFormatError
from ..formats.checkpoint import WeightSource
from ..serving.sources import resolve_offline
from .cpu_env import ensure_torchvision_importable


def resolve_checkpoint(
    path: str, *, download_dir: str | None = None, revision: str | None = None
) -> WeightSource:
    """The folder and weight files sglang would load for ``path`` (``CheckpointFormatError``)."""
    ensure_torchvision_importable()
    try:
        import sglang.srt.model_loader.loader  # noqa: F401
    except ImportError as exc:
        return _folder_without_sglang(path, exc)
    from .cpu_sglang import publish_context

    return resolve_offline(
        path,
        download_dir=download_dir,
        revision=revision,
        publish=lambda folder: publish_context(folder, download_dir=download_dir),
    )


def _folder_without_sglang(path: str, why: ImportError) -> WeightSource:
    if not os.path.isdir(path):
        raise CheckpointFormatError(
            file=path,
            problem=f"is not a folder, and sglang is not importable to resolve a hub id ({why})",
            hint="pass the local checkpoint (or snapshot) folder, or run where sglang is installed",
        )
    files = tuple(sorted(glob.glob(os.path.join(path, "*.safetensors"))))
    return WeightSource(
        path, path, files, "every *.safetensors of the folder (sglang not importable)"
    )
