"""A fixture checkpoint resharded the way large exports are: many shards, one index, and
shards of target tensors the draft never reads.

Usage::

    # the fixture's tensors over 3 shards by name, 2 shards of 1000 target tensors before them
    files = write_sharded(fixture_dir(NAME), dest, shard_of=lambda n: 3 if "mtp" in n else 1,
                          filler={2: 1000})
    # an index that is wrong about one tensor: written to shard 2, indexed in its own shard
    write_sharded(..., misplaced={"mtp.fc.weight": 2})

Layout: msmodelslim's V1 saver with a part size (``quant_model_weights-0000i-of-0000n
.safetensors`` and ``quant_model_weights.safetensors.index.json`` with ``metadata.total_size``
and ``weight_map``), the fixture's ``config.json`` and ``quant_model_description.json``, which
lists every tensor as msmodelslim's does. A filler tensor is a W8A8_DYNAMIC expert projection
of the target (``<prefix>.<e>.{gate,up,down}_proj.{weight,weight_scale,weight_offset}``), two
rows by two columns: what a large MoE export holds hundreds of thousands of, and what makes
the draft's load walk them (the cost is per tensor, not per byte).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

import torch
from safetensors.torch import save_file

from support.checkpoints import DESCRIPTION, write_index
from support.reference import description, load_all

V1_STEM = "quant_model_weights"
#: a Qwen3.5 target's routed experts (no "mtp" in the name: the draft's loader drops them)
QWEN35_EXPERTS = "model.language_model.layers.0.mlp.experts"
_PARTS = [
    (p, s) for p in ("gate", "up", "down") for s in ("weight", "weight_scale", "weight_offset")
]


def shard_name(number: int, total: int, stem: str = V1_STEM) -> str:
    return f"{stem}-{number:05d}-of-{total:05d}.safetensors"


def filler_tensors(count: int, prefix: str = QWEN35_EXPERTS, start: int = 0):
    """``count`` tiny W8A8_DYNAMIC expert tensors: ``(name, tensor)``, nine per expert."""
    for i in range(start, start + count):
        expert, part = divmod(i, len(_PARTS))
        proj, suffix = _PARTS[part]
        name = f"{prefix}.{expert}.{proj}_proj.{suffix}"
        if suffix == "weight":
            yield name, torch.ones(2, 2, dtype=torch.int8)
        else:
            yield name, torch.full((2, 1), 0.5 if suffix == "weight_scale" else 0.0)


def write_sharded(
    source: str,
    dest: str,
    shard_of: Callable[[str], int],
    *,
    filler: dict[int, int] | None = None,
    filler_prefix: str = QWEN35_EXPERTS,
    misplaced: dict[str, int] | None = None,
    stem: str = V1_STEM,
) -> list[str]:
    """The fixture ``source`` rewritten into ``dest`` over numbered shards (see the module
    docstring); returns the shard paths in order.

    ``shard_of(name)`` is the 1-based shard of each fixture tensor; ``filler`` maps a shard to
    how many target tensors it gets besides; ``misplaced`` writes a tensor into another shard
    while the index keeps ``shard_of``'s (an index that is wrong about it).
    """
    filler, misplaced = dict(filler or {}), dict(misplaced or {})
    tensors, desc = load_all(source), description(source)
    indexed = {name: shard_of(name) for name in tensors}
    written = {name: misplaced.get(name, shard) for name, shard in indexed.items()}
    total = max([*written.values(), *indexed.values(), *filler, 1])
    os.makedirs(dest, exist_ok=True)
    for entry in os.listdir(source):
        if entry.endswith(".json") and not entry.endswith(".index.json") and entry != DESCRIPTION:
            path = os.path.join(source, entry)
            if os.path.isfile(path):
                shutil.copyfile(path, os.path.join(dest, entry))
    weight_map: dict[str, str] = {}
    size = 0
    start = 0
    paths = []
    for number in range(1, total + 1):
        shard = shard_name(number, total, stem)
        content = {n: t.contiguous() for n, t in tensors.items() if written[n] == number}
        for name, tensor in filler_tensors(filler.get(number, 0), filler_prefix, start):
            content[name] = tensor
            desc[name] = "W8A8_DYNAMIC"
            weight_map[name] = shard
        start += filler.get(number, 0)
        weight_map.update({n: shard for n, s in indexed.items() if s == number})
        size += sum(t.numel() * t.element_size() for t in content.values())
        path = os.path.join(dest, shard)
        save_file(content, path, metadata={"format": "pt"})
        paths.append(path)
    write_index(dest, weight_map, size, f"{stem}.safetensors.index.json")
    with open(os.path.join(dest, DESCRIPTION), "w") as handle:
        json.dump(desc, handle, indent=4)  # as msmodelslim writes it (its index: indent=2)
    return paths
