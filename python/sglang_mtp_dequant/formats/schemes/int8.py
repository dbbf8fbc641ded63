"""The int8 ModelSlim schemes: W8A8_DYNAMIC, W8A16, static W8A8 and W8A8_MIX."""

from __future__ import annotations

import torch

from ..checkpoint import TensorInfo
from .affine import AffineDecoder
from .base import (
    FLOAT_STORAGE,
    Scheme,
    Values,
    per_row_groups,
    positive,
    refused,
    register_scheme,
    require,
    scale_and_offset,
    scale_groups,
)

_INT4_MARKERS = frozenset({"scale_bias", "weight_scale_second"})


@register_scheme
class AffineInt8(Scheme):
    """W8A8_DYNAMIC: int8 codes, ``weight_scale`` and ``weight_offset`` per channel or group
    (symmetric: a missing offset means zero)."""

    types = ("W8A8_DYNAMIC",)
    companions = {"weight_scale": FLOAT_STORAGE, "weight_offset": FLOAT_STORAGE}
    offset_required = False  # a missing weight_offset is an error where offsets carry information

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        # a weight_scale alone decodes the same way under W8A8_DYNAMIC and W8A16
        return weight.is_integer and "weight_scale" in suffixes and not suffixes & _INT4_MARKERS

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = self.logical_shape(weight)
        raw_scale = require(weight, values, "weight_scale", self.name)
        if self.offset_required:
            require(weight, values, "weight_offset", self.name)
        scale, offset = scale_and_offset(weight, shape, raw_scale, values, group_size)
        return AffineDecoder(weight.name, weight.file, shape, scale, offset)


@register_scheme
class AsymmetricInt8(AffineInt8):
    """W8A16: as W8A8_DYNAMIC, but asymmetric: the offsets are nonzero, so one that is missing
    would decode every weight shifted, and is an error instead."""

    types = ("W8A16",)
    offset_required = True

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return False  # indistinguishable from W8A8_DYNAMIC without the description


@register_scheme
class StaticInt8(Scheme):
    """W8A8 (static activations) and W8A8_MIX: V1's weight scale is ``deq_scale /
    input_scale`` (``deq_scale`` f32, or its bits widened to int64); V0's ``weight_scale`` /
    ``weight_offset`` are used as they are. ``quant_bias``, ``input_offset``: the GEMM's."""

    types = ("W8A8", "W8A8_MIX")
    companions = {
        "weight_scale": FLOAT_STORAGE,
        "weight_offset": FLOAT_STORAGE,
        "deq_scale": (torch.float32, torch.int64),
        "input_scale": FLOAT_STORAGE,
    }

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return weight.is_integer and "deq_scale" in suffixes and "weight_scale" not in suffixes

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = self.logical_shape(weight)
        if "weight_scale" in values:
            scale, offset = scale_and_offset(
                weight, shape, values["weight_scale"], values, group_size
            )
            return AffineDecoder(weight.name, weight.file, shape, scale, offset)
        deq_scale = float32_bits(weight, require(weight, values, "deq_scale", "W8A8"))
        input_scale = require(weight, values, "input_scale", "W8A8").to(torch.float32)
        if input_scale.numel() != 1:
            raise refused(
                weight, f"input_scale has shape {list(input_scale.shape)}, expected one value"
            )
        input_scale = scale_groups(weight, (1, 1), input_scale, "input_scale", 0)
        deq = per_row_groups(weight, shape, deq_scale, "deq_scale", group_size)
        scale = positive(weight, deq / input_scale.reshape(()), "deq_scale / input_scale")
        return AffineDecoder(weight.name, weight.file, shape, scale, None)


def float32_bits(weight: TensorInfo, deq_scale: torch.Tensor) -> torch.Tensor:
    """``deq_scale`` as f32: int64 storage holds the f32 bit pattern in its low 32 bits."""
    if deq_scale.dtype == torch.int64:
        if bool(((deq_scale < 0) | (deq_scale > 0xFFFFFFFF)).any()):
            raise refused(
                weight, "int64 deq_scale holds values wider than 32 bits: not an f32 bit pattern"
            )
        return (deq_scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    return deq_scale.to(torch.float32)
