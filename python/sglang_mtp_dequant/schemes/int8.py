"""The int8 ModelSlim schemes: W8A8_DYNAMIC, W8A16, static W8A8 and W8A8_MIX."""

from __future__ import annotations

import torch

from ..checkpoint import TensorInfo
from ..errors import DraftWeightError
from .base import (
    REEXPORT,
    AffineDecoder,
    Scheme,
    per_row_groups,
    positive,
    require,
    scale_and_offset,
)


class AffineInt8(Scheme):
    """W8A8_DYNAMIC: int8 codes, ``weight_scale`` and ``weight_offset``.

    Per channel (out, 1) or per group (out, in/G). The scheme is symmetric (msmodelslim writes
    zero offsets), so a missing ``weight_offset`` means zero.
    """

    types = ("W8A8_DYNAMIC",)
    reads = ("weight_scale", "weight_offset")
    #: whether a missing weight_offset is an error (it is where offsets carry information)
    offset_required = False

    def prepare(self, weight, companions, group_size, format_version=None):
        self._check_storage(weight, (torch.int8,))
        shape = self.logical_shape(weight)
        raw_scale = require(weight, companions, "weight_scale", self.types[0])
        if self.offset_required:
            require(weight, companions, "weight_offset", self.types[0])
        scale, offset = scale_and_offset(weight, shape, raw_scale, companions, group_size)
        return AffineDecoder(weight.name, weight.file, shape, scale, offset)


class AsymmetricInt8(AffineInt8):
    """W8A16: as W8A8_DYNAMIC, but asymmetric: the offsets are nonzero, so one that is missing
    would decode every weight shifted, and is an error instead."""

    types = ("W8A16",)
    offset_required = True


class StaticInt8(Scheme):
    """W8A8 (static activations) and W8A8_MIX.

    V1 writes no ``weight_scale``: the weight scale is ``deq_scale / input_scale``, where
    ``deq_scale`` is f32, or the f32 bit pattern widened to int64 (reinterpreted, not cast).
    V0 also writes ``weight_scale``/``weight_offset``, which are then used as they are.
    ``quant_bias`` and ``input_offset`` belong to the int8 GEMM and are dropped.
    """

    types = ("W8A8", "W8A8_MIX")
    reads = ("weight_scale", "weight_offset", "deq_scale", "input_scale")

    def prepare(self, weight, companions, group_size, format_version=None):
        if "weight_scale" in companions:
            return AffineInt8().prepare(weight, companions, group_size)
        self._check_storage(weight, (torch.int8,))
        shape = self.logical_shape(weight)
        deq_scale = float32_bits(weight, require(weight, companions, "deq_scale", "W8A8"))
        input_scale = require(weight, companions, "input_scale", "W8A8").to(torch.float32)
        if input_scale.numel() != 1:
            raise DraftWeightError(
                tensor=weight.name,
                file=weight.file,
                problem=f"input_scale has shape {list(input_scale.shape)}, expected one value",
                hint=REEXPORT,
            )
        input_scale = positive(
            weight, per_row_groups(weight, (1, 1), input_scale, "input_scale", 0), "input_scale"
        )
        deq = per_row_groups(weight, shape, deq_scale, "deq_scale", group_size)
        scale = positive(weight, deq / input_scale.reshape(()), "deq_scale / input_scale")
        return AffineDecoder(weight.name, weight.file, shape, scale, None)


def float32_bits(weight: TensorInfo, deq_scale: torch.Tensor) -> torch.Tensor:
    """``deq_scale`` as f32: int64 storage holds the f32 bit pattern in its low 32 bits."""
    if deq_scale.dtype.is_floating_point:
        return deq_scale.to(torch.float32)
    if deq_scale.dtype == torch.int64:
        if bool(((deq_scale < 0) | (deq_scale > 0xFFFFFFFF)).any()):
            raise DraftWeightError(
                tensor=weight.name,
                file=weight.file,
                problem="int64 deq_scale holds values wider than 32 bits: not an f32 bit pattern",
                hint=REEXPORT,
            )
        return (deq_scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    raise DraftWeightError(
        tensor=weight.name,
        file=weight.file,
        problem=f"deq_scale is {deq_scale.dtype}, expected float32 or int64",
        hint=REEXPORT,
    )
