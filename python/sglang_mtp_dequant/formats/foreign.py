"""Quantization formats other than ModelSlim's, told apart by name, so nothing is mistaken
for a ModelSlim scheme.

Usage::

    declared = declared_format(config)      # from config.json's quantization_config, or None
    declared.method                          # "compressed-tensors" | "modelopt" | ...
    fmt = tensor_format("mtp.fc.weight_packed", tensors, declared)
    fmt.name                                 # "compressed-tensors pack-quantized"

Why: a compressed-tensors or ModelOpt export keeps companions ModelSlim never writes and a
``quantization_config`` in config.json (msmodelslim removes it); layouts: ``docs/layouts.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .naming import COMPANION_SUFFIXES

#: tensors that travel beside a foreign format's weight (never written by msmodelslim)
FOREIGN_PARTS = (
    "weight_packed",
    "weight_shape",
    "weight_zero_point",
    "weight_global_scale",
    "input_global_scale",
    "weight_scale_2",
    "weight_g_idx",
)


#: config.json quant methods whose exports this module names (their companions are their own)
FOREIGN_METHODS = ("compressed-tensors", "compressed_tensors", "modelopt", "modelopt_fp4",
                   "modelopt_fp8", "modelopt_mixed")  # fmt: skip


@dataclass(frozen=True)
class DeclaredFormat:
    """What config.json's ``quantization_config`` says."""

    method: str  # quant_method: "compressed-tensors", "modelopt", "fp8", ...
    formats: tuple[str, ...]  # compressed-tensors formats, or ModelOpt's quant_algo

    @property
    def label(self) -> str:
        return f"{self.method} ({', '.join(self.formats)})" if self.formats else self.method


@dataclass(frozen=True)
class TensorFormat:
    """The format one stored weight is in, and the tensors that belong to it."""

    name: str  # "compressed-tensors pack-quantized", "ModelOpt NVFP4", ...
    parts: tuple[str, ...]  # names of the companions beside it


def declared_format(config: Any) -> DeclaredFormat | None:
    """config.json's ``quantization_config`` (top level or ``text_config``; ``config`` a
    ``CheckpointConfig`` or its raw dict), or None."""
    raw = getattr(config, "raw", config)
    if not isinstance(raw, dict):
        return None
    section = raw.get("quantization_config")
    if not isinstance(section, dict):
        text = raw.get("text_config")
        section = text.get("quantization_config") if isinstance(text, dict) else None
    if not isinstance(section, dict):
        return None
    method = str(section.get("quant_method") or "unknown")
    formats: list[str] = []
    if isinstance(section.get("format"), str):
        formats.append(section["format"])
    groups = section.get("config_groups")
    if isinstance(groups, dict):
        for group in groups.values():
            if isinstance(group, dict) and isinstance(group.get("format"), str):
                formats.append(group["format"])
    if isinstance(section.get("quant_algo"), str):
        formats.append(section["quant_algo"])
    quantization = section.get("quantization")  # ModelOpt's nested hf_quant_config layout
    if isinstance(quantization, dict) and isinstance(quantization.get("quant_algo"), str):
        formats.append(quantization["quant_algo"])
    return DeclaredFormat(method, tuple(dict.fromkeys(formats)))


def foreign_base(name: str) -> str | None:
    """``X`` for ``X.<part>`` with a foreign-only part (``X.weight_packed``, ...), else None."""
    base, _, last = name.rpartition(".")
    return base if base and last in FOREIGN_PARTS else None


def tensor_format(
    weight: str, dtypes: Mapping[str, torch.dtype | str], declared: DeclaredFormat | None
) -> TensorFormat | None:
    """The foreign format of ``weight``, from the dtypes of the tensors beside it and what
    config.json declares; None for a ModelSlim export or a float weight."""
    base = weight.rpartition(".")[0]
    parts = {
        name.rpartition(".")[2]: dtype
        for name, dtype in dtypes.items()
        if name.rpartition(".")[0] == base
        and name != weight
        and name.rpartition(".")[2] in (*FOREIGN_PARTS, *COMPANION_SUFFIXES)
    }
    own = dtypes.get(weight)
    packed = weight.endswith(".weight_packed")
    names = tuple(sorted(f"{base}.{p}" for p in parts))
    foreign_parts = packed or bool(parts.keys() & set(FOREIGN_PARTS))
    method = declared.method if declared is not None else ""
    if not foreign_parts and method not in FOREIGN_METHODS:
        return None  # ModelSlim, or a format the plugin's own schemes know (e.g. fp8)
    if method.startswith("modelopt") or "weight_scale_2" in parts:
        if own == torch.uint8:
            return TensorFormat("ModelOpt NVFP4", names)
        if own in (torch.float8_e4m3fn, torch.float8_e5m2):
            return TensorFormat("ModelOpt FP8", names)
        return TensorFormat(declared.label if declared else "ModelOpt (unknown)", names)
    if packed and "weight_global_scale" in parts:
        return TensorFormat("compressed-tensors nvfp4-pack-quantized", names)
    if packed:
        return TensorFormat("compressed-tensors pack-quantized", names)
    if declared is None:
        return TensorFormat("an unknown format (no quantization_config)", names)
    if method in ("compressed-tensors", "compressed_tensors"):
        if own == torch.int8:
            return TensorFormat("compressed-tensors int-quantized", names)
        if own in (torch.float8_e4m3fn, torch.float8_e5m2):
            return TensorFormat("compressed-tensors float-quantized", names)
    return TensorFormat(declared.label, names)


def has_foreign_parts(fmt: TensorFormat, weight: str) -> bool:
    """Whether the weight or its companions are stored in a way no ModelSlim scheme reads."""
    packed = weight.endswith(".weight_packed")
    return packed or any(p.rpartition(".")[2] in FOREIGN_PARTS for p in fmt.parts)
