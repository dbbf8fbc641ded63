"""Checkpoint naming rules: which names are the draft's, which travel beside a weight, and
which checkpoint tensors feed which sglang parameter.

Usage::

    is_draft = nextn_layer(config)                  # name -> bool, for a NextN draft
    split_companion("mtp.fc.weight_scale")          # ("mtp.fc", "weight_scale")
    expert_id("mtp.layers.0.mlp.experts.7.up_proj.weight")    # 7
    NameIndex(checkpoint_names).sources_of("model.layers.0.qkv_proj.weight")
    # -> ["mtp.layers.0.self_attn.q_proj.weight", "...k_proj.weight", "...v_proj.weight"]

Why one module: the plan (what to decode), the guard (which checkpoint tensors fed a suspect
parameter) and verify (how to rebuild a parameter from checkpoint tensors) all depend on the
same naming facts; kept apart, they drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Tensors that travel beside a quantized ``X.weight`` as ``X.<suffix>``. They belong to the
# quantized GEMM (or are the scales of float8 codes); once the weight is dequantized they have
# nothing to load into, so they are consumed.
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

#: tensors a ModelSlim export keeps beside an attention block for Ascend's quantized attention
#: and KV-cache kernels, not weights: FA3 per-head activation scales (``self_attn.fa_q.scale``,
#: ``fa_k.offset``, ...: described ``FAQuant``, the offsets int8) and C8 KV-cache scales
#: (``self_attn.k_proj.kv_cache_scale``, ``v_proj.kv_cache_offset``: described ``C8``)
ATTENTION_QUANT = {
    "FA3": tuple(f"fa_{x}.{part}" for x in "qkv" for part in ("scale", "offset")),
    "C8": tuple(f"{p}_proj.kv_cache_{part}" for p in "kv" for part in ("scale", "offset")),
}
#: QuaRot: the description flag and the file and tensor of the rotation msmodelslim writes
QUAROT_FLAG = "is_rot_used"
QUAROT_FILE = "rot.safetensors"
QUAROT_TENSOR = "rot.weight"

#: name tokens sglang's draft loaders add or drop between checkpoint and parameter names
NEUTRAL_TOKENS = frozenset({"model", "mtp", "language_model", "self_attn"})
#: FusedMoE parameters and the per-expert checkpoint projections stacked into them
EXPERT_PARTS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}
#: the same, when the checkpoint stores all experts fused in one tensor (no ``.weight``)
FUSED_EXPERTS = {"w13_weight": "gate_up_proj", "w2_weight": "down_proj"}
#: stacked parameters and their checkpoint parts, where a class declares none; the MLA drafts
#: (DeepSeek, GLM-4.7-Flash, GLM-5-Next) concatenate q_a and kv_a in their loaders
#: (``deepseek_weight_loader.py``) whether or not the class lists it
DEFAULT_PACKED = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
    "fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"],
}

NameRule = Callable[[str], bool]


@dataclass(frozen=True)
class NameMatch:
    """A name rule that also names substrings (``needles``) every name it accepts contains.

    Why: the index and the description of a large export list every tensor; with the needles
    the draft's few entries are found in their bytes (``json_scan``) instead of parsing them.
    A rule of this type must accept no name that holds none of its needles (tested per rule).
    """

    accepts: NameRule
    needles: tuple[str, ...]

    def __call__(self, name: str) -> bool:
        return self.accepts(name)

    def or_names(self, names: Iterable[str]) -> NameMatch:
        """This rule, and ``names`` exactly (each its own needle)."""
        extra = frozenset(names)
        rule = self.accepts
        return NameMatch(
            lambda name: rule(name) or name in extra, self.needles + tuple(sorted(extra))
        )


def needles_of(rule: Callable[[str], bool]) -> tuple[str, ...] | None:
    """The needles of a ``NameMatch``; None for any other rule (its entries are read by a
    whole parse)."""
    return rule.needles if isinstance(rule, NameMatch) else None


# -- which names are the draft's ---------------------------------------------------------------


def mtp_prefix(_config: object = None) -> NameMatch:
    """Qwen3.5/3.6/Qwen3-Next/Qwen3-MoE style: the draft is every name containing ``mtp``.

    The rule is the draft's own: its ``load_weights`` processes every name containing ``mtp``
    (``mtp.*`` on every released checkpoint), so the plugin watches the same names.
    """
    return NameMatch(lambda name: "mtp" in name, ("mtp",))


def nextn_layer(config: object) -> NameMatch:
    """DeepSeek-V3 / GLM-4.5+ NextN: the draft is the layer after the last decoder layer.

    sglang's loaders (``deepseek_weight_loader.py``, ``glm4_moe.py``, ``glm4_moe_lite.py``)
    take ``model.layers.<id>`` with ``id = 0 if num_hidden_layers == 1 else
    num_hidden_layers``, where ``num_hidden_layers`` is the target's (only the draft's
    architecture name is rewritten). ModelSlim keeps those names unchanged. sglang matches the
    prefix without a trailing dot; with at most ``num_hidden_layers + 1`` layers no other
    layer name can share it, so the dotted prefix here selects the same tensors.

    ``config`` is a ``CheckpointConfig`` (the CLI) or a built draft (``model.config``); one
    without ``num_hidden_layers`` selects nothing.
    """
    layers = decoder_layers(config)
    if layers is None:
        return NameMatch(lambda name: False, ())
    prefix = f"model.layers.{0 if layers == 1 else layers}."
    return NameMatch(lambda name: name.startswith(prefix), (prefix,))


def nextn_layer_multimodal(config: object) -> NameMatch:
    """GLM-5-Next NextN: the layer after the last decoder layer, under either naming.

    ``Glm5NextForConditionalGenerationNextN.load_weights`` keeps ``model.layers.<n>.`` and
    ``model.language_model.layers.<n>.`` with ``n`` the text config's ``num_hidden_layers``
    (no single-layer special case, unlike ``nextn_layer``), and drops every other name.
    """
    layers = decoder_layers(config)
    if layers is None:
        return NameMatch(lambda name: False, ())
    prefixes = (f"model.layers.{layers}.", f"model.language_model.layers.{layers}.")
    return NameMatch(lambda name: name.startswith(prefixes), prefixes)


def decoder_layers(config: object) -> int | None:
    """The config's ``num_hidden_layers`` when it is a positive int, else None."""
    layers = config_value(config, "num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        return None
    return layers


def config_value(config: object, key: str) -> Any:
    """``key`` of a ``CheckpointConfig`` or of a built model's (or a bare) config object,
    looked up at the top level and then in ``text_config``."""
    value = getattr(config, "value", None)
    if callable(value):  # a CheckpointConfig
        return value(key)
    config = getattr(config, "config", config)
    found = getattr(config, key, None)
    if found is None:
        found = getattr(getattr(config, "text_config", None), key, None)
    return found


# -- what travels beside a weight ----------------------------------------------------------------


def attention_quant_kind(name: str) -> str | None:
    """``"FA3"`` or ``"C8"`` for a quantized-attention / KV-cache tensor (``ATTENTION_QUANT``),
    else None; only under a ``self_attn`` block."""
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
    """A weight stored without ``.weight``: Qwen3.5/3.6 fused experts ``experts.gate_up_proj``
    [E, 2I, H] and ``experts.down_proj`` [E, H, I] (any ``*_proj`` last component; which of
    them hold all experts in one tensor is ``is_fused_experts``)."""
    return name.rpartition(".")[2].endswith("_proj")


def fused_companion_base(name: str, names: Mapping[str, object] | set[str]) -> str | None:
    """The fused weight of ``<fused weight>_<suffix>`` (``experts.gate_up_proj_weight_scale``),
    only when that weight is in ``names``, so no other name is ever taken for a companion."""
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


# -- which checkpoint tensors feed a parameter ------------------------------------------------


def tokens(name: str) -> tuple[str, ...]:
    return tuple(t for t in name.split(".") if t not in NEUTRAL_TOKENS)


class NameIndex:
    """Maps sglang parameter names back to the checkpoint names that stream into them.

    Derived from names only (sglang's loaders rename ``mtp.X`` to ``model.X``, drop
    ``self_attn`` and stack q/k/v and gate/up through the class's ``packed_modules_mapping``),
    so it works for any draft class without hooking its loaders.
    """

    def __init__(self, names: Iterable[str], packed: Mapping[str, list[str]] | None = None) -> None:
        self.packed = dict(packed or DEFAULT_PACKED)
        self.by_tokens: dict[tuple[str, ...], list[str]] = {}
        for name in names:
            self.by_tokens.setdefault(tokens(name), []).append(name)

    def sources_of(self, parameter: str) -> list[str]:
        """The checkpoint names behind ``parameter``, in the order sglang stacks them."""
        parts = tokens(parameter)
        if len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in EXPERT_PARTS:
            fused = self.by_tokens.get(parts[:-1] + (FUSED_EXPERTS[parts[-1]],))
            return list(fused or self._expert_sources(parts[:-1], EXPERT_PARTS[parts[-1]]))
        found: list[str] = []
        for i, token in enumerate(parts):
            for part in self.packed.get(token, ()):
                found += self.by_tokens.get(parts[:i] + (part,) + parts[i + 1 :], [])
        return found or list(self.by_tokens.get(parts, []))

    def _expert_sources(self, prefix: tuple[str, ...], projections: tuple[str, ...]) -> list[str]:
        found = []
        for key, names in self.by_tokens.items():
            rest = key[len(prefix) :]
            if (
                key[: len(prefix)] == prefix
                and len(rest) == 3
                and rest[0].isdigit()
                and rest[1] in projections
                and rest[2] == "weight"
            ):
                found += [(int(rest[0]), projections.index(rest[1]), n) for n in names]
        return [n for _, _, n in sorted(found)]
