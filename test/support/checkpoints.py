"""The one ModelSlim checkpoint writer and the one fixture editor the tests use.

Usage::

    write_modelslim_checkpoint(folder, tensors, description, group_size=32)
    write_index(folder, {"mtp.fc.weight": "quant_model_weights-00002-of-00002.safetensors"}, None)
    path = edit_tensors(folder, dropping("mtp.fc.weight_scale"))              # in place
    edit_description(folder, lambda desc: desc.update({"mtp.fc.weight": "W8A16"}))
    ckpt = open_checkpoint(folder)        # the plan's view: the files sglang resolves, headers

Fixture folders are copied read-only from git (``copy_checkpoint``); the editor makes a file
writable before rewriting it, and keeps the safetensors metadata msmodelslim writes.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable

import torch

#: the header metadata every safetensors file here carries (what msmodelslim and torch write)
METADATA = {"format": "pt"}
DESCRIPTION = "quant_model_description.json"
INDEX = "quant_model_weights.safetensors.index.json"


def write_modelslim_checkpoint(
    folder: str,
    tensors: dict[str, torch.Tensor],
    description: dict[str, object],
    *,
    version: str | None = "1.0.0",
    group_size: int | None = 0,
    model_quant_type: str | None = "W8A8_DYNAMIC",
    shard: str = "quant_model_weights.safetensors",
    index: bool = False,
    indent: int | None = 1,
    config: dict | None = None,
) -> str:
    """A ModelSlim V1 folder as msmodelslim's ascendv1 saver lays it out: ``tensors`` in one
    ``shard`` (``part_file_size: 0`` gives ``quant_model_weights.safetensors`` and no index;
    ``index`` adds ``quant_model_weights.safetensors.index.json``) and
    ``quant_model_description.json``, ``config`` as ``config.json`` when given.

    The description's global entries are set from ``version`` / ``group_size`` /
    ``model_quant_type``; None keeps what ``description`` says. The one writer of tensor
    checkpoints for the tests and benchmarks; ``support.real_layouts.write_checkpoint`` writes
    header-only layouts at real sizes.
    """
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    content = {k: v.contiguous() for k, v in tensors.items()}
    save_file(content, os.path.join(folder, shard), metadata=METADATA)
    if index:
        total = sum(t.numel() * t.element_size() for t in content.values())
        write_index(folder, dict.fromkeys(content, shard), total)
    desc = dict(description)
    for key, value in (
        ("model_quant_type", model_quant_type),
        ("version", version),
        ("group_size", group_size),
    ):
        if value is not None:
            desc[key] = value
    with open(os.path.join(folder, DESCRIPTION), "w") as handle:
        json.dump(desc, handle, indent=indent)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as handle:
            json.dump(config, handle, indent=1)
    return folder


def safetensors_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def edit_tensors(
    where: str,
    edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor] | None],
    *,
    metadata: dict[str, str] | None = METADATA,
) -> str:
    """Rewrite one safetensors file through ``edit`` and return its path.

    ``where`` is the file, or a folder holding exactly one. ``edit`` changes the dict in place
    (returning None) or returns the dict to store.
    """
    from safetensors.torch import load_file, save_file

    if os.path.isdir(where):
        (path,) = safetensors_files(where)
    else:
        path = where
    tensors = load_file(path)
    edited = edit(tensors)
    if edited is not None and not isinstance(edited, dict):
        raise TypeError(f"the edit returned {type(edited).__name__}: return None or the dict")
    os.chmod(path, 0o644)
    save_file(tensors if edited is None else edited, path, metadata=metadata)
    return path


def write_index(
    folder: str, weight_map: dict[str, str], total_size: int | None, name: str = INDEX
) -> str:
    """A safetensors index as msmodelslim and Hugging Face write it: ``weight_map`` (tensor ->
    shard file) and ``metadata.total_size`` (None: an empty ``metadata``)."""
    metadata = {} if total_size is None else {"total_size": total_size}
    path = os.path.join(folder, name)
    with open(path, "w") as handle:
        json.dump({"metadata": metadata, "weight_map": weight_map}, handle, indent=2)
    return path


def dropping(*names: str) -> Callable[[dict[str, torch.Tensor]], None]:
    """An ``edit_tensors`` edit that deletes ``names`` (each must be there)."""

    def drop(tensors: dict[str, torch.Tensor]) -> None:
        for name in names:
            del tensors[name]

    return drop


def edit_description(folder: str, edit: Callable[[dict], dict | None]) -> str:
    """Rewrite the folder's ``quant_model_description.json`` through ``edit``."""
    path = os.path.join(folder, DESCRIPTION)
    with open(path) as handle:
        desc = json.load(handle)
    edited = edit(desc)
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump(desc if edited is None else edited, handle)
    return path


def open_checkpoint(folder: str, wanted: Callable[[str], bool] = lambda name: "mtp" in name):
    """The plan's view of a checkpoint folder: the files sglang resolves for it, headers."""
    from sglang_mtp_dequant.formats.checkpoint import Checkpoint
    from sglang_mtp_dequant.tools.resolve import resolve_checkpoint

    return Checkpoint.open(resolve_checkpoint(folder), wanted=wanted)
