"""The one place that decodes quantization schemes: integer codes + companions -> float weights.

Usage::

    scheme = scheme_for("W8A8_DYNAMIC")
    decoder = scheme.prepare(weight_info, {"weight_scale": s, "weight_offset": o}, group_size=0)
    w_bf16 = decoder.decompress(q_int8, torch.bfloat16)

One class per ModelSlim scheme, found through a registry keyed by the type string that
``quant_model_description.json`` gives the tensor (the compressed-tensors layout: a class per
format, a registry, a ``decompress``). ``prepare`` sees only the small companion tensors, so
every shape and value problem is found before sglang streams a single weight; ``decompress``
then runs once per weight as it streams by.

The arithmetic is ModelSlim's: ``w = (q - offset) * scale`` in fp32, rounded once to the
draft's dtype (``q = clamp(round(w / scale + offset))`` is how msmodelslim quantized it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .checkpoint import TensorInfo
from .errors import DraftWeightError

# Rows are decoded in blocks of about this many elements, so the fp32 temporary stays small
# (4 MiB) whatever the tensor size, and stays in cache.
_BLOCK_ELEMENTS = 1 << 20

_REEXPORT = "re-export the checkpoint with msmodelslim, or serve the draft quantized"


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

    def decompress(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
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
        out = torch.empty((rows, in_features), dtype=dtype)
        groups = self.scale.shape[1]
        group_width = in_features // groups
        block = max(1, _BLOCK_ELEMENTS // max(1, in_features))
        for r0 in range(0, rows, block):
            r1 = min(rows, r0 + block)
            work = flat[r0:r1].to(torch.float32).view(r1 - r0, groups, group_width)
            if self.offset is not None:
                work.sub_(self.offset[r0:r1, :, None])
            work.mul_(self.scale[r0:r1, :, None])
            out[r0:r1].copy_(work.view(r1 - r0, in_features))
        return out.view(self.shape)


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
        self, weight: TensorInfo, companions: Mapping[str, torch.Tensor], group_size: int
    ) -> AffineDecoder:
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
                hint=_REEXPORT,
            )


def _require(weight: TensorInfo, companions: Mapping[str, torch.Tensor], suffix: str, scheme: str):
    if suffix not in companions:
        base = weight.name.rsplit(".", 1)[0]
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"is {scheme} (integer codes) but the checkpoint has no {base}.{suffix}",
            hint=f"the checkpoint is incomplete: {_REEXPORT}",
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
    if lead == tuple(shape[:-1]) or (values.numel() == rows and lead[-1:] != (in_features,)):
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
            hint=_REEXPORT,
        )
    if groups > 1 and group_size and in_features // groups != group_size:
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=(
                f"{what} has {groups} groups per row (group width {in_features // groups}), "
                f"but quant_model_description.json says group_size {group_size}"
            ),
            hint=_REEXPORT,
        )
    out = values.to(torch.float32).reshape(rows, groups)
    if not bool(torch.isfinite(out).all()):
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"{what} holds NaN or inf",
            hint=f"the checkpoint is corrupt: {_REEXPORT}",
        )
    return out


def positive(weight: TensorInfo, values: torch.Tensor, what: str) -> torch.Tensor:
    if not bool((values > 0).all()):
        raise DraftWeightError(
            tensor=weight.name,
            file=weight.file,
            problem=f"{what} holds values <= 0 (min {values.min().item():.6g})",
            hint=f"a quantization scale is always positive; the checkpoint is corrupt: {_REEXPORT}",
        )
    return values


def nonzero_or_none(offset: torch.Tensor) -> torch.Tensor | None:
    return offset if bool(offset.any()) else None


class AffineInt8(Scheme):
    """W8A8_DYNAMIC and W8A16: int8 codes, ``weight_scale`` and ``weight_offset``.

    Per channel (out, 1) or per group (out, in/G); W8A16 offsets can be nonzero (asymmetric).
    """

    types = ("W8A8_DYNAMIC", "W8A16")
    reads = ("weight_scale", "weight_offset")

    def prepare(self, weight, companions, group_size):
        self._check_storage(weight, (torch.int8,))
        shape = self.logical_shape(weight)
        raw_scale = _require(weight, companions, "weight_scale", self.types[0])
        scale = positive(
            weight, per_row_groups(weight, shape, raw_scale, "weight_scale", group_size),
            "weight_scale",
        )
        offset = None
        if "weight_offset" in companions:
            offset = per_row_groups(
                weight, shape, companions["weight_offset"], "weight_offset", group_size
            )
            if offset.shape != scale.shape:
                raise DraftWeightError(
                    tensor=weight.name,
                    file=weight.file,
                    problem=(
                        f"weight_offset has shape {list(companions['weight_offset'].shape)} "
                        f"but weight_scale has {list(raw_scale.shape)}"
                    ),
                    hint=_REEXPORT,
                )
            offset = nonzero_or_none(offset)
        return AffineDecoder(weight.name, weight.file, shape, scale, offset)


class StaticInt8(Scheme):
    """W8A8 (static activations) and W8A8_MIX.

    V1 writes no ``weight_scale``: the weight scale is ``deq_scale / input_scale``, where
    ``deq_scale`` is f32, or the f32 bit pattern widened to int64 (reinterpreted, not cast).
    V0 also writes ``weight_scale``/``weight_offset``, which are then used as they are.
    ``quant_bias`` and ``input_offset`` belong to the int8 GEMM and are dropped.
    """

    types = ("W8A8", "W8A8_MIX")
    reads = ("weight_scale", "weight_offset", "deq_scale", "input_scale")

    def prepare(self, weight, companions, group_size):
        if "weight_scale" in companions:
            return AffineInt8().prepare(weight, companions, group_size)
        self._check_storage(weight, (torch.int8,))
        shape = self.logical_shape(weight)
        deq_scale = float32_bits(weight, _require(weight, companions, "deq_scale", "W8A8"))
        input_scale = _require(weight, companions, "input_scale", "W8A8").to(torch.float32)
        if input_scale.numel() != 1:
            raise DraftWeightError(
                tensor=weight.name,
                file=weight.file,
                problem=f"input_scale has shape {list(input_scale.shape)}, expected one value",
                hint=_REEXPORT,
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
                hint=_REEXPORT,
            )
        return (deq_scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    raise DraftWeightError(
        tensor=weight.name,
        file=weight.file,
        problem=f"deq_scale is {deq_scale.dtype}, expected float32 or int64",
        hint=_REEXPORT,
    )


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

    Only the unambiguous cases: ``deq_scale`` without ``weight_scale`` is static W8A8; a
    ``weight_scale`` alone decodes the same way under W8A8_DYNAMIC and W8A16.
    """
    if "weight_scale" in companion_suffixes:
        return "W8A8_DYNAMIC"
    if "deq_scale" in companion_suffixes:
        return "W8A8"
    return None


register_scheme(AffineInt8())
register_scheme(StaticInt8())
