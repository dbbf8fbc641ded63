"""An independent dequantizer: the float weight of a checkpoint tensor, from the format notes.

Usage::

    w = independent_dequantize(tensors, "mtp.layers.0.mlp.up_proj.weight", "W8A8_DYNAMIC", "1.0.0")
    # fp32 (out, in), or None for a layout this module has no rule for

It shares no arithmetic with ``schemes/``: whatever the plugin computes is compared against
these straightforward whole-tensor fp32 formulas, written from ModelSlim's format (msmodelslim
26.1.0's savers) and the FP8 checkpoints' convention:

- W8A8_DYNAMIC / W8A16 / V0 static with ``weight_scale``: ``(q - offset) * scale``
- static W8A8 V1: ``q * deq_scale / input_scale`` (an int64 ``deq_scale`` holds f32 bits)
- W4A8_DYNAMIC: int4 pairs along ``out`` (``byte = (even & 0xF) | (odd << 4)``), ``q * scale``,
  two-stage ``(q * weight_scale_second) * weight_scale``
- W4A16: pairs along ``in`` per channel (version 1.0.0), along ``out`` per group,
  ``(q - offset) * scale``
- float8 with ``weight_scale_inv`` (one per 128 x 128 block, power-of-two blocks) or
  ``weight_scale`` (per tensor or channel): ``q * scale``
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...formats import naming


def _expand(values: torch.Tensor, rows: int, cols: int) -> torch.Tensor | None:
    """(rows,), (rows, 1), (rows, cols/G) or one value -> fp32 (rows, cols) by repetition."""
    values = values.float()
    if values.numel() == 1:
        return values.reshape(1, 1).expand(rows, cols)
    if values.numel() % rows:
        return None
    values = values.reshape(rows, -1)
    if cols % values.shape[1]:
        return None
    return values.repeat_interleave(cols // values.shape[1], dim=1)


def _nibbles(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) nibbles of int8 bytes as signed int16, by masking and re-centring."""
    byte = packed.to(torch.int16) & 0xFF
    low, high = byte & 0xF, (byte >> 4) & 0xF
    return torch.where(low >= 8, low - 16, low), torch.where(high >= 8, high - 16, high)


def _interleave(low: torch.Tensor, high: torch.Tensor, axis: int) -> torch.Tensor:
    """Even positions from ``low``, odd from ``high``, along ``axis`` (0 rows, 1 columns)."""
    shape = list(low.shape)
    shape[axis] *= 2
    out = torch.empty(shape, dtype=torch.int16)
    if axis == 0:
        out[0::2], out[1::2] = low, high
    else:
        out[:, 0::2], out[:, 1::2] = low, high
    return out


def independent_dequantize(
    tensors: Mapping[str, torch.Tensor], name: str, described: str | None, version: str | None
) -> torch.Tensor | None:
    """fp32 weight of checkpoint tensor ``name`` from its raw companions in ``tensors``, or
    None where this module has no rule (3-D fused-expert tensors, unknown layouts)."""
    q = tensors[name]
    if q.dim() != 2:
        return None
    companion = {
        suffix: tensors[n]
        for suffix, names in naming.companion_names(name).items()
        for n in names
        if n in tensors
    }
    scale = companion.get("weight_scale")
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _float8(q, companion)
    if q.dtype != torch.int8:
        return None
    if described in ("W4A8_DYNAMIC", "W4A16"):
        if scale is None:
            return None
        unpacked = _int4_codes(q, scale, described, version)
        if unpacked is None:
            return None
        q = unpacked
        second = companion.get("weight_scale_second")
        if second is not None:
            s2, s = _expand(second, *q.shape), _expand(scale, *q.shape)
            return None if s2 is None or s is None else (q.float() * s2) * s
    rows, cols = q.shape
    if scale is not None:
        s = _expand(scale, rows, cols)
        offset = companion.get("weight_offset")
        o = _expand(offset, rows, cols) if offset is not None else torch.zeros(rows, cols)
        return None if s is None or o is None else (q.float() - o) * s
    deq, input_scale = companion.get("deq_scale"), companion.get("input_scale")
    if deq is None or input_scale is None or input_scale.numel() != 1:
        return None
    if deq.dtype == torch.int64:
        deq = (deq & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    s = _expand(deq.float() / input_scale.float().reshape(()), rows, cols)
    return None if s is None else q.float() * s


def _int4_codes(
    q: torch.Tensor, scale: torch.Tensor, described: str, version: str | None
) -> torch.Tensor | None:
    out_features = scale.shape[0]
    if q.shape[0] * 2 == out_features:  # pairs along out (W4A8 V1, W4A16 per group)
        return _interleave(*_nibbles(q), axis=0)
    if q.shape[0] != out_features:
        return None
    per_group = scale.dim() == 2 and scale.shape[1] > 1
    if described == "W4A16" and version == "1.0.0" and not per_group:
        return _interleave(*_nibbles(q), axis=1)  # pairs along in
    return q.to(torch.int16)  # legacy: one code per byte


def _float8(q: torch.Tensor, companion: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    rows, cols = q.shape
    block_scale = companion.get("weight_scale_inv")
    if block_scale is not None and block_scale.dim() == 2:
        br, bc = (
            _power_of_two_block(rows, block_scale.shape[0]),
            _power_of_two_block(cols, block_scale.shape[1]),
        )
        if br is None or bc is None:
            return None
        full = block_scale.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return q.float() * full[:rows, :cols]
    scale = companion.get("weight_scale")
    s = _expand(scale, rows, cols) if scale is not None else None
    return None if s is None else q.float() * s


def _power_of_two_block(length: int, blocks: int) -> int | None:
    for size in (2**k for k in range(16)):
        if -(-length // size) == blocks and (blocks == 1 or size < length):
            return size
    return None
