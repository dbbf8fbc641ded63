"""What the end-to-end run is given: checked in seconds, before any server starts; its prompts.

Usage::

    check_model("/models/w8a8")                                    # raise InputError, or pass
    check_target("/models/float"); check_draft("/models/w8a8")   # the two-folder form
    prompts = heldout_prompts(4, 64)                               # byte ids of held-out text

A missing folder, a folder without config.json or weights, or a draft with no quantized MTP
tensors would otherwise cost a server start-up (tens of seconds) before failing, or, worse,
run to the end and "pass" on the wrong files. Headers are read without torch (safetensors'
numpy reader), so the checks take milliseconds.
"""

from __future__ import annotations

import glob
import os

from safetensors import safe_open

from sglang_mtp_dequant.formats.description import DESCRIPTION_NAME as DESCRIPTION

#: the Qwen3.5 MTP head's checkpoint prefix (what the bundled and released checkpoints use)
MTP_PREFIX = "mtp."
CODE_DTYPES = ("int8", "uint8", "int16", "int32", "float8_e4m3fn", "float8_e5m2")


class InputError(ValueError):
    """A TARGET or DRAFT the run cannot use; the message says what to pass instead."""


def _weights(folder: str, role: str) -> list[str]:
    if not os.path.exists(folder):
        raise InputError(f"{role} {folder} does not exist: pass a checkpoint folder")
    if not os.path.isdir(folder):
        raise InputError(f"{role} {folder} is a file, not a folder: pass the folder holding it")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise InputError(f"{role} {folder} has no config.json: pass a checkpoint folder")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise InputError(f"{role} {folder} holds no *.safetensors weights")
    return files


def check_target(folder: str, role: str = "TARGET") -> None:
    """The float checkpoint the servers serve (and whose own MTP head is the float draft)."""
    files = _weights(folder, role)
    if not _mtp_dtypes(files):
        raise InputError(
            f"{role} {folder} has no {MTP_PREFIX}* tensors: the float draft run needs the "
            "checkpoint's own MTP head"
        )


def check_model(folder: str) -> None:
    """ONE ModelSlim folder, served with ``--quantization modelslim`` and its own MTP head."""
    _quantized_mtp(folder, "MODEL")
    if not os.path.isfile(os.path.join(folder, DESCRIPTION)):
        raise InputError(
            f"MODEL {folder} has no {DESCRIPTION}: sglang's --quantization modelslim reads the "
            "tensor types from it; pass the folder msmodelslim wrote"
        )


def check_draft(folder: str) -> None:
    """The quantized checkpoint whose MTP head is the draft of the stock and plugin runs."""
    _quantized_mtp(folder, "DRAFT")


def _quantized_mtp(folder: str, role: str) -> None:
    dtypes = _mtp_dtypes(_weights(folder, role))
    if not dtypes:
        raise InputError(
            f"{role} {folder} has no {MTP_PREFIX}* tensors: pass a checkpoint that includes "
            "the MTP layer (a ModelSlim export of the same model)"
        )
    if not any(d in CODE_DTYPES for d in dtypes.values()):
        raise InputError(
            f"{role} {folder}: every {MTP_PREFIX}* tensor is float: there is nothing for the "
            "plugin to dequantize; pass the ModelSlim-quantized folder"
        )


def check_tree(folder: str) -> None:
    """A materialized sglang tree (``make upstream-tree``): its ``python/sglang`` package."""
    if not os.path.isfile(os.path.join(folder, "python", "sglang", "__init__.py")):
        raise InputError(
            f"--upstream-tree {folder} holds no python/sglang package: run `make upstream-tree` "
            "and pass .cache/upstream/sglang"
        )


def _mtp_dtypes(files: list[str]) -> dict[str, str]:
    found = {}
    for path in files:
        with safe_open(path, framework="numpy") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name.startswith(MTP_PREFIX):
                    found[name] = handle.get_slice(name).get_dtype().lower()
    return {
        name: {"i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32"}.get(d, d)
        for name, d in found.items()
    }


def heldout_prompts(count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` bytes of ``make accept``'s held-out text, as ids."""
    from e2e.corpus import line_start_windows, load_corpus

    windows = line_start_windows(load_corpus().heldout, count, length)
    return [row.tolist() for row in windows]
