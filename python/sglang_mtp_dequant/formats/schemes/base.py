"""What every scheme shares: the abstract base, the registry, and the companion checks.

Usage::

    @register_scheme
    class MyScheme(Scheme):
        types = ("MY_TYPE",)                             # description types it decodes
        companions = {"weight_scale": FLOAT_STORAGE}      # what it reads, stored as what

        def prepare(self, weight, values, group_size, format_version=None) -> AffineDecoder:
            ...

    scheme_for("MY_TYPE").check_storage(weight_info, companion_infos)   # headers only
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import torch

from ...errors import DraftWeightError
from ..checkpoint import TensorInfo, dtype_name
from .affine import AffineDecoder

REEXPORT = "re-export the checkpoint with msmodelslim, or serve the draft quantized"

#: how a scale or an offset is stored: a float (f32 from the V1 saver, the model dtype from V0)
FLOAT_STORAGE = (torch.float32, torch.bfloat16, torch.float16)
#: a weight's companion values by suffix (``weight_scale`` -> its tensor)
Values = Mapping[str, torch.Tensor]


def refused(weight: TensorInfo, problem: str, hint: str = REEXPORT) -> DraftWeightError:
    """The error refusing draft tensor ``weight``: what is wrong, and what to do."""
    return DraftWeightError(tensor=weight.name, file=weight.file, problem=problem, hint=hint)


class Scheme(ABC):
    """One quantization scheme: the companions it reads and how to build a weight's decoder."""

    #: description type strings this class decodes
    types: ClassVar[tuple[str, ...]] = ()
    #: companion suffix (``X.<suffix>`` beside ``X.weight``) -> the storage dtypes it may have
    companions: ClassVar[Mapping[str, tuple[torch.dtype, ...]]] = {}
    #: storage dtypes of the weight's codes
    code_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.int8,)

    @property
    def name(self) -> str:
        return self.types[0]

    def check_storage(self, weight: TensorInfo, companions: Mapping[str, TensorInfo]) -> None:
        """Refuse codes or companions stored as a dtype the scheme does not define (headers
        only): an integer scale would decode to weights thousands of times too big."""
        if weight.dtype not in self.code_dtypes or len(weight.shape) < 2:
            raise refused(
                weight,
                (
                    f"{self.name} expects a >=2-D {_names(self.code_dtypes)} weight, found "
                    f"{weight.dtype_name}{list(weight.shape)}"
                ),
            )
        for suffix, info in companions.items():
            allowed = self.companions.get(suffix)
            if allowed is not None and info.dtype not in allowed:
                raise refused(
                    info,
                    (
                        f"is stored as {info.dtype_name}, but {self.name} defines {suffix} as "
                        f"{_names(allowed)} (the companion of {weight.name})"
                    ),
                    f"the checkpoint is corrupt or not a {self.name} export: {REEXPORT}",
                )

    @abstractmethod
    def prepare(
        self, weight: TensorInfo, values: Values, group_size: int, format_version: str | None = None
    ) -> AffineDecoder:
        """Check the companion ``values`` against the weight's header and build its decoder;
        ``group_size`` and ``format_version`` are the description's."""

    @classmethod
    def claims(cls, weight: TensorInfo, suffixes: frozenset[str]) -> bool:
        """Whether an untyped weight is this scheme's, by dtype and companions (disjoint rules)."""
        return False

    def stores(self, weight: TensorInfo, companions: Mapping[str, TensorInfo]) -> bool:
        """``check_storage`` as a yes/no."""
        if weight.dtype not in self.code_dtypes:
            return False
        return all(
            info.dtype in self.companions[suffix]
            for suffix, info in companions.items()
            if suffix in self.companions
        )

    def logical_shape(self, stored: TensorInfo) -> tuple[int, ...]:
        """The weight's (…, out, in) shape once decoded; int4 schemes unpack here."""
        return stored.shape


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return "/".join(dtype_name(d) for d in dtypes)


_REGISTRY: dict[str, Scheme] = {}


def register_scheme(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: an instance of ``cls`` decodes each of its types (a type registered
    twice raises ``ValueError``: the winner would depend on import order)."""
    instance = cls()
    for type_name in cls.types:
        taken = _REGISTRY.get(type_name)
        if taken is not None:
            raise ValueError(
                f"{cls.__name__} registers {type_name!r}, which {type(taken).__name__} decodes"
            )
    for type_name in cls.types:
        _REGISTRY[type_name] = instance
    return cls


def scheme_for(type_name: str) -> Scheme | None:
    return _REGISTRY.get(type_name)


def known_types() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def infer_type(
    weight: TensorInfo, companions: Mapping[str, TensorInfo] | set[str] | frozenset[str]
) -> str | None:
    """The type of an untyped code weight that exactly one scheme claims; given headers, a claim
    whose storage fits wins (float8 with an f32 ``weight_scale`` is FP8, with a uint8 one MXFP8),
    else the claim stands and ``check_storage`` names the companion."""
    suffixes = frozenset(companions)
    claimed = [s for s in _REGISTRY.values() if s.claims(weight, suffixes)]
    if isinstance(companions, Mapping):
        fitting = [s for s in claimed if s.stores(weight, companions)]
        claimed = fitting or claimed
    names = {s.name for s in claimed}
    return names.pop() if len(names) == 1 else None


def require(weight: TensorInfo, values: Values, suffix: str, scheme: str) -> torch.Tensor:
    if suffix not in values:
        base = weight.name.rsplit(".", 1)[0]
        raise refused(
            weight,
            f"is {scheme} (codes) but the checkpoint has no {base}.{suffix}",
            f"the checkpoint is incomplete: {REEXPORT}",
        )
    return values[suffix]


def per_row_groups(
    weight: TensorInfo,
    shape: tuple[int, ...],
    values: torch.Tensor,
    what: str,
    group_size: int,
) -> torch.Tensor:
    """A scale/offset as fp32 (rows, groups) for a weight of logical ``shape``: one value per
    row (exactly these shapes: a (1, out) or block-wise scale of ``rows`` values is not one) or
    per contiguous group along ``in``; anything else is an error."""
    rows = math.prod(shape[:-1])
    in_features = shape[-1]
    lead = tuple(values.shape)
    per_row = {tuple(shape[:-1]), tuple(shape[:-1]) + (1,), (rows,), (rows, 1)}
    if lead in per_row or (lead == () and rows == 1):
        groups = 1
    elif lead[:-1] == tuple(shape[:-1]) and lead[-1] > 0 and in_features % lead[-1] == 0:
        groups = lead[-1]
    else:
        groups = 0
    if groups == 0 or values.numel() != rows * groups:
        raise refused(
            weight,
            (
                f"{what} has shape {list(values.shape)}, which fits neither per-channel "
                f"({list(shape[:-1])} or {list(shape[:-1]) + [1]}) nor per-group "
                f"({list(shape[:-1]) + ['in/G']}) for the weight of shape {list(shape)}"
            ),
        )
    if groups > 1 and group_size and in_features // groups != group_size:
        raise refused(
            weight,
            (
                f"{what} has {groups} groups per row (group width {in_features // groups}), "
                f"but quant_model_description.json says group_size {group_size}"
            ),
        )
    return finite(weight, values.to(torch.float32).reshape(rows, groups), what)


def scale_groups(
    weight: TensorInfo, shape: tuple[int, ...], values: torch.Tensor, what: str, group_size: int
) -> torch.Tensor:
    """``per_row_groups`` of a scale, every value checked positive."""
    return positive(weight, per_row_groups(weight, shape, values, what, group_size), what)


def finite(weight: TensorInfo, values: torch.Tensor, what: str) -> torch.Tensor:
    if not bool(torch.isfinite(values).all()):
        raise refused(weight, f"{what} holds NaN or inf", f"the checkpoint is corrupt: {REEXPORT}")
    return values


def positive(weight: TensorInfo, values: torch.Tensor, what: str) -> torch.Tensor:
    if not bool((values > 0).all()):
        raise refused(
            weight,
            f"{what} holds values <= 0 (min {values.min().item():.6g})",
            f"a quantization scale is always positive; the checkpoint is corrupt: {REEXPORT}",
        )
    return values


def scale_and_offset(
    weight: TensorInfo,
    shape: tuple[int, ...],
    raw_scale: torch.Tensor,
    values: Values,
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The checked fp32 (rows, groups) ``weight_scale`` and ``weight_offset`` of an affine
    scheme; the offset is None when absent or all zero."""
    scale = scale_groups(weight, shape, raw_scale, "weight_scale", group_size)
    if "weight_offset" not in values:
        return scale, None
    offset = per_row_groups(weight, shape, values["weight_offset"], "weight_offset", group_size)
    if offset.shape != scale.shape:
        raise refused(
            weight,
            (
                f"weight_offset has shape {list(values['weight_offset'].shape)} "
                f"but weight_scale has {list(raw_scale.shape)}"
            ),
        )
    return scale, nonzero_or_none(offset)


def nonzero_or_none(offset: torch.Tensor) -> torch.Tensor | None:
    return offset if bool(offset.any()) else None


def block_size_for(length: int, blocks: int) -> int | None:
    """The power-of-two block size (unique if any) that cuts ``length`` into ``blocks`` blocks,
    the last one possibly shorter (``blocks == 1``: the whole length), or None."""
    if blocks < 1 or length < 1:
        return None
    if blocks == 1:
        return length
    low = -(-length // blocks)
    high = -(-length // (blocks - 1))
    size = 1 << (low - 1).bit_length()  # the smallest power of two >= low
    return size if size < high else None
