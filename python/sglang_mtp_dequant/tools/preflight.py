"""The CLI's checks of its inputs, made before sglang (or torch) is imported: instant and true.

Usage::

    problem = check_model_path("/models/x", download_dir=None)     # None: let sglang resolve it
    problem = check_reference("/ckpt/mtp_float.safetensors")
    if problem is not None:
        print(problem)            # "<absolute path>: does not exist. What to do: ..."

Why before sglang: importing it takes tens of seconds, and its answer to a missing path is a
hub-id validation error. Only what is certainly wrong is said here; anything undecided is left
to sglang's own resolution.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
from dataclasses import dataclass

from ..errors import what_to_do

#: what huggingface_hub accepts as a repo id: ``namespace/name``
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class InputError:
    """One input that is certainly wrong: which, what is wrong, what to do."""

    kind: str  # the ``error_kind`` of the CLI's JSON (docs/doctor-and-guard.md)
    path: str  # absolute
    problem: str
    hint: str

    def __str__(self) -> str:
        return what_to_do(self.path, self.problem, self.hint)


def looks_like_hub_id(path: str) -> bool:
    """``org/name`` as huggingface_hub spells a repo id (never an absolute or ./ path)."""
    return bool(_HUB_ID.match(path)) and not path.startswith((".", "~"))


def hub_caches(download_dir: str | None) -> list[str]:
    """The folders a hub id is looked up in, offline: ``--download-dir``, then ``HF_HUB_CACHE``."""
    from huggingface_hub import constants

    caches = [download_dir] if download_dir else []
    return [*caches, constants.HF_HUB_CACHE]


def check_model_path(path: str, *, download_dir: str | None = None) -> InputError | None:
    """What is certainly wrong with ``path`` as ``--model-path``, or None."""
    if download_dir is not None and not os.path.isdir(download_dir):
        return InputError(
            "bad-download-dir",
            os.path.abspath(download_dir),
            "(--download-dir) is not a folder",
            "pass the hub cache folder the server uses as --download-dir, or leave it out",
        )
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        if looks_like_hub_id(path):
            return _check_hub_id(path, download_dir)
        return InputError(
            "missing-path",
            absolute,
            "does not exist",
            "pass the checkpoint folder sglang gets as --model-path (the one holding "
            "config.json and the *.safetensors files), or a hub id in the local cache",
        )
    if not os.path.isdir(absolute):
        return InputError(
            "not-a-folder",
            absolute,
            "is a file, not a checkpoint folder",
            f"pass the folder that holds it ({os.path.dirname(absolute)}), as sglang's "
            "--model-path takes it",
        )
    if not os.path.isfile(os.path.join(absolute, "config.json")):
        hint = "pass the checkpoint folder itself (the one holding config.json)"
        if os.path.isdir(os.path.join(absolute, "snapshots")):
            hint = (
                "this is a Hugging Face cache entry: pass its snapshots/<commit> folder, or "
                "the hub id with --download-dir"
            )
        return InputError(
            "no-config",
            absolute,
            "holds no config.json: sglang cannot tell which model (and draft class) it is",
            hint,
        )
    if not glob.glob(os.path.join(absolute, "*.safetensors")):
        others = sorted(
            os.path.basename(p) for ext in ("bin", "pt") for p in glob.glob(f"{absolute}/*.{ext}")
        )
        found = f" (only {', '.join(others[:3])})" if others else ""
        return InputError(
            "no-weights",
            absolute,
            f"holds no *.safetensors weight file{found}",
            "pass the folder with the checkpoint's weights; ModelSlim exports and this plugin "
            "use safetensors files",
        )
    return None


def _check_hub_id(path: str, download_dir: str | None) -> InputError | None:
    if os.environ.get("SGLANG_USE_MODELSCOPE", "").lower() in ("1", "true", "yes"):
        return None  # ModelScope's cache layout: sglang's own lookup decides
    entry = "models--" + path.replace("/", "--")
    caches = hub_caches(download_dir)
    if any(os.path.isdir(os.path.join(cache, entry)) for cache in caches):
        return None  # cached: sglang resolves the revision and files
    return InputError(
        "not-cached",
        path,
        f"is neither a folder nor a hub model in a local cache (looked for {entry} in "
        f"{', '.join(caches)})",
        "pass the local checkpoint folder, or download the model first and pass the "
        "--download-dir the server uses; the CLI never downloads",
    )


def check_reference(path: str) -> InputError | None:
    """``--reference``: an existing safetensors file whose header reads (nothing loaded)."""
    absolute = os.path.abspath(os.path.expanduser(path))
    hint = "pass the safetensors file of the original float draft tensors (or leave it out)"
    if not os.path.isfile(absolute):
        what = "is a folder, not a file" if os.path.isdir(absolute) else "does not exist"
        return InputError("missing-reference", absolute, f"(--reference) {what}", hint)
    try:
        with open(absolute, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"a header length of {length} bytes")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("a header that is no JSON object")
    except (OSError, struct.error, ValueError) as exc:
        return InputError(
            "bad-reference",
            absolute,
            f"(--reference) is not a readable safetensors file ({exc})",
            hint,
        )
    return None


def reference_names(path: str) -> set[str]:
    """The tensor names in a safetensors file's header (``check_reference`` passed)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {name for name in header if name != "__metadata__"}
