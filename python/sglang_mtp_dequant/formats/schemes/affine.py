"""The arithmetic: ``w = (q - offset) * scale`` in fp32, rounded once to the draft's dtype.

Usage::

    w = dequantize(codes_2d, scale, offset, group_width=in_features, dtype=torch.bfloat16)
    decoder = AffineDecoder("mtp.fc.weight", "/ckpt/x.safetensors", (out, in), scale, None)
    w = decoder.decompress(codes, torch.bfloat16)

``dequantize`` is the one pure function every scheme ends in; ``AffineDecoder`` holds what one
weight needs (checked fp32 scale and offset, how to unpack, its shape) and calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...errors import DraftWeightError

#: elements of the reused fp32 buffer rows are decoded through (``bench_dequant.py --variants``)
BLOCK_ELEMENTS = 1 << 18


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_width: int,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(codes - offset) * scale`` for a 2-D ``codes`` (rows, in), rounded once to ``dtype``
    (into ``out``, allocated when None). ``scale`` / ``offset`` (None: zero) are fp32 (rows,
    groups), group ``g`` covering columns ``[g * group_width, (g + 1) * group_width)``, the last
    maybe shorter. Eager torch over blocks of rows in one reused fp32 buffer: nothing measured
    faster is as plain (``bench_dequant.py --floor``)."""
    rows, in_features = codes.shape
    if out is None:
        out = torch.empty((rows, in_features), dtype=dtype)
    if rows == 0:
        return out
    groups = scale.shape[1]
    full = min(groups, in_features // group_width) if group_width else 0
    step = max(1, BLOCK_ELEMENTS // max(1, in_features))
    direct = dtype == torch.float32
    buffer: torch.Tensor | None = None
    if not direct:
        flat = torch.empty(max(BLOCK_ELEMENTS, in_features), dtype=torch.float32)
        buffer = flat[: min(step, rows) * in_features].view(-1, in_features)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        target = out[r0:r1]
        if buffer is None:
            work = target
        else:
            work = buffer if r1 - r0 == len(buffer) else buffer[: r1 - r0]
        work.copy_(codes[r0:r1])
        shift = None if offset is None else offset[r0:r1]
        _affine_in_place(work, scale[r0:r1], shift, full, group_width)
        if buffer is not None:
            target.copy_(work)  # the one rounding, to the draft's dtype
    return out


def _affine_in_place(
    work: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    full: int,
    width: int,
) -> None:
    """``work = (work - offset) * scale``: ``full`` groups of ``width`` columns, then the rest."""
    rows = work.shape[0]
    groups = scale.shape[1]
    if groups == 1 and full * width == work.shape[1]:  # per channel: a plain row broadcast
        if offset is not None:
            work.sub_(offset)
        work.mul_(scale)
        return
    if full:
        grouped = work[:, : full * width].view(rows, full, width)
        if offset is not None:
            grouped.sub_(offset[:, :full, None])
        grouped.mul_(scale[:, :full, None])
    if full < groups:  # the ragged last group
        tail = work[:, full * width :]
        if offset is not None:
            tail.sub_(offset[:, full:])
        tail.mul_(scale[:, full:])


@dataclass(frozen=True)
class AffineDecoder:
    """One weight's decoding: ``scale``/``offset`` fp32 (rows, groups) (``offset`` None when
    all zero), ``unpack`` one code per weight from the stored codes, ``shape`` the weight's."""

    tensor: str
    file: str
    shape: tuple[int, ...]
    scale: torch.Tensor
    offset: torch.Tensor | None
    unpack: Callable[[torch.Tensor], torch.Tensor] | None = None
    group_width: int = 0  # 0: in_features / groups (exact groups)

    @property
    def width(self) -> int:
        return self.group_width or self.shape[-1] // self.scale.shape[1]

    def decompress(
        self, codes: torch.Tensor, dtype: torch.dtype, only: Sequence[int] | None = None
    ) -> torch.Tensor:
        """The float weight, rounded once to ``dtype``; ``only``: the experts of fused experts to
        decode (the others NaN: sglang drops them on this rank, the guard refuses any kept)."""
        if codes.is_meta:  # a dry run (the doctor): shapes only
            return torch.empty(self.shape, dtype=dtype, device="meta")
        q = self.unpack(codes) if self.unpack is not None else codes
        if tuple(q.shape) != self.shape:
            raise self._shape_error(codes)
        in_features = self.shape[-1]
        rows = q.numel() // in_features if in_features else 0
        flat = q.reshape(rows, in_features)
        if only is None or len(self.shape) < 3:
            return dequantize(flat, self.scale, self.offset, self.width, dtype).view(self.shape)
        out = torch.full(self.shape, float("nan"), dtype=dtype)
        per_expert = rows // self.shape[0]
        for e in only:
            r0, r1 = e * per_expert, (e + 1) * per_expert
            offset = None if self.offset is None else self.offset[r0:r1]
            target = out[e].view(per_expert, in_features)
            dequantize(flat[r0:r1], self.scale[r0:r1], offset, self.width, dtype, out=target)
        return out

    def _shape_error(self, codes: torch.Tensor) -> DraftWeightError:
        return DraftWeightError(
            tensor=self.tensor,
            file=self.file,
            problem=f"streamed with shape {list(codes.shape)}, its header said otherwise",
            hint="the file changed while sglang was loading it; restart the server",
        )
