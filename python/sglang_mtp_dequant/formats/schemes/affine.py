"""The arithmetic: ``w = (q - offset) * scale`` in fp32, rounded once to the draft's dtype.

Usage::

    w = dequantize(codes_2d, scale, offset, group_width=in_features, dtype=torch.bfloat16)
    decoder = AffineDecoder("mtp.fc.weight", "/ckpt/x.safetensors", (out, in), scale, None)
    w = decoder.decompress(codes, torch.bfloat16)

``dequantize`` is the one pure function every scheme ends in; ``AffineDecoder`` holds what one
weight needs (its checked fp32 scale and offset, how to unpack its codes, its logical shape) and
calls it. msmodelslim quantized with ``q = clamp(round(w / scale + offset))``; float8 codes
(``q`` already a float) use the same formula with no offset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...errors import DraftWeightError

# Rows are decoded through an fp32 buffer of about this many elements (1 MiB), reused for
# every block of rows, which stays in cache through the three passes: smaller blocks pay
# per-operation overhead, larger ones fall out of the cache (and a 2 MiB buffer next to a
# 2 MiB output is unmapped and mapped again by glibc on every call, page faults included).
# Measured: benchmarks/bench_dequant.py --variants, docs/results.md.
BLOCK_ELEMENTS = 1 << 18


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_width: int,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(codes - offset) * scale`` for a 2-D ``codes`` (rows, in), rounded once to ``dtype``.

    :param codes: integer or float8 codes, (rows, in); exact in fp32
    :param scale: fp32 (rows, groups); group ``g`` covers columns ``[g * w, (g + 1) * w)`` with
        ``w = group_width`` (the last group may be shorter: block-scaled float8)
    :param offset: fp32 like ``scale``, or None for zero (``q - 0`` is ``q``: no bit changes)
    :param dtype: the draft's float dtype
    :param out: where to write (rows, in) of ``dtype``; allocated when None
    :return: ``out``

    Eager torch, three passes over each block of rows in one reused fp32 buffer: codes -> fp32
    (exact), ``- offset`` and ``* scale`` (single IEEE fp32 operations), then one rounding to
    ``dtype`` into the output rows; an fp32 draft is decoded straight into its output rows.
    Nothing measured faster is as plain: an operation mixing dtypes (``torch.mul(int8, fp32,
    out=bf16)``) converts its operands into whole temporaries first, any product taken in
    bf16/fp16 rounds the scale, and a two-pass body (cast into the output, then scale it in
    place in fp32 through torch's eval-mode batch-norm kernel) measured a tie while relying on
    that kernel accepting its input as its output. What torch's kernels for these passes cost
    against a plain cast: ``bench_dequant.py --floor``, docs/results.md.

    ``test/unit/formats/test_dequantize.py`` checks it against the whole-tensor fp32 formula.
    """
    rows, in_features = codes.shape
    if out is None:
        out = torch.empty((rows, in_features), dtype=dtype)
    if rows == 0:
        return out
    groups = scale.shape[1]
    full = min(groups, in_features // group_width) if group_width else 0
    step = max(1, BLOCK_ELEMENTS // max(1, in_features))
    direct = dtype == torch.float32
    # one fp32 buffer for every block: no allocation (and no page faults) inside the loop; the
    # same size for every tensor, so the C allocator hands the same memory back each time
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
    """``work = (work - offset) * scale`` for fp32 rows; ``full`` whole groups of ``width``
    columns, then a shorter last group if the row is longer."""
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
    """One weight's decoding: ``w = (q - offset) * scale`` per row or per group of a row.

    ``scale``/``offset`` are fp32 (rows, groups), rows counting every leading dimension;
    ``offset`` is None when it is all zeros. ``unpack`` turns the stored codes into one code
    per weight (int4 layouts); ``shape`` is the logical weight shape the decoder produces.
    """

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
        """The float weight, rounded once to ``dtype``.

        ``only``: for a weight with a leading expert dimension (fused experts), decode just
        these experts; the others are NaN, which no loader may keep (the guard refuses
        non-finite parameters), since sglang drops them on this rank.
        """
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
