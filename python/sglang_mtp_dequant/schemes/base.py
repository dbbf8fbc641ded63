"""What every scheme shares: the affine decoder, the scheme base class, checks, the registry."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..checkpoint import TensorInfo
from ..errors import DraftWeightError
from . import fused_bf16

# Rows are decoded in blocks of about this many elements: the fp32 buffer (1 MiB) stays in
# cache whatever the tensor size. Chosen by measurement (benchmarks/bench_dequant.py
# --variants, docs/results.md): smaller blocks pay per-operation overhead, larger ones miss
# the cache.
_BLOCK_ELEMENTS = 1 << 18

REEXPORT = "re-export the checkpoint with msmodelslim, or serve the draft quantized"


@dataclass(frozen=True)
class AffineDecoder:
    """``w = (q - offset) * scale``, with one scale per row or per contiguous group of a row.

    ``scale``/``offset`` are fp32 of shape (rows, groups); ``offset`` is None when it is all
    zeros (``q - 0`` is ``q`` exactly, so skipping it changes no bit and saves a pass).
    ``unpack`` turns the stored codes into one integer per weight (int4 layouts); ``shape`` is
    the logical weight shape the decoder produces.
    """

    tensor: str
    file: str
    shape: tuple[int, ...]
    scale: torch.Tensor
    offset: torch.Tensor | None
    unpack: Callable[[torch.Tensor], torch.Tensor] | None = None

    def decompress(
        self, codes: torch.Tensor, dtype: torch.dtype, *, fused: bool = True
    ) -> torch.Tensor:
        """The float weight, rounded once to ``dtype``. bf16 goes through the one-pass kernel
        (``fused_bf16``) unless ``fused`` is False or the kernel cannot run here; every other
        dtype, and that fallback, through eager torch. Both give the same bits."""
        q = self.unpack(codes) if self.unpack is not None else codes
        if tuple(q.shape) != self.shape:
            raise DraftWeightError(
                tensor=self.tensor,
                file=self.file,
                problem=f"streamed with shape {list(codes.shape)}, its header said otherwise",
                hint="the file changed while sglang was loading it; restart the server",
            )
        in_features = self.shape[-1]
        rows = q.numel() // in_features if in_features else 0
        flat = q.reshape(rows, in_features)
        if fused and dtype == torch.bfloat16:  # every sglang draft on Ascend
            out = fused_bf16.decode(flat, self.scale, self.offset)
            if out is not None:
                return out.view(self.shape)
        return self._decompress_torch(flat, dtype).view(self.shape)

    def _decompress_torch(self, flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Eager torch, any float ``dtype``: three passes per block of rows (see the constant)."""
        rows, in_features = flat.shape
        out = torch.empty((rows, in_features), dtype=dtype)
        groups = self.scale.shape[1]
        group_width = in_features // groups
        block = max(1, _BLOCK_ELEMENTS // max(1, in_features))
        # one fp32 buffer for every block: no allocation (and no page faults) inside the loop;
        # an fp32 draft is decoded straight into its output rows
        direct = dtype == torch.float32
        # (fp32 named explicitly: sglang loads under set_default_torch_dtype(bf16))
        buffer_rows = 0 if direct else min(block, rows)
        buffer = torch.empty((buffer_rows, in_features), dtype=torch.float32)
        for r0 in range(0, rows, block):
            r1 = min(rows, r0 + block)
            work = out[r0:r1] if direct else buffer[: r1 - r0]
            work.copy_(flat[r0:r1])  # integer codes -> fp32, exact
            grouped = work.view(r1 - r0, groups, group_width)
            if self.offset is not None:
                grouped.sub_(self.offset[r0:r1, :, None])
            grouped.mul_(self.scale[r0:r1, :, None])
            if not direct:
                out[r0:r1].copy_(work)  # the one rounding, to the draft's dtype
        return out


class Scheme:
    """Base of one ModelSlim scheme: which companions it needs and how to build its decoder."""

    #: description type strings this class decodes
    types: tuple[str, ...] = ()
    #: companion suffixes (``X.<suffix>`` beside ``X.weight``) the scheme reads
    reads: tuple[str, ...] = ()

    def logical_shape(self, stored: TensorInfo) -> tuple[int, ...]:
        """The weight's (…, out, in) shape once decoded; int4 schemes unpack here."""
        return stored.shape

    def prepare(
        self,
        weight: TensorInfo,
        companions: Mapping[str, torch.Tensor],
        group_size: int,
        format_version: str | None = None,
    ) -> AffineDecoder:
        """Check the companions against the weight's header and build its decoder.

        ``group_size`` and ``format_version`` are the description's global ``group_size`` and
        ``version`` (int4 packing differs between versions where shapes cannot tell).
        """
        raise NotImplementedError

    # -- helpers shared by the schemes ---------------------------------------------------

    def _check_storage(self, weight: TensorInfo, allowed: tuple[torch.dtype, ...]) -> None:
        if weight.dtype not in allowed or len(weight.shape) < 2:
            raise DraftWeightError(
                tensor=weight.name,
                file=weight.file,
                problem=(
                    f"{self.types[0]} expects a >=2-D {'/'.join(str(d) for d in allowed)} "
                    f"weight, found {weight.dtype_name}{list(weight.shape)}"
                ),
                hint=REEXPORT,
            )


def require(weight: TensorInfo, companions: Mapping[str, torch.Tensor], suffix: str, scheme: str):
    if suffix not in companions:
        base = weight.name.rsplit(".", 1)[0]
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"is {scheme} (integer codes) but the checkpoint has no {base}.{suffix}",
            hint=f"the checkpoint is incomplete: {REEXPORT}",
        )
    return companions[suffix]


def per_row_groups(
    weight: TensorInfo,
    shape: tuple[int, ...],
    values: torch.Tensor,
    what: str,
    group_size: int,
) -> torch.Tensor:
    """Reshape a scale/offset to fp32 (rows, groups) for a weight of logical ``shape``.

    Accepted: one value per row ((…, out), (…, out, 1)) or one per contiguous group along
    ``in`` ((…, out, in/G)). Anything else would broadcast into a wrong weight, so it is an
    error.
    """
    rows = math.prod(shape[:-1])
    in_features = shape[-1]
    lead = tuple(values.shape)
    # per row: exactly these shapes; e.g. a (1, out) or a block-wise (out/B, in/B) scale of
    # ``rows`` values is no per-row layout, and reading it as one would give a wrong weight
    per_row = {tuple(shape[:-1]), tuple(shape[:-1]) + (1,), (rows,), (rows, 1)}
    if lead in per_row or (lead == () and rows == 1):
        groups = 1
    elif lead[:-1] == tuple(shape[:-1]) and lead[-1] > 0 and in_features % lead[-1] == 0:
        groups = lead[-1]
    else:
        groups = 0
    if groups == 0 or values.numel() != rows * groups:
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=(
                f"{what} has shape {list(values.shape)}, which fits neither per-channel "
                f"({list(shape[:-1])} or {list(shape[:-1]) + [1]}) nor per-group "
                f"({list(shape[:-1]) + ['in/G']}) for the weight of shape {list(shape)}"
            ),
            hint=REEXPORT,
        )
    if groups > 1 and group_size and in_features // groups != group_size:
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=(
                f"{what} has {groups} groups per row (group width {in_features // groups}), "
                f"but quant_model_description.json says group_size {group_size}"
            ),
            hint=REEXPORT,
        )
    out = values.to(torch.float32).reshape(rows, groups)
    if not bool(torch.isfinite(out).all()):
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"{what} holds NaN or inf",
            hint=f"the checkpoint is corrupt: {REEXPORT}",
        )
    return out


def positive(weight: TensorInfo, values: torch.Tensor, what: str) -> torch.Tensor:
    if not bool((values > 0).all()):
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"{what} holds values <= 0 (min {values.min().item():.6g})",
            hint=f"a quantization scale is always positive; the checkpoint is corrupt: {REEXPORT}",
        )
    return values


def scale_and_offset(
    weight: TensorInfo,
    shape: tuple[int, ...],
    raw_scale: torch.Tensor,
    companions: Mapping[str, torch.Tensor],
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The checked fp32 (rows, groups) ``weight_scale`` and ``weight_offset`` of an affine
    scheme; the offset is None when absent or all zero."""
    scale = positive(
        weight,
        per_row_groups(weight, shape, raw_scale, "weight_scale", group_size),
        "weight_scale",
    )
    if "weight_offset" not in companions:
        return scale, None
    offset = per_row_groups(weight, shape, companions["weight_offset"], "weight_offset", group_size)
    if offset.shape != scale.shape:
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=(
                f"weight_offset has shape {list(companions['weight_offset'].shape)} "
                f"but weight_scale has {list(raw_scale.shape)}"
            ),
            hint=REEXPORT,
        )
    return scale, nonzero_or_none(offset)


def nonzero_or_none(offset: torch.Tensor) -> torch.Tensor | None:
    return offset if bool(offset.any()) else None


_REGISTRY: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> Scheme:
    """Make ``scheme`` the decoder for each of its description types."""
    for type_name in scheme.types:
        _REGISTRY[type_name] = scheme
    return scheme


def scheme_for(type_name: str) -> Scheme | None:
    return _REGISTRY.get(type_name)


def known_types() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def infer_type(companion_suffixes: set[str]) -> str | None:
    """A description type for an integer weight the description does not list.

    Only the unambiguous cases: ``scale_bias`` or ``weight_scale_second`` exist only beside
    W4A8_DYNAMIC int4 codes; ``deq_scale`` without ``weight_scale`` is static W8A8; a
    ``weight_scale`` alone decodes the same way under W8A8_DYNAMIC and W8A16.
    """
    if companion_suffixes & {"scale_bias", "weight_scale_second"}:
        return "W4A8_DYNAMIC"
    if "weight_scale" in companion_suffixes:
        return "W8A8_DYNAMIC"
    if "deq_scale" in companion_suffixes:
        return "W8A8"
    return None
