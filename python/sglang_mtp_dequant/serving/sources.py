"""Where the draft's weight files come from: exactly what sglang's own loader resolved.

Usage::

    # every sglang process (plugin.register): watch sglang's DefaultModelLoader resolve files
    for target, hook in LOADER_HOOKS: HookRegistry.register(target, hook, HookType.AROUND)

    # the draft's load, once sglang has started streaming: the folder and files it streams
    source = context.weight_sources()[-1]

    # the CLI (doctor, verify): sglang's own resolution, offline, from the local cache only
    source = resolve_offline("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision=None)

Why observe rather than re-derive: a checkpoint reaches sglang as a folder, a Hugging Face
snapshot, a hub id in a cache, a revision or a ModelScope download, then filtered by an index
and given a stray ``mtp.safetensors``; each rule written again here would be one more way to
plan from files that are not the ones streamed. So a server records what ``_prepare_weights``
and ``maybe_add_mtp_safetensors`` returned, and the CLI calls those same two functions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointFormatError
from ..formats.checkpoint import WeightSource
from ..formats.config import CheckpointConfig
from . import context, narrowing, sglang_private

if TYPE_CHECKING:  # Concatenate[..., ...] is Python 3.11's
    from typing import Concatenate

    #: sglang's AROUND hook (``HookRegistry.register``): ``fn(original_fn, *args, **kwargs)``
    #: returning the result in place of ``original_fn(*args, **kwargs)``
    AroundHook = Callable[Concatenate[Callable[..., Any], ...], Any]
    #: ``DefaultModelLoader._prepare_weights(loader, model_name_or_path, revision,
    #: fall_back_to_pt, ...) -> (folder, files, use_safetensors)``
    PrepareWeights = Callable[Concatenate[Any, str, ...], tuple[str, list[str], bool]]
    #: ``maybe_add_mtp_safetensors(files, folder, index_file, hf_config) -> files``
    MtpFile = Callable[Concatenate[list[str], str, ...], list[str]]

#: the index name sglang filters safetensors files with (``SAFE_WEIGHTS_INDEX_NAME``)
SGLANG_INDEX = "model.safetensors.index.json"


def _resolver_name() -> str:
    return f"sglang {context.sglang_version()} DefaultModelLoader"


def observe_prepare_weights(
    original: PrepareWeights, loader: Any, model_name_or_path: str, *args: Any, **kwargs: Any
) -> tuple[str, list[str], bool]:
    """AROUND ``DefaultModelLoader._prepare_weights``: record the folder and files it chose;
    inside a hooked draft load, narrowed to the files holding the draft's tensors
    (``narrowing.py``; everywhere else the result passes through unchanged).

    The ways a checkpoint reaches sglang: a folder, a Hugging Face snapshot (files are symlinks into
    ``../../blobs/``), a hub id found in the default cache or in ``--download-dir``, a revision, a
    ModelScope download (``SGLANG_USE_MODELSCOPE``); sglang then filters by
    ``model.safetensors.index.json``. The hook passes the arguments and the result through; only
    inside a hooked draft load is the file list narrowed (``narrowing.py``).
    """
    result = original(loader, model_name_or_path, *args, **kwargs)
    folder, files = result[0], result[1]
    streamed = narrowing.narrow_resolved(folder, list(files))
    if len(streamed) != len(files):
        result = (folder, streamed, *result[2:])
    context.record_weight_source(
        WeightSource(str(model_name_or_path), folder, tuple(streamed), _resolver_name())
    )
    return result


def observe_mtp_file(
    original: MtpFile, files: list[str], folder: str, *args: Any, **kwargs: Any
) -> list[str]:
    """AROUND ``maybe_add_mtp_safetensors``: record the file list it returned for ``folder``."""
    result = original(files, folder, *args, **kwargs)
    if list(result) != list(files):
        requested = next(
            (s.requested for s in reversed(context.weight_sources()) if s.folder == folder),
            folder,
        )
        context.record_weight_source(
            WeightSource(requested, folder, tuple(result), _resolver_name())
        )
    return result


#: the observation hooks plugin.register() installs (AROUND: arguments and results unchanged)
LOADER_HOOKS: tuple[tuple[str, AroundHook], ...] = (
    (sglang_private.PREPARE_WEIGHTS_TARGET, observe_prepare_weights),
    (sglang_private.MTP_FILE_TARGET, observe_mtp_file),
)


def streamed_source(since: int, launch: context.DraftLaunch | None) -> WeightSource | None:
    """The source of the weights a draft load is streaming, from what sglang recorded.

    ``since`` is ``len(context.weight_sources())`` when the stream was created. sglang resolves
    lazily, when its weight iterator is first advanced, so a resolution made after that mark
    is this load's own. Otherwise (files resolved ahead of the load), the newest resolution of
    the draft's checkpoint path.
    """
    sources = context.weight_sources()
    if len(sources) > since:
        return sources[-1]
    if launch is not None:
        for source in reversed(sources):
            if source.requested == launch.path:
                return source
    return None


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Hugging Face and ModelScope lookups from the local cache only, as ``HF_HUB_OFFLINE=1``.

    sglang reads ``huggingface_hub.constants.HF_HUB_OFFLINE`` at call time, for both hubs.
    """
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
    """The folder and weight files sglang would load for ``path``, without the network.

    ``path`` is a folder (a snapshot folder too) or a hub id that is in the local cache (the
    default one, or ``download_dir`` as sglang's ``--download-dir``); ``revision`` as sglang's
    ``--revision``. ``SGLANG_USE_MODELSCOPE`` is honoured as sglang honours it. sglang's
    ``_prepare_weights`` reads the published server context: inside a scheduler it is there;
    outside one (the CLI, ``tools/resolve.py``) ``publish`` is called with the local folder
    found, before sglang resolves its files.

    Raises:
        CheckpointFormatError: the path is neither a folder nor a cached hub model.
    """
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
    return WeightSource(path, folder, tuple(files), f"{_resolver_name()} (offline)")


def _local_copy(loader: Any, path: str, revision: str | None) -> str:
    """The local folder sglang's ``_prepare_weights`` starts from: ``path`` itself, its
    ModelScope download, or its Hugging Face snapshot (the default cache, or
    ``--download-dir``), each by sglang's own function."""
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
