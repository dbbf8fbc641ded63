"""Checkpoint naming rules (formats/naming.py), on names as real exports spell them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_mtp_dequant.formats import naming


def test_mtp_prefix_takes_every_name_the_mtp_class_processes():
    """Qwen3.5's MTP ``load_weights`` processes every name containing ``mtp``; so does the rule."""
    rule = naming.mtp_prefix()
    assert rule("mtp.layers.0.self_attn.q_proj.weight") and rule("mtp.fc.weight")
    assert rule("model.language_model.mtp.fc.weight")
    assert not rule("model.layers.0.self_attn.q_proj.weight")
    assert not rule("lm_head.weight")


def test_nextn_layer_is_the_layer_after_the_last_decoder_layer():
    rule = naming.nextn_layer(SimpleNamespace(num_hidden_layers=78))
    assert rule("model.layers.78.mlp.experts.3.up_proj.weight")
    assert rule("model.layers.78.shared_head.head.weight")
    assert not rule("model.layers.77.mlp.experts.3.up_proj.weight")
    assert not rule("model.layers.780.mlp.gate.weight")


@pytest.mark.parametrize(
    "name, split",
    [
        ("mtp.fc.weight_scale", ("mtp.fc", "weight_scale")),
        (
            "model.layers.78.self_attn.q_a_proj.deq_scale",
            ("model.layers.78.self_attn.q_a_proj", "deq_scale"),
        ),  # noqa: E501
        (
            "mtp.layers.0.mlp.up_proj.weight_dual_scale",
            ("mtp.layers.0.mlp.up_proj", "weight_dual_scale"),
        ),  # noqa: E501
        ("mtp.fc.weight", None),
        ("mtp.fc.bias", None),
    ],
)
def test_split_companion(name, split):
    assert naming.split_companion(name) == split


def test_companions_of_a_weight_name_every_suffix_a_scheme_reads():
    found = naming.companion_names("mtp.layers.0.mlp.up_proj.weight")
    assert set(found) == set(naming.COMPANION_SUFFIXES)
    assert found["weight_scale"][0] == "mtp.layers.0.mlp.up_proj.weight_scale"


def test_a_companion_is_one_only_beside_its_weight():
    names = {"mtp.fc.weight", "mtp.fc.weight_scale", "mtp.orphan.weight_scale"}
    assert naming.is_companion("mtp.fc.weight_scale", names)
    assert not naming.is_companion("mtp.fc.weight", names)


@pytest.mark.parametrize(
    "name, expert",
    [
        ("mtp.layers.0.mlp.experts.17.up_proj.weight", 17),
        ("model.layers.61.mlp.experts.0.down_proj.weight_scale", 0),
        ("mtp.layers.0.mlp.shared_expert.up_proj.weight", None),
        ("mtp.layers.0.mlp.experts.gate_up_proj", None),
    ],
)
def test_expert_id(name, expert):
    assert naming.expert_id(name) == expert


def test_fused_experts_are_told_from_per_expert_names():
    assert naming.is_fused_experts("mtp.layers.0.mlp.experts.gate_up_proj")
    assert not naming.is_fused_experts("mtp.layers.0.mlp.experts.3.up_proj.weight")


@pytest.mark.parametrize(
    "name, kind",
    [
        ("mtp.layers.0.self_attn.fa_q.scale", "FA3"),
        ("mtp.layers.0.self_attn.fa_k.offset", "FA3"),
        ("mtp.layers.0.self_attn.k_proj.kv_cache_scale", "C8"),
        ("mtp.layers.0.self_attn.v_proj.kv_cache_offset", "C8"),
        ("mtp.layers.0.self_attn.k_proj.weight_scale", None),
    ],
)
def test_attention_quantization_tensors_are_named(name, kind):
    got = naming.attention_quant_kind(name)
    assert (got is None) == (kind is None)
    if kind is not None:
        assert kind in got
