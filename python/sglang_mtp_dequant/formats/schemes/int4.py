"""The int4 ModelSlim schemes: W4A8_DYNAMIC (V1 packed, V0 two-stage, legacy), W4A16 and
W4A4_DYNAMIC.

Usage::

    scheme = scheme_for("W4A8_DYNAMIC")
    decoder = scheme.prepare(info, {"weight_scale": s, "weight_offset": o}, group_size=0)
    w = decoder.decompress(packed_int8, torch.bfloat16)     # (out, in) from (out/2, in)

int4 codes travel two to an int8 byte or one a byte; the scale's shape, else the description's
``version``, decides the axis (docs/layouts.md, "int4 packing").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import DraftWeightError
from ..checkpoint import TensorInfo
from .affine import AffineDecoder
from .base import (
    FLOAT_STORAGE,
    REEXPORT,
    Scheme,
    Values,
    refused,
    register_scheme,
    require,
    scale_and_offset,
    scale_groups,
)

#: the ``version`` msmodelslim's ascendv1 savers write; weights are packed two codes a byte
PACKED_VERSION = "1.0.0"

INT4_MIN, INT4_MAX = -8, 7

OUT_AXIS, IN_AXIS = -2, -1


def unpack_int4(codes: torch.Tensor, axis: int) -> torch.Tensor:
    """int8 bytes holding two int4 codes -> one int8 per code, pairs along ``axis`` (-2 rows,
    -1 columns), the low nibble first, both sign-extended."""
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(codes, 4), 4)
    high = torch.bitwise_right_shift(codes, 4)
    shape = list(codes.shape)
    shape[axis] *= 2
    return torch.stack((low, high), dim=axis).reshape(shape)


@dataclass(frozen=True)
class _PackedCodes:
    """``AffineDecoder.unpack`` for packed codes."""

    axis: int

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        return unpack_int4(codes, self.axis)


@dataclass(frozen=True)
class _OneCodePerByte:
    """``AffineDecoder.unpack`` for unpacked int4: checks the codes really are int4 (a packed
    tensor's bytes almost surely leave the range)."""

    tensor: str
    file: str
    why: str  # what made the plan read the weight as one code per byte
    hint: str = ""  # what to do instead of the default (restore the description's version)

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.numel() and (int(codes.min()) < INT4_MIN or int(codes.max()) > INT4_MAX):
            raise DraftWeightError(
                tensor=self.tensor,
                file=self.file,
                problem=(
                    f"is read as one int4 code per byte ({self.why}), but holds values in "
                    f"[{int(codes.min())}, {int(codes.max())}], outside int4"
                ),
                hint=self.hint
                or (
                    "the weight is packed two codes a byte: restore the description's "
                    f'"version": "{PACKED_VERSION}", or re-export the checkpoint'
                ),
            )
        return codes


@dataclass(frozen=True)
class _TwoStageCodes:
    """Unpacked int4 codes times the integer second-stage scale, exact in int16: msmodelslim's
    ``(q * scale_second) * weight_scale`` then rounds once, in fp32."""

    inner: _PackedCodes | _OneCodePerByte
    second: torch.Tensor  # int16 (rows, groups)

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        q = self.inner(codes)
        shape = q.shape
        rows, groups = self.second.shape
        work = q.to(torch.int16).reshape(rows, groups, shape[-1] // groups)
        work.mul_(self.second[:, :, None])
        return work.reshape(shape)


def _out_features(weight: TensorInfo, scale: torch.Tensor, scheme: str) -> int:
    """The logical output size, from the per-channel/per-group scale's row count."""
    lead, ndim = weight.shape[:-2], len(weight.shape)
    shape = tuple(scale.shape)
    if len(shape) == ndim and shape[:-2] == lead:  # (..., out, 1) or (..., out, in/G)
        return shape[-2]
    if len(shape) == ndim - 1 and shape[:-1] == lead:  # (..., out)
        return shape[-1]
    raise refused(
        weight,
        (
            f"{scheme} weight_scale has shape {list(shape)}, which gives no output size for a "
            f"packed weight of shape {list(weight.shape)} (expected {list(lead)} + [out, 1])"
        ),
    )


def _layout_error(weight: TensorInfo, scheme: str, out: int, why: str) -> DraftWeightError:
    return refused(
        weight,
        (
            f"{scheme} weight of shape {list(weight.shape)} fits no int4 layout for "
            f"{out} output channels ({why})"
        ),
    )


def _require_zero(weight: TensorInfo, companions: Values, suffix: str) -> None:
    values = companions.get(suffix)
    if values is None or not bool(values.any()):
        return
    raise refused(
        weight,
        (
            f"W4A8_DYNAMIC with a nonzero {suffix} (max |offset| "
            f"{values.abs().max().item():.6g}): msmodelslim writes this scheme symmetric and "
            "no known reader applies the offset, so its meaning is unknown"
        ),
    )


@register_scheme
class W4A8Dynamic(Scheme):
    """W4A8_DYNAMIC: int4 ``w = q * weight_scale`` per output channel, or two-stage ``w = (q *
    weight_scale_second) * weight_scale`` (``scale_bias``, a GEMM correction, consumed);
    symmetric: a nonzero ``weight_offset`` / ``weight_offset_second`` is refused."""

    types = ("W4A8_DYNAMIC",)
    companions = {
        "weight_scale": FLOAT_STORAGE,
        "weight_offset": FLOAT_STORAGE,
        "weight_scale_second": FLOAT_STORAGE,
        "weight_offset_second": (torch.int64, *FLOAT_STORAGE),
    }

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        # scale_bias and weight_scale_second exist only beside W4A8_DYNAMIC int4 codes
        return weight.is_integer and bool(suffixes & {"scale_bias", "weight_scale_second"})

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        raw_scale = require(weight, values, "weight_scale", self.types[0])
        out = _out_features(weight, raw_scale, self.types[0])
        rows, cols = weight.shape[-2:]
        inner: _PackedCodes | _OneCodePerByte
        if rows * 2 == out:
            inner = _PackedCodes(OUT_AXIS)
        elif rows == out:
            inner = _OneCodePerByte(weight.name, weight.file, f"{rows} rows for {out} channels")
        else:
            raise _layout_error(weight, self.types[0], out, "expected out/2 or out rows")
        shape = (*weight.shape[:-2], out, cols)
        _require_zero(weight, values, "weight_offset")
        _require_zero(weight, values, "weight_offset_second")
        scale = scale_groups(weight, shape, raw_scale, "weight_scale", group_size)
        if "weight_scale_second" not in values:
            return AffineDecoder(weight.name, weight.file, shape, scale, None, inner)
        if scale.shape[1] != 1:
            raise refused(
                weight, "has weight_scale_second, but its weight_scale is not per channel"
            )
        raw_second = values["weight_scale_second"]
        second = scale_groups(weight, shape, raw_second, "weight_scale_second", group_size)
        if _exact_in_int16(second):
            unpack = _TwoStageCodes(inner, second.to(torch.int16))
            return AffineDecoder(weight.name, weight.file, shape, scale, None, unpack)
        # not msmodelslim's integer second stage: fold the scales (one extra fp32 rounding)
        return AffineDecoder(weight.name, weight.file, shape, scale * second, None, inner)


def _exact_in_int16(second: torch.Tensor) -> bool:
    """Whether ``q * second`` (|q| <= 8) is exact in int16 for every group."""
    return bool((second == second.round()).all()) and float(second.max()) * 8 < 2**15


@register_scheme
class W4A16Int4(Scheme):
    """W4A16: ``w = (q - weight_offset) * weight_scale``, asymmetric; codes pair along ``in``
    per channel (only there the description's ``version`` tells packed from not), along ``out``
    per group."""

    types = ("W4A16",)
    companions = {"weight_scale": FLOAT_STORAGE, "weight_offset": FLOAT_STORAGE}

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        raw_scale = require(weight, values, "weight_scale", self.types[0])
        out = _out_features(weight, raw_scale, self.types[0])
        per_group = raw_scale.ndim == len(weight.shape) and raw_scale.shape[-1] > 1
        packed = format_version == PACKED_VERSION
        rows, cols = weight.shape[-2:]
        inner: _PackedCodes | _OneCodePerByte
        if rows * 2 == out:
            inner, logical = _PackedCodes(OUT_AXIS), (out, cols)
        elif rows != out:
            raise _layout_error(weight, self.types[0], out, "expected out or out/2 rows")
        elif packed and not per_group:
            inner, logical = _PackedCodes(IN_AXIS), (out, cols * 2)
        elif packed:
            raise _layout_error(
                weight, self.types[0], out, "per-group W4A16 of version 1.0.0 packs along out"
            )
        else:
            why = f"quant_model_description.json has no 'version': '{PACKED_VERSION}'"
            inner, logical = _OneCodePerByte(weight.name, weight.file, why), (out, cols)
        shape = (*weight.shape[:-2], *logical)
        scale, offset = scale_and_offset(weight, shape, raw_scale, values, group_size)
        return AffineDecoder(weight.name, weight.file, shape, scale, offset, inner)


@register_scheme
class W4A4Dynamic(Scheme):
    """W4A4_DYNAMIC: ``w = (q - weight_offset) * weight_scale``, one code per int8 byte (out,
    in), scales per channel or group; a missing offset, or the (out/2, in) layout (nibble order
    undefined), is refused."""

    types = ("W4A4_DYNAMIC",)
    companions = {"weight_scale": FLOAT_STORAGE, "weight_offset": FLOAT_STORAGE}

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        raw_scale = require(weight, values, "weight_scale", self.types[0])
        require(weight, values, "weight_offset", self.types[0])
        out = _out_features(weight, raw_scale, self.types[0])
        if weight.shape[-2] != out:
            raise _layout_error(
                weight,
                self.types[0],
                out,
                "msmodelslim 26.1.0 stores W4A4_DYNAMIC one code per int8 byte, (out, in)",
            )
        why = "W4A4_DYNAMIC is stored one code per int8 byte"
        hint = f"the checkpoint is corrupt or not msmodelslim's W4A4_DYNAMIC: {REEXPORT}"
        unpack = _OneCodePerByte(weight.name, weight.file, why, hint)
        scale, offset = scale_and_offset(weight, weight.shape, raw_scale, values, group_size)
        return AffineDecoder(weight.name, weight.file, weight.shape, scale, offset, unpack)
