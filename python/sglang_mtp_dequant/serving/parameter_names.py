"""How sglang names a draft's parameters, and which checkpoint tensors stream into each.

Usage::

    tokens("model.layers.0.self_attn.o_proj.weight")      # ("layers", "0", "o_proj", "weight")
    NameIndex(checkpoint_names).sources_of("model.layers.0.qkv_proj.weight")
    # -> ["mtp.layers.0.self_attn.q_proj.weight", "...k_proj.weight", "...v_proj.weight"]

Why in serving/: parameter names are sglang's; ``formats/`` knows checkpoints only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: name tokens sglang's draft loaders add or drop between checkpoint and parameter names
NEUTRAL_TOKENS = frozenset({"model", "mtp", "language_model", "self_attn"})
#: FusedMoE parameters and the per-expert checkpoint projections stacked into them
EXPERT_PARTS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}
#: the same, when the checkpoint stores all experts fused in one tensor (no ``.weight``)
FUSED_EXPERTS = {"w13_weight": "gate_up_proj", "w2_weight": "down_proj"}
#: stacked parameters and their checkpoint parts where a class declares none (the MLA drafts'
#: loaders concatenate q_a and kv_a either way)
DEFAULT_PACKED = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
    "fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"],
}


def tokens(name: str) -> tuple[str, ...]:
    """``name``'s dot-separated tokens without those sglang's loaders add or drop."""
    return tuple(t for t in name.split(".") if t not in NEUTRAL_TOKENS)


class NameIndex:
    """Maps sglang parameter names back to the checkpoint names that stream into them, from
    names only (as sglang's loaders rename, drop ``self_attn`` and stack q/k/v and gate/up)."""

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
