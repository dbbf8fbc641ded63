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
        if scheme == "W8A8_DYNAMIC" and base + ".weight_offset" not in tensors:
            return q.float() * scale  # symmetric by definition: no offset means zero
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


# -- int4 (W4A8_DYNAMIC, W4A16): written from msmodelslim 26.1.0's packing code -------------
# (``save/complex_quantifier.py``: ``_pack_int4`` stores ``(first & 0xF) | (second << 4)``;
# W4A8 and per-group W4A16 pair output rows, per-channel W4A16 pairs input columns)


def _nibbles(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) nibbles of int8 bytes as signed int16, by masking and re-centring."""
    byte = packed.to(torch.int16) & 0xFF
    low, high = byte & 0xF, (byte >> 4) & 0xF
    return torch.where(low >= 8, low - 16, low), torch.where(high >= 8, high - 16, high)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """(..., out/2, in) -> (..., out, in): even rows low nibble, odd rows high nibble."""
    low, high = _nibbles(packed)
    shape = list(packed.shape)
    shape[-2] *= 2
    out = torch.empty(shape, dtype=torch.int16)
    out[..., 0::2, :], out[..., 1::2, :] = low, high
    return out


def unpack_int4_cols(packed: torch.Tensor) -> torch.Tensor:
    """(..., out, in/2) -> (..., out, in): even columns low nibble, odd columns high nibble."""
    low, high = _nibbles(packed)
    shape = list(packed.shape)
    shape[-1] *= 2
    out = torch.empty(shape, dtype=torch.int16)
    out[..., 0::2], out[..., 1::2] = low, high
    return out


def pack_int4_rows(q: torch.Tensor) -> torch.Tensor:
    """msmodelslim's ``_w4a8_pack_int4``: transpose, pair along the last axis, transpose back."""
    t = q.to(torch.int8).transpose(-1, -2).contiguous()
    pairs = t.reshape(-1, 2)
    packed = torch.bitwise_or(torch.bitwise_left_shift(pairs[:, 1:], 4), pairs[:, :1] & 0b1111)
    shape = list(t.shape)
    shape[-1] //= 2
    return packed.reshape(shape).transpose(-1, -2).contiguous()


def expand_groups(values: torch.Tensor, in_features: int) -> torch.Tensor:
    """(..., out, 1) or (..., out, in/G) -> (..., out, in) by repetition (any leading dims)."""
    values = values.float()
    return values.repeat_interleave(in_features // values.shape[-1], dim=-1)


def dequantize_int4_fp32(
    tensors: dict[str, torch.Tensor], weight_name: str, scheme: str, version: str | None
) -> torch.Tensor:
    """fp32 int4 dequantization.

    W4A8_DYNAMIC: ``q * weight_scale``, two-stage ``(q * weight_scale_second) * weight_scale``;
    W4A16: ``(q - weight_offset) * weight_scale``.
    """
    base = weight_name[: -len(".weight")] if weight_name.endswith(".weight") else weight_name
    stored = tensors[weight_name]
    scale = tensors[base + ".weight_scale"]
    out_features = scale.shape[-2]
    per_group = scale.shape[-1] > 1
    if stored.shape[-2] * 2 == out_features:
        q = unpack_int4_rows(stored)
    elif scheme == "W4A16" and version == "1.0.0" and not per_group:
        q = unpack_int4_cols(stored)
    else:
        q = stored.to(torch.int16)
    in_features = q.shape[-1]
    if scheme == "W4A8_DYNAMIC":
        second = tensors.get(base + ".weight_scale_second")
        if second is not None:
            return (q.float() * expand_groups(second, in_features)) * scale.float()
        return q.float() * scale.float()
    if scheme == "W4A16":
        offset = tensors[base + ".weight_offset"]
        return (q.float() - expand_groups(offset, in_features)) * expand_groups(scale, in_features)
    raise AssertionError(f"reference has no int4 rule for {scheme}")


def int4_step(tensors: dict[str, torch.Tensor], weight_name: str, in_features: int):
    """The quantization step of every element: ``weight_scale`` (times ``weight_scale_second``
    for the two-stage form), expanded to (..., out, in)."""
    base = weight_name[: -len(".weight")]
    step = expand_groups(tensors[base + ".weight_scale"], in_features)
    second = tensors.get(base + ".weight_scale_second")
    return step if second is None else step * expand_groups(second, in_features)


# -- writing ModelSlim-format checkpoints in tests ---------------------------------------------


def quantize_w8a8_dynamic(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """msmodelslim's W8A8_DYNAMIC export of a float weight: symmetric per-channel minmax int8,
    ``weight_scale`` f32 (..., out, 1), ``weight_offset`` zeros (``ascendv1.py``,
    ``on_w8a8_dynamic_per_channel``)."""
    w = w.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0
    q = torch.clamp(torch.round(w / scale), -128, 127).to(torch.int8)
    return {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}


def write_modelslim_checkpoint(
    folder: str,
    tensors: dict[str, torch.Tensor],
    description: dict[str, str],
    *,
    version: str | None = "1.0.0",
    group_size: int = 0,
    model_quant_type: str = "W8A8_DYNAMIC",
) -> str:
    """One ``quant_model_weights.safetensors`` (V1 with ``part_file_size: 0``: no index) and a
    ``quant_model_description.json``, as msmodelslim's ascendv1 saver lays them out."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        os.path.join(folder, "quant_model_weights.safetensors"),
        metadata={"format": "pt"},
    )
    desc = dict(description)
    desc["model_quant_type"] = model_quant_type
    if version is not None:
        desc["version"] = version
    desc["group_size"] = group_size
    with open(os.path.join(folder, "quant_model_description.json"), "w") as handle:
        json.dump(desc, handle, indent=1)
    return folder
