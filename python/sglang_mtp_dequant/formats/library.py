"""Weights in formats a well-kept library decodes: compressed-tensors' own decompressors.

Usage::

    decoder = library_decoder(info, companions, checkpoint, fmt)   # None: no library decodes it
    decoder.output_name        # "mtp.fc.weight" (the float weight sglang's loader expects)
    decoder.consumed           # the companion names it reads (dropped from sglang's stream)
    w = decoder.decompress(stored, torch.bfloat16)

Why a library: compressed-tensors is sglang's own dependency and ships model-free decoders for
its formats and a converter from ModelOpt's NVFP4; this module gathers one weight's tensors,
checks they are there and hands them over, importing it only when one is needed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import DraftWeightError
from .checkpoint import Checkpoint, TensorInfo
from .schemes.base import refused

#: the foreign format names (``foreign.py``) this module decodes, and how
MODELOPT_NVFP4 = "ModelOpt NVFP4"
DECODED_FORMATS = (
    "compressed-tensors pack-quantized",
    "compressed-tensors int-quantized",
    "compressed-tensors float-quantized",
    "compressed-tensors nvfp4-pack-quantized",
    MODELOPT_NVFP4,
)

LIBRARY = "compressed-tensors"


def decodes(format_name: str | None) -> bool:
    """Whether a weight stored in ``format_name`` (``foreign.TensorFormat.name``) is decoded."""
    return format_name in DECODED_FORMATS


@dataclass
class LibraryDecoder:
    """One weight, decoded by compressed-tensors, its companion tensors read up front."""

    tensor: str  # the stored weight (``X.weight_packed`` or ``X.weight``)
    file: str
    output_name: str  # ``X.weight``
    shape: tuple[int, ...]  # the logical weight shape
    format: str
    companions: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> value
    folder: str = ""

    @property
    def consumed(self) -> set[str]:
        return set(self.companions)

    def decompress(
        self, stored: torch.Tensor, dtype: torch.dtype, only: Sequence[int] | None = None
    ) -> torch.Tensor:
        """The float weight in ``dtype`` (``only``, for fused experts, never applies here)."""
        if stored.is_meta:  # a dry run (the doctor): shapes only
            return torch.empty(self.shape, dtype=dtype, device="meta")
        tensors = {self.tensor: stored, **self.companions}
        if self.format == MODELOPT_NVFP4:
            weight = _modelopt_nvfp4(tensors, self.output_name)
        else:
            weight = _dequantizer(self.folder, dtype).process(tensors).get(self.output_name)
        if weight is None or tuple(weight.shape) != self.shape:
            raise DraftWeightError(
                tensor=self.tensor,
                file=self.file,
                problem=(
                    f"compressed-tensors did not decode it to {self.output_name} "
                    f"{list(self.shape)} ({'nothing' if weight is None else list(weight.shape)})"
                ),
                hint="the checkpoint's quantization_config does not describe this weight",
            )
        return weight.to(dtype)


def library_decoder(
    info: TensorInfo, companions: Mapping[str, TensorInfo], checkpoint: Checkpoint, fmt_name: str
) -> LibraryDecoder:
    """The decoder of ``info`` stored in ``fmt_name`` (one of ``DECODED_FORMATS``), its
    companions read now; ``DraftWeightError`` when one is missing or not configured."""
    base = info.name.rpartition(".")[0]
    stored = (
        f"is stored as {fmt_name} ({info.dtype_name}, with "
        f"{', '.join(sorted(companions)) or 'no companion'})"
    )
    method = checkpoint.declared.method if checkpoint.declared is not None else None
    if fmt_name != MODELOPT_NVFP4 and method not in ("compressed-tensors", "compressed_tensors"):
        raise refused(
            info,
            (
                f"{stored}, but config.json has no compressed-tensors quantization_config "
                "saying how it was quantized, so nothing can decode it"
            ),
            "restore the quantization_config the exporter wrote into config.json, or "
            "export the MTP layers unquantized",
        )
    if fmt_name == MODELOPT_NVFP4:
        needed = [f"{base}.{p}" for p in ("weight_scale", "weight_scale_2")]
        optional = [f"{base}.input_scale"]
    else:
        try:
            dequantizer = _dequantizer(checkpoint.folder, torch.float32)
        except (ImportError, ValueError) as exc:  # no library, or a config it cannot read
            raise refused(
                info,
                f"{stored}, which compressed-tensors cannot read here "
                f"({type(exc).__name__}: {exc})",
                "install sglang's pinned compressed-tensors, or fix config.json's "
                "quantization_config",
            ) from exc
        needed = sorted(dequantizer.get_dependencies(info.name))
        if not needed:
            raise refused(
                info,
                (
                    f"{stored}, but config.json's quantization_config does not quantize it "
                    "(no config group targets it, or it is in ignore)"
                ),
                "fix the checkpoint's quantization_config, or export the layer unquantized",
            )
        optional = []
    missing = [n for n in needed if n not in checkpoint.tensors]
    if missing:
        raise refused(
            info,
            f"{stored}, but the checkpoint has no {', '.join(missing)}",
            "the checkpoint is incomplete: download or export it again",
        )
    wanted = [checkpoint.tensors[n] for n in (*needed, *optional) if n in checkpoint.tensors]
    values = checkpoint.read_many(wanted)
    return LibraryDecoder(
        tensor=info.name,
        file=info.file,
        output_name=f"{base}.weight",
        shape=_logical_shape(info, values, base, fmt_name),
        format=fmt_name,
        companions=values,
        folder=checkpoint.folder,
    )


def _logical_shape(
    info: TensorInfo, values: Mapping[str, torch.Tensor], base: str, fmt_name: str
) -> tuple[int, ...]:
    shape = values.get(f"{base}.weight_shape")
    if shape is not None:
        return tuple(int(d) for d in shape.tolist())
    if fmt_name in (MODELOPT_NVFP4, "compressed-tensors nvfp4-pack-quantized"):
        return (*info.shape[:-1], info.shape[-1] * 2)  # two fp4 codes a byte
    return info.shape


@functools.lru_cache(maxsize=8)
def _dequantizer(folder: str, dtype: torch.dtype) -> Any:
    """compressed-tensors' decoder for the checkpoint in ``folder``, its config parsed once."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
        CompressedTensorsDequantizer,
    )

    return CompressedTensorsDequantizer(folder, dtype=dtype)


def _modelopt_nvfp4(tensors: dict[str, torch.Tensor], output_name: str) -> torch.Tensor | None:
    """ModelOpt's NVFP4 tensors through compressed-tensors' converter, then its decompressor."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )

    module = output_name.rpartition(".")[0]
    converter = ModelOptNvfp4Converter(targets=[f"re:^{re.escape(module)}$"])
    converted = converter.process(dict(tensors))
    config = converter.create_config()
    scheme = next(iter(config.config_groups.values()))
    compressor = BaseCompressor.get_value_from_registry(config.format)
    local = {
        name.rpartition(".")[2]: tensor
        for name, tensor in converted.items()
        if name.rpartition(".")[0] == module
    }
    return compressor.decompress(local, scheme).get("weight")
