"""The MX (microscaling) ModelSlim schemes: W8A8_MXFP8, W4A8_MXFP, W4A4_MXFP4 and
W4A4_MXFP4_DUALSCALE.

Usage::

    scheme = scheme_for("W4A4_MXFP4")
    decoder = scheme.prepare(info, {"weight_scale": e8m0_uint8}, group_size=32)
    w = decoder.decompress(packed_uint8, torch.bfloat16)     # (out, in) from (out, in/2)

``w = code * 2 ** (byte - 127)`` (times ``dual``) in fp32, rounded once: the power-of-two scale
is exact, and so is the dual scale times it (refused outside fp32's normal range). The layouts:
docs/layouts.md, "The MX schemes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..checkpoint import TensorInfo
from .affine import AffineDecoder
from .base import (
    FLOAT_STORAGE,
    Scheme,
    Values,
    block_size_for,
    finite,
    refused,
    register_scheme,
    require,
)

#: inputs sharing one E8M0 exponent (the MX block; fixed by the format, ``mx_finfo``)
MX_BLOCK = 32
#: the E8M0 byte that means NaN
E8M0_NAN = 255
#: e2m1 magnitudes by the low three bits of a code; bit 3 is the sign
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: the largest magnitude a normal fp32 holds (2**128 * (1 - 2**-24)) and the smallest
_FP32_MAX, _FP32_MIN_NORMAL = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny


def e8m0_to_float32(stored: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 exponents -> their fp32 values ``2 ** (byte - 127)``, exactly (byte ``b >= 1``
    is the fp32 bits ``b << 23``, byte 0 a subnormal; 255, NaN, is refused before)."""
    bits = stored.to(torch.int32) << 23
    bits = torch.where(stored == 0, torch.full_like(bits, 1 << 22), bits)
    return bits.view(torch.float32)


def _e2m1_bytes() -> torch.Tensor:
    """The 16 e2m1 codes as float8_e4m3fn bit patterns (every e2m1 value is exact in e4m3)."""
    values = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    return values.to(torch.float8_e4m3fn).view(torch.uint8)


_E2M1_AS_E4M3 = _e2m1_bytes()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 (..., in/2), two e2m1 codes a byte (the low nibble the even column) ->
    float8_e4m3fn (..., in) holding their values, exactly."""
    low = torch.bitwise_and(packed, 0x0F).to(torch.int64)
    high = torch.bitwise_right_shift(packed, 4).to(torch.int64)
    codes = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return _E2M1_AS_E4M3[codes].view(torch.float8_e4m3fn)


@dataclass(frozen=True)
class _PackedE2M1:
    """``AffineDecoder.unpack`` for packed fp4 codes."""

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        return unpack_e2m1(codes)


def block_exponents(
    weight: TensorInfo, shape: tuple[int, ...], stored: torch.Tensor, scheme: str
) -> torch.Tensor:
    """The checked fp32 block scales ``2 ** (byte - 127)``, (rows, ceil(in / 32)), one per 32
    inputs (the last block may be shorter; byte 255, E8M0's NaN, refused)."""
    lead, in_features = tuple(shape[:-1]), shape[-1]
    blocks = -(-in_features // MX_BLOCK)
    if tuple(stored.shape) != lead + (blocks,):
        raise refused(
            weight,
            f"{scheme} weight_scale has shape {list(stored.shape)}, but a weight of "
            f"{list(shape)} has {list(lead) + [blocks]} blocks of {MX_BLOCK} inputs "
            f"(one E8M0 exponent each, the last block shorter when {MX_BLOCK} does not divide "
            f"{in_features})",
        )
    if bool((stored == E8M0_NAN).any()):
        raise refused(
            weight,
            f"{scheme} weight_scale holds the byte {E8M0_NAN} (E8M0's NaN) in "
            f"{int((stored == E8M0_NAN).sum())} blocks",
        )
    return e8m0_to_float32(stored).reshape(-1, blocks)


class _MxScheme(Scheme):
    """Codes times one E8M0 exponent per block of 32 inputs."""

    companions = {"weight_scale": (torch.uint8,)}

    def _decoder(
        self,
        weight: TensorInfo,
        values: Values,
        shape: tuple[int, ...],
        unpack: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> AffineDecoder:
        stored = require(weight, values, "weight_scale", self.name)
        scale = block_exponents(weight, shape, stored, self.name)
        return AffineDecoder(
            weight.name, weight.file, shape, scale, None, unpack, group_width=MX_BLOCK
        )


@register_scheme
class Mxfp8(_MxScheme):
    """W8A8_MXFP8: float8_e4m3fn codes (out, in), one E8M0 exponent per 32 inputs."""

    types = ("W8A8_MXFP8",)
    code_dtypes = (torch.float8_e4m3fn,)

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        # scaled FP8's claim too: the scale's storage decides, in ``infer_type``
        return weight.dtype in cls.code_dtypes and "weight_scale" in suffixes

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        return self._decoder(weight, values, weight.shape, None)


@register_scheme
class Mxfp4(_MxScheme):
    """W4A4_MXFP4: e2m1 codes packed two a byte along ``in`` (uint8 (out, in/2)), one E8M0
    exponent per 32 inputs."""

    types = ("W4A4_MXFP4",)
    code_dtypes = (torch.uint8,)

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        # W4A8_MXFP stores and decodes the same way: one claim for both
        return (
            weight.dtype in cls.code_dtypes
            and "weight_scale" in suffixes
            and "weight_dual_scale" not in suffixes
        )

    def logical_shape(self, stored: TensorInfo) -> tuple[int, ...]:
        return (*stored.shape[:-1], stored.shape[-1] * 2)

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        return self._decoder(weight, values, self.logical_shape(weight), _PackedE2M1())


@register_scheme
class Mxfp4W4A8(Mxfp4):
    """W4A8_MXFP: the weights of W4A4_MXFP4 (fp8 activations instead of fp4)."""

    types = ("W4A8_MXFP",)

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return False  # indistinguishable from W4A4_MXFP4 without the description


@register_scheme
class Mxfp4DualScale(Mxfp4):
    """W4A4_MXFP4_DUALSCALE: W4A4_MXFP4 codes and exponents, times an f32 ``weight_dual_scale``
    per block of ``D`` inputs (``D`` a power of two, from the dual scale's shape)."""

    types = ("W4A4_MXFP4_DUALSCALE",)
    companions = {"weight_scale": (torch.uint8,), "weight_dual_scale": FLOAT_STORAGE}

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        return (
            weight.dtype in cls.code_dtypes
            and "weight_scale" in suffixes
            and "weight_dual_scale" in suffixes
        )

    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        shape = self.logical_shape(weight)
        exponents = block_exponents(
            weight, shape, require(weight, values, "weight_scale", self.name), self.name
        )
        dual, dual_block = self._dual(weight, shape, values)
        in_features = shape[-1]
        # one scale per run of inputs inside one MX block and one dual block (powers of two)
        width = min(MX_BLOCK, dual_block)
        starts = torch.arange(0, in_features, width)
        combined = exponents[:, starts // MX_BLOCK] * dual[:, starts // dual_block]
        exact = (combined == 0) | (
            (combined.abs() >= _FP32_MIN_NORMAL) & (combined.abs() <= _FP32_MAX)
        )
        if not bool(exact.all()):
            raise refused(
                weight,
                f"{self.name}: weight_scale times weight_dual_scale leaves fp32's normal range "
                "(the product of the two scales would not be exact)",
            )
        return AffineDecoder(
            weight.name, weight.file, shape, combined, None, _PackedE2M1(), group_width=width
        )

    def _dual(
        self, weight: TensorInfo, shape: tuple[int, ...], values: Values
    ) -> tuple[torch.Tensor, int]:
        """The checked fp32 dual scales (rows, ceil(in / D)) and ``D``, the power of two that
        gives the stored number of dual blocks (the saver does not record it)."""
        raw = require(weight, values, "weight_dual_scale", self.name)
        lead, in_features = tuple(shape[:-1]), shape[-1]
        dims = tuple(raw.shape)
        if dims[-1:] == (1,) and len(dims) == len(shape) + 1:
            dims = dims[:-1]  # (out, ceil(in/D), 1) as the saver writes it
        blocks = dims[-1] if len(dims) == len(shape) and dims[:-1] == lead else 0
        dual_block = block_size_for(in_features, blocks) if blocks else None
        if dual_block is None:
            raise refused(
                weight,
                f"{self.name} weight_dual_scale has shape {list(raw.shape)}, which fits no "
                f"power-of-two dual block for a weight of {list(shape)} (expected "
                f"{list(lead)} + [ceil(in / D), 1])",
            )
        dual = finite(
            weight, raw.to(torch.float32).reshape(-1, blocks), "weight_dual_scale"
        ).contiguous()
        if bool((dual < 0).any()):
            raise refused(
                weight,
                f"{self.name} weight_dual_scale holds negative values (min "
                f"{dual.min().item():.6g}); it is max|w| / 6 of a block",
            )
        return dual, dual_block if blocks > 1 else in_features
