"""``formats/description.py`` on the description msmodelslim's Qwen3.6-27B recipe wrote for the
bundled hybrid model (``test/fixtures/e2e/hybrid_qwen36_recipe``) and on hand-made variants."""

from __future__ import annotations

import json
import os

from sglang_mtp_dequant.formats.description import (
    ShardScheme,
    is_quantized,
    quantized_leaves,
    shard_schemes,
)
from support.paths import E2E

GDN = "model.layers.0.linear_attn."


def description() -> dict[str, object]:
    path = os.path.join(E2E, "hybrid_qwen36_recipe", "quant_model_description.json")
    with open(path) as handle:
        return json.load(handle)


def test_the_qwen36_recipe_quantizes_in_proj_qkv_and_z_only():
    leaves = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}
    assert quantized_leaves(description(), leaves) == {"in_proj_qkv", "in_proj_z"}


def test_shard_schemes_read_each_weight_entry():
    shards = shard_schemes(description(), [GDN + "in_proj_qkv", GDN + "in_proj_z", GDN + "nope"])
    assert shards == [
        ShardScheme(GDN + "in_proj_qkv", "W8A8_DYNAMIC"),
        ShardScheme(GDN + "in_proj_z", "W8A8_DYNAMIC"),
        ShardScheme(GDN + "nope", None),
    ]
    assert [s.quantized for s in shards] == [True, True, False]
    assert str(shards[2]) == f"{GDN}nope (no entry)"


def test_float_empty_and_non_strings_are_not_quantized():
    assert not any(is_quantized(v) for v in ("FLOAT", "", None, 0, {"a": 1}))
    assert all(is_quantized(v) for v in ("W8A8", "W8A16", "W4A4_MXFP4"))


def test_quantized_leaves_ignores_scales_global_keys_and_float_entries():
    made = {
        "model_quant_type": "W8A8_DYNAMIC",
        "a.in_proj_b.weight": "FLOAT",
        "a.in_proj_a.weight_scale": "W8A8_DYNAMIC",  # not a weight entry
        "b.in_proj_qkv.weight": "W8A16",
        "version": "1.0.0",
    }
    assert quantized_leaves(made, {"in_proj_b", "in_proj_a", "in_proj_qkv"}) == {"in_proj_qkv"}
    assert quantized_leaves(made, set()) == set()
