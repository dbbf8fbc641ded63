"""Checkpoint naming rules: which names are the draft's and which travel beside a weight.

Usage::

    is_draft = nextn_layer(config)                  # name -> bool, for a NextN draft
    split_companion("mtp.fc.weight_scale")          # ("mtp.fc", "weight_scale")
    expert_id("mtp.layers.0.mlp.experts.7.up_proj.weight")    # 7

Why one module: the plan, the guard and verify depend on the same naming facts. sglang's
parameter names are ``serving/parameter_names.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: tensors beside a quantized ``X.weight`` as ``X.<suffix>``: consumed once it is dequantized
COMPANION_SUFFIXES = (
    "weight_scale",
    "weight_offset",
    "deq_scale",
    "input_scale",
    "input_offset",
    "quant_bias",
    "scale_bias",
    "weight_scale_second",
    "weight_offset_second",
    "weight_scale_inv",
    "weight_dual_scale",
)

#: tensors (not weights) a ModelSlim export keeps for Ascend's quantized attention (FA3,
#: described ``FAQuant``) and KV-cache (C8) kernels
ATTENTION_QUANT = {
    "FA3": tuple(f"fa_{x}.{part}" for x in "qkv" for part in ("scale", "offset")),
    "C8": tuple(f"{p}_proj.kv_cache_{part}" for p in "kv" for part in ("scale", "offset")),
}
#: QuaRot: the description flag and the file and tensor of the rotation msmodelslim writes
QUAROT_FLAG = "is_rot_used"
QUAROT_FILE = "rot.safetensors"
QUAROT_TENSOR = "rot.weight"

NameRule = Callable[[str], bool]


def mtp_prefix(_config: object = None) -> NameRule:
    """Qwen3.5/3.6/Qwen3-Next/Qwen3-MoE: every name containing ``mtp`` (their drafts take those)."""
    return lambda name: "mtp" in name


def nextn_layer(config: object) -> NameRule:
    """DeepSeek-V3 / GLM-4.5+ NextN: ``model.layers.<id>``, ``id = 0 if num_hidden_layers == 1
    else num_hidden_layers``, as sglang's loaders take it (``config``: a ``CheckpointConfig`` or
    a built draft; without the field, nothing)."""
    layers = decoder_layers(config)
    if layers is None:
        return lambda name: False
    prefix = f"model.layers.{0 if layers == 1 else layers}."
    return lambda name: name.startswith(prefix)


def nextn_layer_multimodal(config: object) -> NameRule:
    """GLM-5-Next NextN: ``model.layers.<n>.`` and ``model.language_model.layers.<n>.``, ``n``
    the text config's ``num_hidden_layers``."""
    layers = decoder_layers(config)
    if layers is None:
        return lambda name: False
    prefixes = (f"model.layers.{layers}.", f"model.language_model.layers.{layers}.")
    return lambda name: name.startswith(prefixes)


def decoder_layers(config: object) -> int | None:
    """The config's ``num_hidden_layers`` when it is a positive int, else None."""
    layers = config_value(config, "num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        return None
    return layers


def config_value(config: object, key: str) -> Any:
    """``key`` of a ``CheckpointConfig``, a model or a bare config, else its text config's."""
    value = getattr(config, "value", None)
    if callable(value):  # a CheckpointConfig
        return value(key)
    config = getattr(config, "config", config)
    found = getattr(config, key, None)
    if found is None:
        found = getattr(getattr(config, "text_config", None), key, None)
    return found


def attention_quant_kind(name: str) -> str | None:
    """``"FA3"`` or ``"C8"`` for an ``ATTENTION_QUANT`` tensor under ``self_attn``, else None."""
    if ".self_attn." not in name:
        return None
    for kind, tails in ATTENTION_QUANT.items():
        if name.endswith(tuple(f".{tail}" for tail in tails)):
            return kind
    return None


def split_companion(name: str) -> tuple[str, str] | None:
    """``("X", suffix)`` for ``X.<suffix>`` with a companion suffix, else None."""
    base, _, suffix = name.rpartition(".")
    return (base, suffix) if base and suffix in COMPANION_SUFFIXES else None


def is_bare_proj(name: str) -> bool:
    """A weight stored without ``.weight`` (any ``*_proj`` last component): Qwen3.5/3.6's fused
    ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I]."""
    return name.rpartition(".")[2].endswith("_proj")


def fused_companion_base(name: str, names: Mapping[str, object] | set[str]) -> str | None:
    """The fused weight of ``<fused weight>_<suffix>``, only when that weight is in ``names``."""
    for suffix in COMPANION_SUFFIXES:
        if name.endswith(f"_{suffix}"):
            base = name[: -len(suffix) - 1]
            if is_bare_proj(base) and base in names:
                return base
    return None


def is_companion(name: str, names: Mapping[str, object] | set[str]) -> bool:
    return split_companion(name) is not None or fused_companion_base(name, names) is not None


def companion_names(weight_name: str) -> dict[str, tuple[str, ...]]:
    """suffix -> the names a companion of ``weight_name`` may have in a checkpoint."""
    if weight_name.endswith(".weight"):
        base = weight_name[: -len(".weight")]
        return {s: (f"{base}.{s}",) for s in COMPANION_SUFFIXES}
    if is_bare_proj(weight_name):
        return {s: (f"{weight_name}.{s}", f"{weight_name}_{s}") for s in COMPANION_SUFFIXES}
    return {}


def expert_id(name: str) -> int | None:
    """The routed expert of a per-expert name (``...experts.<e>.<proj>.weight``), else None."""
    tokens = name.split(".")
    for i in range(len(tokens) - 2):
        if tokens[i] == "experts" and tokens[i + 1].isdigit():
            return int(tokens[i + 1])
    return None


def is_fused_experts(name: str) -> bool:
    """All experts in one tensor: ``...experts.gate_up_proj`` / ``...experts.down_proj``."""
    head, _, last = name.rpartition(".")
    return head.endswith("experts") and last.endswith("_proj")
