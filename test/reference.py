"""An independent dequantizer for the tests, written from the ModelSlim format notes.

It shares no code with the plugin: whatever the plugin computes is compared against this
straightforward fp32 formula, applied to the raw tensors read with safetensors.
"""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors.torch import load_file


def load_all(folder: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        tensors.update(load_file(path))
    return tensors


def description(folder: str) -> dict:
    with open(os.path.join(folder, "quant_model_description.json")) as handle:
        return json.load(handle)


def expand_to(values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """(out,) / (out,1) per channel or (out, in/G) per group -> (out, in) by repetition."""
    values = values.float()
    if values.ndim == 1:
        values = values[:, None]
    return values.repeat_interleave(shape[1] // values.shape[1], dim=1)


def dequantize_fp32(
    tensors: dict[str, torch.Tensor], weight_name: str, scheme: str
) -> torch.Tensor:
    """fp32 ``(q - offset) * scale`` (static W8A8: ``scale = deq_scale / input_scale``)."""
    base = weight_name[: -len(".weight")]
    q = tensors[weight_name]
    if scheme in ("W8A8_DYNAMIC", "W8A16"):
        scale = expand_to(tensors[base + ".weight_scale"], q.shape)
        offset = expand_to(tensors[base + ".weight_offset"], q.shape)
        return (q.float() - offset) * scale
    if scheme == "W8A8":
        deq = tensors[base + ".deq_scale"]
        if deq.dtype == torch.int64:
            deq = deq.to(torch.int32).view(torch.float32)
        scale = deq.float() / tensors[base + ".input_scale"].float()
        return q.float() * scale[:, None]
    raise AssertionError(f"reference has no rule for {scheme}")


# parameter of the sglang draft -> the checkpoint tensors concatenated into it (TP=1)
DENSE_PROJECTIONS = {
    "model.layers.0.qkv_proj.weight": [
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.self_attn.k_proj.weight",
        "mtp.layers.0.self_attn.v_proj.weight",
    ],
    "model.layers.0.o_proj.weight": ["mtp.layers.0.self_attn.o_proj.weight"],
    "model.layers.0.mlp.gate_up_proj.weight": [
        "mtp.layers.0.mlp.gate_proj.weight",
        "mtp.layers.0.mlp.up_proj.weight",
    ],
    "model.layers.0.mlp.down_proj.weight": ["mtp.layers.0.mlp.down_proj.weight"],
}


def quantization_step(
    tensors: dict[str, torch.Tensor], weight_name: str, scheme: str
) -> torch.Tensor:
    base = weight_name[: -len(".weight")]
    q = tensors[weight_name]
    if scheme == "W8A8":
        return (
            dequantize_fp32(tensors, weight_name, scheme).new_ones(q.shape)
            * (tensors[base + ".deq_scale"].float() / tensors[base + ".input_scale"].float())[
                :, None
            ]
        )
    return expand_to(tensors[base + ".weight_scale"], q.shape)
