"""An independent dequantizer for the tests, written from the ModelSlim format notes.

It shares no code with the plugin's decoders (``formats/schemes``): whatever the plugin computes
is compared against these straightforward fp32 formulas, applied to the raw tensors read with
safetensors. The 2-D affine and float8 rules are ``tools/verify``'s independent decoder (itself
free of ``formats/schemes``); the N-D int4 and MX rules live here.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.tools.verify.independent import independent_dequantize, int4_nibbles


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
    if scheme not in ("W8A8_DYNAMIC", "W8A16", "W8A8"):
        raise AssertionError(f"reference has no rule for {scheme}")
    return decode(tensors, weight_name, scheme)


def decode(
    tensors: dict[str, torch.Tensor],
    weight_name: str,
    scheme: str | None = None,
    version: str | None = None,
) -> torch.Tensor:
    """fp32 weight of a 2-D ``weight_name`` from its companions in ``tensors``, by
    ``independent_dequantize``; a layout it has no rule for fails the test."""
    w = independent_dequantize(tensors, weight_name, scheme, version)
    assert w is not None, f"the independent decoder has no rule for {weight_name} ({scheme})"
    return w


def decode_codes(q: torch.Tensor, **companions: torch.Tensor) -> torch.Tensor:
    """fp32 weight of the codes ``q`` with companions by suffix (``weight_scale_inv=...``)."""
    tensors = {"w.weight": q, **{f"w.{suffix}": v for suffix, v in companions.items()}}
    return decode(tensors, "w.weight")


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


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """(..., out/2, in) -> (..., out, in): even rows low nibble, odd rows high nibble."""
    low, high = int4_nibbles(packed)
    shape = list(packed.shape)
    shape[-2] *= 2
    out = torch.empty(shape, dtype=torch.int16)
    out[..., 0::2, :], out[..., 1::2, :] = low, high
    return out


def unpack_int4_cols(packed: torch.Tensor) -> torch.Tensor:
    """(..., out, in/2) -> (..., out, in): even columns low nibble, odd columns high nibble."""
    low, high = int4_nibbles(packed)
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
    """msmodelslim 26.1.0's W8A8_DYNAMIC export of a float weight (..., out, in): symmetric
    per-channel minmax int8, ``weight_scale`` f32 (..., out, 1), ``weight_offset`` zeros.

    Operation for operation as msmodelslim (``core/quantizer/impl/minmax.py``
    ``WeightPerChannelMinmax``, ``ir/api/impl/int_quantization.py`` ``calculate_int_qparam`` /
    ``int_quantize``, ``save/ascendv1.py`` ``on_w8a8_dynamic_per_channel``), in ``w``'s own
    dtype: a bf16 layer rounds in bf16 as msmodelslim does (``benchmarks/accept/writer_proof.py``
    checks it byte for byte); pass ``w.float()`` for fp32 round-to-nearest.
    """
    min_val = torch.amin(w, -1, True)
    max_val = torch.amax(w, -1, True)
    eps = torch.tensor([torch.finfo(torch.float32).eps]).type_as(min_val)
    min_val = torch.min(min_val, torch.zeros_like(min_val))
    max_val = torch.max(max_val, torch.zeros_like(max_val))
    scale = torch.max(torch.max(-min_val, max_val) / float(127), eps)
    codes = (w / scale).round_().clamp_(min=-128, max=127).to(torch.int8)
    scale = scale.to(torch.float32).contiguous()
    offset = torch.zeros_like(scale)
    return {"weight": codes.contiguous(), "weight_scale": scale, "weight_offset": offset}


# -- MX, W4A4_DYNAMIC, WFP8AFP8_DYNAMIC: written from msmodelslim 26.1.0's saver ----------------
# (``modelslim_v1/save/ascendv1.py``: E8M0 ``weight_scale`` = shared exponent + 127 as uint8 per
# 32 inputs; ``save/utils/pack.py`` ``pack_fp4_to_uint8``: bit 3 sign, bits 0-2 index
# 0, 0.5, 1, 1.5, 2, 3, 4, 6, row-major pairs, the first in the low nibble). Every value here is
# decoded from its bit fields in float64 (exact for these products), then rounded to f32 once.

MX_BLOCK = 32


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bit pattern (``torch.equal`` takes -0.0 for 0.0 and fails NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def e4m3_value(byte: int) -> float:
    """An OCP float8 E4M3 (fn) byte: sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal, S.1111.111 is NaN (no infinities)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0**-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


def e2m1_value(nibble: int) -> float:
    """An OCP FP4 E2M1 nibble: sign bit 3, 2 exponent bits (bias 1), 1 mantissa bit; exponent
    0 is subnormal (0 or 0.5)."""
    sign = -1.0 if nibble & 0x8 else 1.0
    exponent, mantissa = (nibble >> 1) & 0x3, nibble & 0x1
    if exponent == 0:
        return sign * mantissa * 0.5
    return sign * (1.0 + mantissa / 2.0) * 2.0 ** (exponent - 1)


def e8m0_value(byte: int) -> float:
    """An E8M0 scale byte: ``2 ** (byte - 127)``; 255 is NaN."""
    return float("nan") if byte == 255 else 2.0 ** (byte - 127)


_E4M3 = np.array([e4m3_value(b) for b in range(256)], dtype=np.float64)
_E2M1 = np.array([e2m1_value(n) for n in range(16)], dtype=np.float64)
_E8M0 = np.array([e8m0_value(b) for b in range(256)], dtype=np.float64)


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy().astype(np.int64)


def fp4_codes_f64(packed: torch.Tensor) -> np.ndarray:
    """uint8 (..., in/2) -> float64 (..., in): even columns from the low nibbles."""
    raw = _raw_bytes(packed)
    out = np.empty(raw.shape[:-1] + (raw.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = _E2M1[raw & 0xF]
    out[..., 1::2] = _E2M1[raw >> 4]
    return out


def fp8_codes_f64(codes: torch.Tensor) -> np.ndarray:
    return _E4M3[_raw_bytes(codes)]


def _per_element(blocks: np.ndarray, in_features: int, width: int) -> np.ndarray:
    """(..., ceil(in / width)) block values -> (..., in): element i takes block i // width."""
    return blocks[..., np.arange(in_features) // width]


def to_torch_f32(values: np.ndarray) -> torch.Tensor:
    """float64 values (exact products) -> f32, one IEEE rounding (numpy's cast)."""
    return torch.from_numpy(values.astype(np.float32))


def dequantize_mx_f32(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    dual_scale: torch.Tensor | None = None,
    dual_block: int | None = None,
) -> torch.Tensor:
    """fp32 MX weight: ``code * 2**(byte - 127)`` per 32 inputs, times ``dual`` per
    ``dual_block`` inputs for W4A4_MXFP4_DUALSCALE (msmodelslim's order: (fp4 * 2**e) * dual).
    ``weight`` is float8_e4m3fn (MXFP8) or uint8 packed fp4."""
    codes = fp4_codes_f64(weight) if weight.dtype == torch.uint8 else fp8_codes_f64(weight)
    in_features = codes.shape[-1]
    exponents = _E8M0[_raw_bytes(weight_scale)]
    w = codes * _per_element(exponents, in_features, MX_BLOCK)
    if dual_scale is not None:
        dual = dual_scale.float().numpy().astype(np.float64).reshape(*codes.shape[:-1], -1)
        w = w * _per_element(dual, in_features, dual_block or in_features)
    return to_torch_f32(w)


def dequantize_affine_loops(
    q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None
) -> torch.Tensor:
    """fp32 ``(q - offset) * scale`` element by element (python loops: small tensors only);
    ``scale``/``offset`` (out, 1) per channel or (out, in/G) per group along ``in``.
    ``q`` int8 codes or float8_e4m3fn codes (decoded from their bits)."""
    rows, cols = q.shape
    codes = fp8_codes_f64(q) if q.dtype == torch.float8_e4m3fn else q.numpy().astype(np.float64)
    s = scale.float().reshape(rows, -1).numpy()
    o = None if offset is None else offset.float().reshape(rows, -1).numpy()
    width = cols // s.shape[1]
    out = np.empty((rows, cols), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            g = c // width
            shifted = np.float32(codes[r, c]) - (np.float32(0) if o is None else o[r, g])
            out[r, c] = np.float32(shifted) * s[r, g]
    return torch.from_numpy(out)


def pack_fp4(values: torch.Tensor) -> torch.Tensor:
    """msmodelslim's ``pack_fp4_to_uint8`` re-written: each value's nearest e2m1 magnitude
    (its index 0..7), bit 3 the sign (``signbit``: -0.0 is 8), row-major pairs with the first
    in the low nibble; (m, n) -> uint8 (m, n/2)."""
    flat = values.float().reshape(-1)
    magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    index = (flat.abs()[:, None] - magnitudes).abs().argmin(dim=1)
    nibble = index + (torch.signbit(flat).to(torch.long) << 3)
    pairs = nibble.reshape(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8).reshape(*values.shape[:-1], -1)


def quantize_mx(w: torch.Tensor, fp4: bool) -> dict[str, torch.Tensor]:
    """msmodelslim's per-block MX quantizer (``ir/api/impl/mx_quantization.py``), re-written for
    one 2-D weight, blocks of 32 along ``in`` (the last one padded): returns the saver's
    ``weight`` (float8_e4m3fn, or packed fp4 uint8) and ``weight_scale`` (E8M0 + 127, uint8).

    MXFP8: ``e = floor(log2(amax)) - 8``, clamped to [-127, 127], ``q = e4m3(w / 2**e)``
    (the tool rounds to 3 mantissa bits with its own RTN; e4m3's cast rounds to nearest even,
    which only differs on ties). MXFP4: ``e = floor(log2(amax / 0.875 + 9.6e-7)) - 2``,
    ``q = e2m1(w / 2**e)`` with round-half-up on the mantissa."""
    w = w.float()
    rows, cols = w.shape
    blocks = -(-cols // MX_BLOCK)
    padded = torch.zeros(rows, blocks * MX_BLOCK)
    padded[:, :cols] = w
    amax = padded.reshape(rows, blocks, MX_BLOCK).abs().amax(-1, keepdim=True)
    if fp4:
        e = torch.floor(torch.log2(amax / 0.875 + 9.6e-7)) - 2
        e = e.clamp(-127, 125)
        x = padded.reshape(rows, blocks, MX_BLOCK) / torch.exp2(e)
        private = torch.floor(torch.log2(x.abs() + 9.6e-7)).clamp(0, 2)
        mant = torch.floor(x.abs() / torch.exp2(private) * 2 + 0.5) / 2 * torch.exp2(private)
        q = (torch.sign(x) * mant.clamp(max=6.0)).reshape(rows, -1)[:, :cols]
        weight = pack_fp4(q)
    else:
        e = torch.floor(torch.log2(amax + (amax == 0).float() * 2.0**-126)) - 8
        e = e.clamp(-127, 127)
        x = padded.reshape(rows, blocks, MX_BLOCK) / torch.exp2(e)
        weight = x.clamp(-448, 448).reshape(rows, -1)[:, :cols].to(torch.float8_e4m3fn)
    return {"weight": weight, "weight_scale": (e.squeeze(-1) + 127).to(torch.uint8)}
