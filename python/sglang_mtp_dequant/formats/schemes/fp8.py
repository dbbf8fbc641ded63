"""float8 draft weights: block-scaled (``weight_scale_inv``), per-tensor/per-channel scaled, and
ModelSlim's WFP8AFP8_DYNAMIC (MXFP8 is in ``mx.py``); all ``w = q * scale``.

Usage::

    scheme = scheme_for("FP8_BLOCK")
    decoder = scheme.prepare(info, {"weight_scale_inv": s}, group_size=0)
    w = decoder.decompress(fp8_codes, torch.bfloat16)        # fp8 * scale, one rounding

The first two (DeepSeek-V3/GLM FP8's 128 x 128 blocks, other FP8 exports) are recognised by
dtype and companion, no description naming them.
"""

from __future__ import annotations

import math

import torch

from ...errors import DraftWeightError
from ..checkpoint import FLOAT8_DTYPES, TensorInfo
from .affine import AffineDecoder
from .base import (
    FLOAT_STORAGE,
    Scheme,
    Values,
    block_size_for,
    finite,
    positive,
    refused,
    register_scheme,
    scale_groups,
)

REEXPORT_FP8 = (
    "re-export the draft as bf16, or serve it quantized (--speculative-draft-model-"
    "quantization fp8)"
)


@register_scheme
class BlockFp8(Scheme):
    """float8 codes with one ``weight_scale_inv`` per block of rows x columns."""

    types = ("FP8_BLOCK",)
    companions = {"weight_scale_inv": FLOAT_STORAGE}
    code_dtypes = FLOAT8_DTYPES

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return weight.dtype in FLOAT8_DTYPES and "weight_scale_inv" in suffixes

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = weight.shape
        scale = values.get("weight_scale_inv")
        if scale is None or scale.dim() != len(shape) or tuple(scale.shape[:-2]) != shape[:-2]:
            raise _block_error(weight, scale, "expected one value per block of the last two dims")
        out, in_features = shape[-2:]
        block_rows = block_size_for(out, scale.shape[-2])
        block_cols = block_size_for(in_features, scale.shape[-1])
        if block_rows is None or block_cols is None:
            raise _block_error(weight, scale, "no power-of-two block size fits both dimensions")
        per_row = scale.to(torch.float32).repeat_interleave(block_rows, dim=-2)[..., :out, :]
        rows = math.prod(shape[:-1])
        scale_rows = positive(
            weight,
            finite(weight, per_row.reshape(rows, scale.shape[-1]), "weight_scale_inv"),
            "weight_scale_inv",
        )
        return AffineDecoder(
            weight.name, weight.file, shape, scale_rows.contiguous(), None, group_width=block_cols
        )


@register_scheme
class ScaledFp8(Scheme):
    """float8 codes with one ``weight_scale`` per tensor or per output channel."""

    types = ("FP8",)
    companions = {"weight_scale": FLOAT_STORAGE}
    code_dtypes = FLOAT8_DTYPES

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return (
            weight.dtype in FLOAT8_DTYPES
            and "weight_scale" in suffixes
            and "weight_scale_inv" not in suffixes
        )

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = weight.shape
        raw = values.get("weight_scale")
        if raw is None:
            raise _block_error(weight, raw, "no weight_scale")
        if raw.numel() == 1:  # per tensor
            raw = raw.reshape(1).expand(math.prod(shape[:-1]))
        scale = scale_groups(weight, shape, raw, "weight_scale", group_size)
        return AffineDecoder(weight.name, weight.file, shape, scale.contiguous(), None)


@register_scheme
class Wfp8Afp8Dynamic(Scheme):
    """WFP8AFP8_DYNAMIC (ModelSlim): float8_e4m3fn codes (out, in), ``weight_scale`` f32 per
    output channel; a nonzero ``weight_offset`` is refused (the saver writes zeros)."""

    types = ("WFP8AFP8_DYNAMIC",)
    companions = {"weight_scale": FLOAT_STORAGE, "weight_offset": FLOAT_STORAGE}
    code_dtypes = (torch.float8_e4m3fn,)

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = weight.shape
        raw = values.get("weight_scale")
        if raw is None:
            raise _block_error(weight, raw, "no weight_scale")
        if tuple(raw.shape) not in (shape[:-1], (*shape[:-1], 1)):
            raise _block_error(
                weight, raw, f"WFP8AFP8_DYNAMIC is per channel: expected {list(shape[:-1])} + [1]"
            )
        offset = values.get("weight_offset")
        if offset is not None and bool(offset.to(torch.float32).any()):
            raise refused(
                weight,
                (
                    "WFP8AFP8_DYNAMIC with a nonzero weight_offset (max |offset| "
                    f"{offset.to(torch.float32).abs().max().item():.6g}): msmodelslim writes "
                    "this scheme symmetric and no known reader applies the offset, so its "
                    "meaning is unknown"
                ),
                REEXPORT_FP8,
            )
        scale = scale_groups(weight, shape, raw, "weight_scale", 0)
        return AffineDecoder(weight.name, weight.file, shape, scale.contiguous(), None)


def _block_error(weight: TensorInfo, scale: torch.Tensor | None, why: str) -> DraftWeightError:
    got = "missing" if scale is None else f"of shape {list(scale.shape)}"
    return refused(
        weight,
        (f"is {weight.dtype_name}{list(weight.shape)} codes, and its scale is {got} ({why})"),
        REEXPORT_FP8,
    )
