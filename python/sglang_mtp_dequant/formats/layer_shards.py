"""Which shards of one linear layer a ModelSlim description quantizes, and with which scheme.

Usage::

    shards = shard_schemes(description, ["model.layers.0.linear_attn.in_proj_qkv",
                                         "model.layers.0.linear_attn.in_proj_z"])
    [s for s in shards if s.quantized]          # ShardScheme(name=..., scheme="W8A8_DYNAMIC")
    quantized_leaves(description, {"in_proj_qkv", "in_proj_z", "in_proj_b"})
    # -> {"in_proj_qkv", "in_proj_z"}: the leaf names with a quantized ``.weight`` entry

Why here: ``quant_model_description.json`` says, per checkpoint tensor, ``FLOAT`` or a quantized
type (``W8A8_DYNAMIC``, ``W8A16``, ...); whether a layer sglang fuses from several checkpoint
projections holds quantized codes is a question about that description alone, asked both by
the server (on sglang's parsed copy, ``serving/target_layers.py``) and by the CLI. No tensor is
read; nothing of sglang is imported.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

#: the description's type for a tensor stored as is
FLOAT = "FLOAT"
WEIGHT = ".weight"


@dataclass(frozen=True)
class ShardScheme:
    """One checkpoint projection of a layer and the description's type for its weight."""

    name: str  # the checkpoint prefix, e.g. model.layers.0.linear_attn.in_proj_qkv
    scheme: str | None  # None: the description has no entry for ``name.weight``

    @property
    def quantized(self) -> bool:
        return is_quantized(self.scheme)

    def __str__(self) -> str:
        return f"{self.name} ({self.scheme or 'no entry'})"


def is_quantized(scheme: object) -> bool:
    """A description type that stores codes rather than the tensor itself."""
    return isinstance(scheme, str) and scheme not in ("", FLOAT)


def scheme_of(description: Mapping[str, object], prefix: str) -> str | None:
    """The description's type for ``prefix.weight``, or None."""
    value = description.get(prefix + WEIGHT)
    return value if isinstance(value, str) else None


def shard_schemes(description: Mapping[str, object], prefixes: Iterable[str]) -> list[ShardScheme]:
    """Each checkpoint prefix with its weight's type (the prefixes already resolved)."""
    return [ShardScheme(prefix, scheme_of(description, prefix)) for prefix in prefixes]


def quantized_leaves(description: Mapping[str, object], leaves: Collection[str]) -> set[str]:
    """The names among ``leaves`` that end the prefix of at least one quantized weight entry.

    One pass over the description's keys, one ``str.endswith`` each (the leaves' suffixes at
    once); only a key that ends in one of them is looked at further."""
    wanted = frozenset(leaves)
    suffixes = tuple(f".{leaf}{WEIGHT}" for leaf in wanted)
    found: set[str] = set()
    if not suffixes:
        return found
    for key in description:
        if not key.endswith(suffixes) or not is_quantized(description[key]):
            continue
        found.add(key[: -len(WEIGHT)].rpartition(".")[2])
        if len(found) == len(wanted):
            break
    return found
