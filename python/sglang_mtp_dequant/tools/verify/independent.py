"""An independent dequantizer: the float weight of a checkpoint tensor, from the format notes.

Usage::

    w = independent_dequantize(tensors, "mtp.layers.0.mlp.up_proj.weight", "W8A8_DYNAMIC", "1.0.0")
    # fp32 (out, in), or None for a layout this module has no rule for
    reference = reference_stream(weights, plan, companions, dtype, unverifiable)

It shares no arithmetic with ``schemes/``: whatever the plugin computes is compared against
whole-tensor fp32 formulas written from the formats' own descriptions (docs/layouts.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from ...formats import naming
from ...formats.checkpoint import is_code_dtype

if TYPE_CHECKING:
    from ...formats.plan import DequantPlan


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


def int4_nibbles(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    """fp32 weight of checkpoint tensor ``name`` from its raw companions in ``tensors``
    (``described``: its description type or foreign format), or None where this module has no
    rule (3-D fused-expert tensors, unknown layouts)."""
    q = tensors[name]
    if q.dim() != 2:
        return None
    if described in (
        "compressed-tensors pack-quantized",
        "compressed-tensors nvfp4-pack-quantized",
    ):
        return _compressed_tensors_packed(tensors, name)
    if described == "ModelOpt NVFP4":
        return _modelopt_nvfp4(tensors, name)
    companion = {
        suffix: tensors[n]
        for suffix, names in naming.companion_names(name).items()
        for n in names
        if n in tensors
    }
    scale = companion.get("weight_scale")
    if scale is not None and scale.dtype == torch.uint8:
        return _mx(q, scale, companion.get("weight_dual_scale"))
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _float8(q, companion)
    if q.dtype != torch.int8:
        return None
    return _integer(q, companion, described, version)


def _integer(
    q: torch.Tensor, companion: dict[str, torch.Tensor], described: str | None, version: str | None
) -> torch.Tensor | None:
    """int8 codes (int4 pairs unpacked first): ``(q - offset) * scale``, the two-stage int4
    scales, or static W8A8 V1's ``q * deq_scale / input_scale``."""
    scale = companion.get("weight_scale")
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
        return _interleave(*int4_nibbles(q), axis=0)
    if q.shape[0] != out_features:
        return None
    per_group = scale.dim() == 2 and scale.shape[1] > 1
    if described == "W4A16" and version == "1.0.0" and not per_group:
        return _interleave(*int4_nibbles(q), axis=1)  # pairs along in
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


#: e2m1 magnitudes of nibbles 0..7 (bit 3 is the sign): OCP FP4
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _mx(q: torch.Tensor, exponents: torch.Tensor, dual: torch.Tensor | None) -> torch.Tensor | None:
    """An MX weight in float64, rounded to f32 once; None for shapes that fit no rule."""
    if q.dtype == torch.uint8:
        nibbles = torch.stack(((q & 0xF).long(), (q >> 4).long()), dim=-1).reshape(q.shape[0], -1)
        values = _E2M1[nibbles & 0x7] * torch.where(nibbles >= 8, -1.0, 1.0).double()
    elif q.dtype == torch.float8_e4m3fn:
        values = q.double()
    else:
        return None
    rows, cols = values.shape
    blocks = -(-cols // 32)
    if tuple(exponents.shape) != (rows, blocks) or bool((exponents == 255).any()):
        return None
    scale = torch.pow(2.0, exponents.double() - 127).repeat_interleave(32, dim=1)[:, :cols]
    w = values * scale
    if dual is not None:
        dual = dual.double().reshape(rows, -1)
        size = _power_of_two_block(cols, dual.shape[1]) if dual.shape[1] > 1 else cols
        if size is None:
            return None
        w = w * dual.repeat_interleave(size, dim=1)[:, :cols]
    return w.float()


def _compressed_tensors_packed(
    tensors: Mapping[str, torch.Tensor], name: str
) -> torch.Tensor | None:
    """A compressed-tensors ``X.weight_packed`` (4-bit ints in int32, or nvfp4 in uint8)."""
    base = name.rpartition(".")[0]
    packed, scale = tensors[name], tensors.get(f"{base}.weight_scale")
    if scale is None:
        return None
    if packed.dtype == torch.uint8:
        global_scale = tensors.get(f"{base}.weight_global_scale")
        if global_scale is None:
            return None
        q = _e2m1(packed)
        s = _expand(scale.float() / global_scale.float().reshape(()), *q.shape)
        return None if s is None else q * s
    shape = tensors.get(f"{base}.weight_shape")
    if packed.dtype != torch.int32 or shape is None or f"{base}.weight_zero_point" in tensors:
        return None
    words = packed.to(torch.int64) & 0xFFFFFFFF
    codes = torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=-1)
    rows, cols = (int(d) for d in shape.tolist())
    q = codes.reshape(packed.shape[0], -1)[:rows, :cols].float() - 8
    s = _expand(scale, rows, cols)
    return None if s is None else q * s


def _e2m1(packed: torch.Tensor) -> torch.Tensor:
    byte = packed.to(torch.int64)
    nibbles = torch.stack([byte & 0xF, byte >> 4], dim=-1).reshape(packed.shape[0], -1)
    return (_E2M1[nibbles & 0x7] * torch.where(nibbles >= 8, -1.0, 1.0).double()).float()


def _modelopt_nvfp4(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    base = name.rpartition(".")[0]
    scale, scale_2 = tensors.get(f"{base}.weight_scale"), tensors.get(f"{base}.weight_scale_2")
    if tensors[name].dtype != torch.uint8 or scale is None or scale_2 is None:
        return None
    q = _e2m1(tensors[name])
    s = _expand(scale.float() * scale_2.float().reshape(()), *q.shape)
    return None if s is None else q * s


def reference_stream(
    weights: Iterable[tuple[str, torch.Tensor]],
    plan: DequantPlan,
    companions: dict[str, torch.Tensor],
    dtype: torch.dtype,
    unverifiable: set[str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` as the plugin hands them to sglang (``plan``'s companions consumed), each
    weight it decodes decoded here instead, independently, rounded once to ``dtype``; names of
    weights with no rule here go to ``unverifiable``."""
    decode = plan.to_dequantize
    version = plan.checkpoint.format_version
    for name, tensor in weights:
        if name in plan.consumed:
            continue
        entry = decode.get(name)
        if entry is not None and is_code_dtype(tensor.dtype):
            tensors = {name: tensor, **companions}
            expected = independent_dequantize(tensors, name, entry.scheme, version)
            if expected is None:
                unverifiable.add(name)
            else:
                tensor = expected.to(dtype)
                name = entry.output_name
        yield name, tensor
