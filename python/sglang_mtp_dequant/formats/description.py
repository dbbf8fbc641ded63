"""What a ModelSlim description says: the one reader, one FLOAT, per-shard and per-layer answers.

Usage::

    described = read_description("/models/Qwen3.5-27B-w8a8")   # Description (file None: none)
    described.type_of("mtp.fc.weight")                         # "W8A8_DYNAMIC"
    scheme_of(described.entries, "model.layers.0.mlp.down_proj")  # the ``.weight`` entry's type
    shard_schemes(described.entries, ["...in_proj_qkv", "...in_proj_z"])   # [ShardScheme, ...]
    draft_layers(described.entries)("model.layers.92.mlp.experts.0.up_proj.weight")   # True
    described_as(described.entries, "model.decoder.mlp.experts")   # "model.layers.92.mlp.experts"
    moe_layer_plan(described.entries, is_draft)  # FusedMoE layers all FLOAT, part FLOAT, quantized

Why one home: the plan, the serving hooks, the doctor, verify, the harness and the benchmarks
ask the description the same questions; each answer is written here once.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import not_

from ..errors import CheckpointFormatError
from .config import load_json
from .naming import NameRule, mtp_prefix

DESCRIPTION_NAME = "quant_model_description.json"
#: the description's type for a tensor stored as is
FLOAT = "FLOAT"
WEIGHT = ".weight"
RESTORE_DESCRIPTION = "restore the quant_model_description.json msmodelslim wrote"


@dataclass(frozen=True)
class Description:
    """A parsed description: tensor types, and the entries that are no tensor type."""

    file: str | None = None  # None: the folder has no description
    entries: dict[str, str] = field(default_factory=dict)  # tensor -> FLOAT, W8A8_DYNAMIC, ...
    flags: dict[str, object] = field(default_factory=dict)  # is_rot_used, metadata, ...
    group_size: int = 0
    version: str | None = None  # "1.0.0" from msmodelslim's V1 saver: int4 packing depends on it

    def type_of(self, name: str) -> str | None:
        return self.entries.get(name)


def read_description(folder: str) -> Description:
    """The folder's ``quant_model_description*.json`` (the exact name first), parsed; a file
    that is no object of tensor types, or a bad ``group_size``: ``CheckpointFormatError``."""
    candidates = sorted(glob.glob(os.path.join(folder, "quant_model_description*.json")))
    if not candidates:
        return Description()
    exact = os.path.join(folder, DESCRIPTION_NAME)
    path = exact if exact in candidates else candidates[0]
    raw = load_json(path, "a ModelSlim quant_model_description", RESTORE_DESCRIPTION)
    if not isinstance(raw, dict):
        raise CheckpointFormatError(
            file=path,
            problem=f"holds a JSON {type(raw).__name__}, not an object of tensor types",
            hint=RESTORE_DESCRIPTION,
        )
    group_size = raw.get("group_size", 0)
    # it lists every tensor: split in C-level passes, the few flags popped out of it
    is_type = list(map(isinstance, raw.values(), repeat(str)))
    keys = [] if all(is_type) else list(compress(raw, map(not_, is_type)))
    flags = {k: raw.pop(k) for k in keys}
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 0:
        raise CheckpointFormatError(
            file=path,
            problem=f"group_size is {group_size!r}, not a non-negative integer",
            hint=RESTORE_DESCRIPTION,
        )
    return Description(path, raw, flags, group_size, raw.get("version"))


def is_quantized(scheme: object) -> bool:
    """A description type that stores codes rather than the tensor itself."""
    return isinstance(scheme, str) and scheme not in ("", FLOAT)


def scheme_of(description: Mapping[str, object], prefix: str) -> str | None:
    """The description's type for ``prefix.weight``, or None."""
    value = description.get(prefix + WEIGHT)
    return value if isinstance(value, str) else None


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


def shard_schemes(description: Mapping[str, object], prefixes: Iterable[str]) -> list[ShardScheme]:
    """Each checkpoint prefix with its weight's type (the prefixes already resolved)."""
    return [ShardScheme(prefix, scheme_of(description, prefix)) for prefix in prefixes]


def quantized_leaves(description: Mapping[str, object], leaves: Collection[str]) -> set[str]:
    """The names among ``leaves`` that end the prefix of at least one quantized weight entry."""
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


#: the module sglang's NextN draft classes build their layer as (off DeepSeek's NPU naming)
NEXTN_MODULE = "model.decoder"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def nextn_layer_of(description: Mapping[str, object]) -> str | None:
    """``model.layers.<n>`` of the NextN draft layer of a description with no ``mtp`` name: the
    highest layer it lists, the one after the target's last; else None."""
    highest = -1
    for name in description:
        if "mtp" in name:
            return None
        match = _LAYER.match(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return f"model.layers.{highest}" if highest >= 0 else None


def draft_layers(description: Mapping[str, object]) -> NameRule:
    """Which description entries (and sglang prefixes) are the draft's: every ``mtp`` name, else
    the NextN layer's, under its checkpoint name or sglang's ``model.decoder``."""
    nextn = nextn_layer_of(description)
    if nextn is None:
        return mtp_prefix()
    prefixes = (f"{nextn}.", f"{NEXTN_MODULE}.")
    return lambda name: f"{name}.".startswith(prefixes)


def described_as(description: Mapping[str, object], prefix: str) -> str:
    """The description's prefix for a layer sglang builds as ``prefix``: a NextN draft's
    ``model.decoder.X`` is ``model.layers.<n>.X``, as sglang's loader maps it; else itself."""
    if not f"{prefix}.".startswith(f"{NEXTN_MODULE}."):
        return prefix
    nextn = nextn_layer_of(description)
    return prefix if nextn is None else nextn + prefix[len(NEXTN_MODULE) :]


#: the expert projection names sglang's ``get_moe_scheme`` tries, in its order: (gate, up, down)
NAMING_CONVENTIONS: tuple[tuple[str, str, str], ...] = (
    ("gate_proj", "up_proj", "down_proj"),
    ("w1", "w3", "w2"),
)
#: a routed expert's projection entry: (layer, expert, projection)
EXPERT_ENTRY = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


@dataclass(frozen=True)
class ExpertPrecision:
    """The description's schemes for one FusedMoE layer's expert projections."""

    layer: str  # the prefix sglang builds the layer with
    schemes: Mapping[str, str] = field(default_factory=dict)  # entry -> scheme, every one listed

    @property
    def float_entries(self) -> list[str]:
        return [name for name, scheme in self.schemes.items() if scheme == FLOAT]

    @property
    def quantized_entries(self) -> list[str]:
        return [name for name, scheme in self.schemes.items() if scheme != FLOAT]

    @property
    def all_float(self) -> bool:
        """Every projection of every expert the description lists is FLOAT (and it lists some)."""
        return bool(self.schemes) and not self.quantized_entries

    @property
    def mixed(self) -> bool:
        return bool(self.float_entries) and bool(self.quantized_entries)

    def summary(self) -> str:
        quantized = sorted(set(self.schemes[n] for n in self.quantized_entries))
        return (
            f"{self.layer}: {len(self.float_entries)} expert projection(s) FLOAT "
            f"(e.g. {self.float_entries[0]}), {len(self.quantized_entries)} "
            f"{'/'.join(quantized)} (e.g. {self.quantized_entries[0]})"
        )


def expert_entries(
    description: Mapping[str, object],
    layer: str,
    num_experts: int,
    resolve: Callable[[str], str] = str,
) -> dict[str, str]:
    """Description entry -> scheme of every ``layer.<e>.<proj>.weight`` listed, for the first
    naming convention that lists expert 0 (as ``get_moe_scheme`` picks it); ``resolve`` maps a
    module prefix to the one its entry is stored under (sglang's ``_resolve_quant_prefix``)."""
    for names in NAMING_CONVENTIONS:
        found: dict[str, str] = {}
        for expert in range(num_experts):
            for proj in names:
                key = f"{resolve(f'{layer}.{expert}.{proj}')}.weight"
                scheme = description.get(key)
                if isinstance(scheme, str):
                    found[key] = scheme
        if any(key.endswith(f".0.{names[0]}.weight") for key in found):
            return found
    return {}


@dataclass(frozen=True)
class MoeLayerPlan:
    """What the plugin does with each FusedMoE layer of a ModelSlim build (F2 / F4)."""

    built_unquantized: tuple[str, ...]  # all experts FLOAT: sglang's unquantized MoE method
    refused: tuple[ExpertPrecision, ...]  # part FLOAT: the start-up stops
    stock: tuple[str, ...]  # left to sglang (quantized, or not described)

    @property
    def stock_fails(self) -> tuple[str, ...]:
        """Layers stock sglang stops at (any FLOAT expert entry reaches ``get_moe_scheme``)."""
        return (*self.built_unquantized, *(p.layer for p in self.refused))

    def target_stops(self, is_draft: NameRule) -> tuple[str, ...]:
        """The target's layers of ``stock_fails``: stock sglang stops there in every launch form
        (the target is built with ModelSlim in all four)."""
        return tuple(layer for layer in self.stock_fails if not is_draft(f"{layer}."))


def moe_layers(description: Mapping[str, object]) -> list[tuple[str, int]]:
    """``(layer, experts)`` of every routed-expert layer the description lists per expert, in
    its order; ``experts``: one more than the highest expert index listed."""
    highest: dict[str, int] = {}
    for name in description:
        match = EXPERT_ENTRY.match(name) if isinstance(name, str) else None
        if match:
            layer, expert = match.group(1), int(match.group(2))
            highest[layer] = max(highest.get(layer, -1), expert)
    return [(layer, top + 1) for layer, top in highest.items()]


def moe_layer_plan(
    description: Mapping[str, object], layers: Iterable[tuple[str, int]] | None = None
) -> MoeLayerPlan:
    """The FLOAT-layer hook's decision (``serving/float_layers.py``) for each ``(prefix,
    num_experts)`` FusedMoE layer (default: every one ``moe_layers`` finds)."""
    if layers is None:
        layers = moe_layers(description)
    unquantized: list[str] = []
    refused: list[ExpertPrecision] = []
    stock: list[str] = []
    for layer, num_experts in layers:
        precision = ExpertPrecision(layer, expert_entries(description, layer, num_experts))
        if precision.mixed:
            refused.append(precision)
        elif precision.all_float:
            unquantized.append(layer)
        else:
            stock.append(layer)
    return MoeLayerPlan(tuple(unquantized), tuple(refused), tuple(stock))
