"""Where a checkpoint's weight files come from, offline: exactly what sglang's loader resolves.

Usage (the CLI, and a draft load sglang reported no files for)::

    source = resolve_offline("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision=None)

Why call sglang rather than re-derive: each of its rules (snapshots, hub ids, revisions,
ModelScope, index filtering, ``mtp.safetensors``) written again would be one more way to plan
from files that are not the ones streamed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CheckpointFormatError
from ..formats.checkpoint import WeightSource
from ..formats.config import CheckpointConfig
from . import context, sglang_private

#: the index name sglang filters safetensors files with (``SAFE_WEIGHTS_INDEX_NAME``)
SGLANG_INDEX = "model.safetensors.index.json"


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Hugging Face and ModelScope lookups from the local cache only (``HF_HUB_OFFLINE``)."""
    import huggingface_hub.constants as hub

    previous = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = previous


def resolve_offline(
    path: str,
    *,
    download_dir: str | None = None,
    revision: str | None = None,
    publish: Callable[[str], None] | None = None,
) -> WeightSource:
    """The folder and weight files sglang would load for ``path`` (a folder or a cached hub id),
    without the network; outside a scheduler ``publish`` gets the local folder first
    (``CheckpointFormatError``: neither a folder nor a cached hub model)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    try:
        with _offline():
            asked = path
            if publish is not None and sglang_private.published_server_args() is None:
                asked = _local_copy(loader, path, revision)
                publish(asked)
            folder, files, use_safetensors = sglang_private.prepare_weights(loader, asked, revision)
    except ImportError:  # sglang's own (a name this release lacks): not the checkpoint's
        raise
    except Exception as exc:  # noqa: BLE001 - huggingface_hub, modelscope and sglang errors
        where = f" (nor in --download-dir {download_dir})" if download_dir else ""
        at = f" at revision {revision!r}" if revision else ""
        raise CheckpointFormatError(
            file=path,
            problem=(
                f"is not a checkpoint folder, and sglang found no local copy of it as a hub "
                f"model{at}{where}: {type(exc).__name__}: {exc}"
            ),
            hint=(
                "pass the local checkpoint folder, or the hub id with the --download-dir and "
                "--revision the server uses; download it first if it is not cached"
            ),
        ) from exc
    if use_safetensors:
        files = sglang_private.mtp_file_added(
            list(files), folder, SGLANG_INDEX, _hf_config_of(folder)
        )
    return WeightSource(path, folder, tuple(files), f"{context.resolver_name()} (offline)")


def _local_copy(loader: Any, path: str, revision: str | None) -> str:
    """The local folder sglang's ``_prepare_weights`` starts from, by sglang's own functions."""
    from sglang.srt.model_loader.weight_utils import download_weights_from_hf

    local = sglang_private.modelscope_local_copy(loader, path, revision)
    if os.path.isdir(local):
        return local
    patterns = ["*.safetensors", "*.bin", "*.pt"]  # load format auto, .pt fallback allowed
    return download_weights_from_hf(
        local,
        loader.load_config.download_dir,
        patterns,
        revision,
        ignore_patterns=loader.load_config.ignore_patterns,
    )


def _hf_config_of(folder: str) -> Any:
    try:
        return CheckpointConfig.read(folder).namespace()
    except CheckpointFormatError:
        return None
