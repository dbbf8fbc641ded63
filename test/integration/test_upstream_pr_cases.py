"""The CPU cases of the upstream pull request sgl-project/sglang#37736, with our behaviour.

The upstream fix reads ``mtp.*.weight_scale`` from ``quant_model_weights.safetensors.index.json``
and multiplies int8 weights by it inside ``load_weights``. Where we differ: a scale whose shape
does not fit is an error (upstream silently skipped it, loading raw codes), a missing index is
no problem (we read shard headers), and a missing shard is an error (upstream: warning, no-op).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.formats.plan import DequantPlan
from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS
from sglang_mtp_dequant.serving.stream import DequantizingStream
from support.checkpoints import edit_tensors, open_checkpoint
from support.paths import fixture_dir

NAME = "q35_dense_w8a8_dynamic"
SHARD = "quant_model_weights-00001-of-00001.safetensors"
is_mtp = DRAFT_SPECS[0].draft_names(None)


def plan_for(folder: str) -> DequantPlan:
    return DequantPlan.build(open_checkpoint(folder, wanted=is_mtp))


def test_scale_discovery_keyed_by_weight_name():
    plan = plan_for(fixture_dir(NAME))
    entry = plan.entries["mtp.layers.0.self_attn.q_proj.weight"]
    assert entry.action == "dequantize" and entry.scheme == "W8A8_DYNAMIC"
    assert entry.companions["weight_scale"].name == "mtp.layers.0.self_attn.q_proj.weight_scale"
    assert entry.companions["weight_offset"].name == "mtp.layers.0.self_attn.q_proj.weight_offset"
    assert sorted(plan.to_dequantize) == sorted(
        f"mtp.layers.0.{m}.weight"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    )


def test_non_mtp_scales_and_weights_ignored():
    """Backbone int8 weights and scales are the target's business: passed through untouched."""
    folder = fixture_dir(NAME)
    plan = plan_for(folder)
    assert all(name.startswith("mtp.") for name in plan.entries)
    assert all(name.startswith("mtp.") for name in plan.consumed)
    tensors = load_file(os.path.join(folder, SHARD))
    backbone = [(n, t) for n, t in tensors.items() if not n.startswith("mtp.")]
    assert any(n.endswith(".weight_scale") for n, _ in backbone)
    assert any(t.dtype == torch.int8 for _, t in backbone)
    out = list(DequantizingStream(lambda: plan, torch.bfloat16, is_mtp).apply(backbone))
    assert len(out) == len(backbone)
    assert all(a[1] is b[1] for a, b in zip(out, backbone, strict=True))


def test_missing_index_is_fine(copy_checkpoint):
    folder = copy_checkpoint(NAME)
    os.remove(os.path.join(folder, "quant_model_weights.safetensors.index.json"))
    assert len(plan_for(folder).to_dequantize) == 7


def test_exact_bf16_value(load_draft):
    """One element, by hand: bf16(fp32(q) * fp32(scale)) is what lands in the parameter."""
    folder = fixture_dir(NAME)
    tensors = load_file(os.path.join(folder, SHARD))
    q = tensors["mtp.layers.0.self_attn.o_proj.weight"][3, 5]
    scale = tensors["mtp.layers.0.self_attn.o_proj.weight_scale"][3, 0]
    expected = (q.to(torch.float32) * scale.to(torch.float32)).to(torch.bfloat16)
    params = dict(load_draft(folder).named_parameters())
    got = params["model.layers.0.o_proj.weight"][3, 5]
    assert got.view(torch.int16) == expected.view(torch.int16)
    assert abs(float(got)) < 1.0 and abs(int(q)) > 1


def test_shape_mismatch_is_an_error_not_a_no_op(copy_checkpoint):
    """Upstream skipped a misfitting scale (raw codes loaded); here the plan refuses it."""

    folder = copy_checkpoint(NAME)
    edit_tensors(
        os.path.join(folder, SHARD),
        lambda t: t.update({"mtp.layers.0.mlp.up_proj.weight_scale": torch.full((64, 1), 0.01)}),
    )
    plan = plan_for(folder)
    entry = plan.entries["mtp.layers.0.mlp.up_proj.weight"]
    assert entry.action == "error" and "[64, 1]" in entry.reason and "[128, 64]" in entry.reason
    with pytest.raises(ValueError, match="up_proj"):
        plan.raise_first_error()


def upstream_style_load_weights(original):
    """A stand-in for sglang after the upstream fix merges: it dequantizes int8 ``mtp.*``
    weights that have a scale inside ``load_weights`` (the pull request's rule)."""
    tensors = load_file(os.path.join(fixture_dir(NAME), SHARD))

    def load_weights(model, weights, *args, **kwargs):
        def fixed(stream):
            for name, tensor in stream:
                scale = tensors.get(name[: -len("weight")] + "weight_scale")
                if name.startswith("mtp.") and tensor.dtype == torch.int8 and scale is not None:
                    tensor = (tensor.float() * scale.float()).to(torch.bfloat16)
                yield name, tensor

        return original(model, fixed(weights), *args, **kwargs)

    return load_weights


def test_no_double_dequant_when_upstream_fix_is_present(load_draft, sglang_cpu):
    """Our transform runs first and hands bf16; the upstream rule only fires on int8."""
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    from sglang_mtp_dequant.serving.plugin import make_load_weights_hook
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    folder = fixture_dir(NAME)
    expected = dict(load_draft(folder).named_parameters())
    config, model = new_draft(folder)
    upstream = upstream_style_load_weights(Qwen3_5ForCausalLMMTP.load_weights.__wrapped__)
    make_load_weights_hook(DRAFT_SPECS[0])(upstream, model, sglang_weights(config, model))
    for name, param in model.named_parameters():
        if name != "lm_head.weight":
            assert torch.equal(param, expected[name]), name


def test_already_float_weights_pass_through(load_draft, sglang_cpu):
    """If something upstream of the hook already dequantized, nothing is applied twice."""
    folder = fixture_dir(NAME)
    plan = plan_for(folder)
    tensors = load_file(os.path.join(folder, SHARD))
    name = "mtp.layers.0.mlp.down_proj.weight"
    already = (tensors[name].float() * tensors[name + "_scale"].float()).bfloat16()
    stream = DequantizingStream(lambda: plan, torch.bfloat16, is_mtp)
    out = dict(stream.apply([(name, already), (name + "_scale", tensors[name + "_scale"])]))
    assert out[name] is already and stream.stats.already_float == 1
    assert name + "_scale" not in out
