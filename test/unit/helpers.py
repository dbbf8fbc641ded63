"""Tiny ModelSlim checkpoints written in a test, and the plan's view of them without sglang."""

from __future__ import annotations

import glob
import os

import torch

from sglang_mtp_dequant.formats.checkpoint import Checkpoint, WeightSource
from support.checkpoints import write_modelslim_checkpoint
from support.reference import quantize_w8a8_dynamic

W = "mtp.layers.0.mlp.up_proj"


def w8a8_checkpoint(folder: str, names=(W,), shape=(8, 16), seed: int = 0) -> dict:
    """One W8A8_DYNAMIC linear per name (msmodelslim's rule) and a FLOAT norm; the tensors."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    desc: dict[str, str] = {}
    for name in names:
        for suffix, value in quantize_w8a8_dynamic(
            torch.randn(*shape, generator=generator)
        ).items():
            tensors[f"{name}.{suffix}"] = value
            desc[f"{name}.{suffix}"] = "W8A8_DYNAMIC"
    tensors["mtp.norm.weight"] = torch.ones(shape[1], dtype=torch.bfloat16)
    desc["mtp.norm.weight"] = "FLOAT"
    write_modelslim_checkpoint(folder, tensors, desc)
    return tensors


def open_folder(folder: str, wanted=lambda name: name.startswith("mtp.")) -> Checkpoint:
    """``Checkpoint.open`` on every *.safetensors of ``folder`` (what sglang streams from a
    ModelSlim export), with no sglang resolution."""
    files = tuple(sorted(glob.glob(os.path.join(folder, "*.safetensors"))))
    return Checkpoint.open(WeightSource(folder, folder, files, "test"), wanted=wanted)
