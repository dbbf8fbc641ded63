"""A MoE ModelSlim export whose MTP routed experts are FLOAT, derived from the e2e fixtures.

Usage::

    folder = float_experts_copy(str(tmp_path / "moe_float_experts"))

What it is: ``test/fixtures/e2e/moe_w8a8`` (msmodelslim's W8A8_DYNAMIC layout of the trained
tiny Qwen3.5-MoE) with the MTP layer's routed experts stored as msmodelslim stores a layer its
recipe excludes, as published Qwen3.6-35B-A3B exports do for their MTP experts: the float
originals (bf16, from ``test/fixtures/e2e/moe_float``), no ``weight_scale`` / ``weight_offset``,
``FLOAT`` in ``quant_model_description.json`` and the index rewritten. Everything else (the
attention, the shared expert, the target) stays W8A8_DYNAMIC. Derived, not written by
msmodelslim: the tests' stand-in until the e2e fixture ``moe_float_experts`` is committed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

from safetensors.torch import load_file, save_file

from support.checkpoints import DESCRIPTION, METADATA, write_index
from support.paths import E2E

#: an MTP routed expert's projection weight or companion
MTP_EXPERT = re.compile(r"^mtp\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.")
SOURCE = os.path.join(E2E, "moe_w8a8")
FLOATS = os.path.join(E2E, "moe_float")


def float_experts_copy(dest: str) -> str:
    """Write the derived checkpoint into ``dest`` (a new folder) and return it."""
    shutil.copytree(SOURCE, dest)
    for path in glob.glob(os.path.join(dest, "*")):
        os.chmod(path, 0o644)
    floats = load_file(os.path.join(FLOATS, "model.safetensors"))
    (shard,) = glob.glob(os.path.join(dest, "quant_model_weights-*.safetensors"))
    tensors = load_file(shard)
    for name in [n for n in tensors if MTP_EXPERT.match(n)]:
        del tensors[name]
    tensors.update(
        {n: t for n, t in floats.items() if MTP_EXPERT.match(n) and n.endswith(".weight")}
    )
    save_file(tensors, shard, metadata=METADATA)
    _describe_float(dest, set(tensors))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    write_index(dest, {n: os.path.basename(shard) for n in sorted(tensors)}, size)
    return dest


def _describe_float(folder: str, kept: set[str]) -> None:
    path = os.path.join(folder, DESCRIPTION)
    with open(path) as handle:
        description = json.load(handle)
    for name in list(description):
        if MTP_EXPERT.match(name):
            if name in kept:
                description[name] = "FLOAT"
            else:
                del description[name]
    with open(path, "w") as handle:
        json.dump(description, handle, indent=2)
