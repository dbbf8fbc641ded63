"""MoE drafts (Qwen3.5/3.6-MoE): routed experts, fused experts, shared expert and its gate.

Real: the msmodelslim 26.1.0 checkpoint ``q35moe_w8a8_dynamic`` (per-expert
``mtp.layers.0.mlp.experts.N.{gate,up,down}_proj`` with (out, 1) scales), sglang's
``Qwen3_5ForCausalLMMTP`` built with the fixture's own ``Qwen3_5MoeConfig`` (FusedMoE
``w13_weight`` / ``w2_weight``), and sglang's weight iterator.

Built here from that checkpoint, because msmodelslim cannot write them on this machine:
- the variant whose recipe also quantizes the shared expert, its gate and ``o_proj``
  (quantized below in ModelSlim's W8A8_DYNAMIC format from the checkpoint's own float tensors);
- the Qwen3.6 fused layout ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
  [E, H, I] with (E, out, 1) scales, made by stacking the tool's per-expert codes;
- int4 (W4A8_DYNAMIC) fused experts, packed with msmodelslim's packing algorithm.
"""

from __future__ import annotations

import json
import os
import weakref

import pytest
import torch
from safetensors.torch import load_file

from support.checkpoints import edit_description, edit_tensors
from support.paths import fixture_dir, reference_file
from support.reference import (
    dequantize_fp32,
    dequantize_int4_fp32,
    load_all,
    pack_int4_rows,
    quantize_w8a8_dynamic,
)

MOE = "q35moe_w8a8_dynamic"
EXPERTS = 4
LAYER = "mtp.layers.0"
W13 = "model.layers.0.mlp.experts.w13_weight"
W2 = "model.layers.0.mlp.experts.w2_weight"


def bf16(tensors: dict, name: str) -> torch.Tensor:
    return dequantize_fp32(tensors, name, "W8A8_DYNAMIC").bfloat16()


def expert(e: int, proj: str) -> str:
    return f"{LAYER}.mlp.experts.{e}.{proj}.weight"


def edit_checkpoint(folder: str, edit) -> None:
    """Rewrite the fixture copy's one shard and its description through ``edit(tensors, desc)``."""
    shard = "quant_model_weights-00001-of-00001.safetensors"
    names: list[str] = []

    def both(tensors):
        edit_description(folder, lambda desc: edit(tensors, desc))
        names.extend(tensors)

    edit_tensors(os.path.join(folder, shard), both)
    index_path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"] = dict.fromkeys(names, shard)
    with open(index_path, "w") as handle:
        json.dump(index, handle)


# -- the tool's per-expert checkpoint ---------------------------------------------------------


def test_routed_experts_bit_identical_to_fp32_dequant(load_draft):
    folder = fixture_dir(MOE)
    tensors = load_all(folder)
    params = dict(load_draft(folder).named_parameters())
    for e in range(EXPERTS):
        gate_up = torch.cat(
            [bf16(tensors, expert(e, "gate_proj")), bf16(tensors, expert(e, "up_proj"))]
        )
        assert torch.equal(params[W13][e], gate_up), f"w13_weight[{e}]"
        assert torch.equal(params[W2][e], bf16(tensors, expert(e, "down_proj"))), f"w2_weight[{e}]"
    qkv = torch.cat([bf16(tensors, f"{LAYER}.self_attn.{p}_proj.weight") for p in "qkv"])
    assert torch.equal(params["model.layers.0.qkv_proj.weight"], qkv)


def test_routed_experts_within_quantization_error_of_original(load_draft):
    """CHECK.txt: msmodelslim's bf16 RTN errs up to 0.749 step; plus the bf16 parameter."""
    folder = fixture_dir(MOE)
    tensors, original = load_all(folder), load_file(reference_file(MOE))
    params = dict(load_draft(folder).named_parameters())
    for e in range(EXPERTS):
        for proj, param, rows in (
            ("gate_proj", W13, slice(0, 32)),
            ("up_proj", W13, slice(32, 64)),
            ("down_proj", W2, slice(None)),
        ):
            name = expert(e, proj)
            w = original[name].float()
            step = tensors[name[: -len(".weight")] + ".weight_scale"].float()
            got = params[param][e][rows].float()
            assert ((got - w).abs() - (0.75 * step + w.abs() * 2.0**-8)).max() <= 0, name


def test_stock_sglang_loads_raw_expert_codes(load_draft):
    """The bug, measured: stock w13/w2 hold the int8 codes (absmax 128)."""
    params = dict(load_draft(fixture_dir(MOE), plugin=False).named_parameters())
    assert params[W13].abs().max().item() >= 100 and params[W2].abs().max().item() >= 100


def test_router_and_float_parts_untouched(load_draft):
    folder = fixture_dir(MOE)
    stock = dict(load_draft(folder, plugin=False).named_parameters())
    plugin = dict(load_draft(folder).named_parameters())
    for name in (
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.shared_expert.gate_up_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.0.o_proj.weight",
        "fc.weight",
    ):
        assert torch.equal(stock[name], plugin[name]), name
    assert torch.equal(
        plugin["model.layers.0.mlp.gate.weight"], load_all(folder)[f"{LAYER}.mlp.gate.weight"]
    )


# -- shared expert, its gate and o_proj quantized too ----------------------------------------

EXTRA_QUANTIZED = {
    f"{LAYER}.mlp.shared_expert.gate_proj.weight": (
        "model.layers.0.mlp.shared_expert.gate_up_proj.weight",
        slice(0, 64),
    ),
    f"{LAYER}.mlp.shared_expert.up_proj.weight": (
        "model.layers.0.mlp.shared_expert.gate_up_proj.weight",
        slice(64, 128),
    ),
    f"{LAYER}.mlp.shared_expert.down_proj.weight": (
        "model.layers.0.mlp.shared_expert.down_proj.weight",
        slice(None),
    ),
    f"{LAYER}.mlp.shared_expert_gate.weight": (
        "model.layers.0.mlp.shared_expert_gate.weight",
        slice(None),
    ),
    f"{LAYER}.self_attn.o_proj.weight": ("model.layers.0.o_proj.weight", slice(None)),
}


def quantize_shared_expert(tensors: dict, desc: dict) -> None:
    for name in EXTRA_QUANTIZED:
        base = name[: -len(".weight")]
        for suffix, value in quantize_w8a8_dynamic(tensors.pop(name).float()).items():
            tensors[f"{base}.{suffix}"] = value
            desc[f"{base}.{suffix}"] = "W8A8_DYNAMIC"


def test_shared_expert_gate_and_o_proj_quantized(load_draft, copy_checkpoint, caplog):
    folder = copy_checkpoint(MOE)
    edit_checkpoint(folder, quantize_shared_expert)
    tensors, original = load_all(folder), load_all(fixture_dir(MOE))
    params = dict(load_draft(folder).named_parameters())
    for name, (param, rows) in EXTRA_QUANTIZED.items():
        got = params[param].detach()[rows]
        assert torch.equal(got, bf16(tensors, name)), name
        # fp32 RTN: half a step, plus the bf16 rounding of the parameter
        w = original[name].float()
        step = tensors[name[: -len(".weight")] + ".weight_scale"].float()
        assert ((got.float() - w).abs() - (0.5 * step + w.abs() * 2.0**-8)).max() <= 1e-7, name
    message = [r for r in caplog.records if r.name == "sglang_mtp_dequant"][-1].getMessage()
    assert "(W8A8_DYNAMIC x20)" in message and "40 companion tensors consumed" in message
    stock = dict(load_draft(folder, plugin=False).named_parameters())
    assert stock["model.layers.0.mlp.shared_expert_gate.weight"].abs().max() >= 100


# -- the fused (Qwen3.6) layout --------------------------------------------------------------

FUSED_GATE_UP = f"{LAYER}.mlp.experts.gate_up_proj"
FUSED_DOWN = f"{LAYER}.mlp.experts.down_proj"


def fuse_experts(separator: str):
    """Per-expert codes and scales stacked into [E, 2I, H] / [E, H, I] and (E, out, 1)."""

    def edit(tensors: dict, desc: dict) -> None:
        for fused, parts in (
            (FUSED_GATE_UP, ("gate_proj", "up_proj")),
            (FUSED_DOWN, ("down_proj",)),
        ):
            for suffix in ("weight", "weight_scale", "weight_offset"):
                stacked = torch.stack(
                    [
                        torch.cat(
                            [tensors.pop(expert(e, p)[: -len("weight")] + suffix) for p in parts]
                        )
                        for e in range(EXPERTS)
                    ]
                )
                name = fused if suffix == "weight" else f"{fused}{separator}{suffix}"
                tensors[name] = stacked
                desc[name] = "W8A8_DYNAMIC"
        for key in [k for k in desc if ".mlp.experts." in k and k.split(".")[4].isdigit()]:
            del desc[key]

    return edit


@pytest.mark.parametrize(
    "separator", [".", "_"], ids=["gate_up_proj.weight_scale", "gate_up_proj_weight_scale"]
)
def test_fused_experts_load_like_per_expert(load_draft, copy_checkpoint, separator):
    folder = copy_checkpoint(MOE)
    edit_checkpoint(folder, fuse_experts(separator))
    tensors = load_all(folder)
    assert (
        tensors[FUSED_GATE_UP].shape == (EXPERTS, 64, 64)
        and tensors[FUSED_GATE_UP].dtype == torch.int8
    )
    params = dict(load_draft(folder).named_parameters())
    per_expert = dict(load_draft(fixture_dir(MOE)).named_parameters())
    for param in (W13, W2):
        assert torch.equal(params[param], per_expert[param]), param
    for fused, param in ((FUSED_GATE_UP, W13), (FUSED_DOWN, W2)):
        scale = tensors[f"{fused}{separator}weight_scale"]
        want = (
            (tensors[fused].float() - tensors[f"{fused}{separator}weight_offset"]) * scale
        ).bfloat16()
        assert torch.equal(params[param], want), param


def test_stock_sglang_cannot_load_quantized_fused_experts(load_draft, copy_checkpoint):
    """Stock maps ``experts.gate_up_proj.weight_scale`` to a FusedMoE parameter that does not
    exist: KeyError. The plugin consumes those companions before sglang sees them."""
    folder = copy_checkpoint(MOE)
    edit_checkpoint(folder, fuse_experts("."))
    with pytest.raises(KeyError, match=r"experts\.w(13|2)_weight\.weight_"):
        load_draft(folder, plugin=False)


def int4_fused_experts(tensors: dict, desc: dict) -> None:
    """W4A8_DYNAMIC fused experts as msmodelslim's V1 saver would write them: symmetric int4
    per channel (scale = max|w| / 7), packed along out per expert, zero offset, scale_bias."""
    fuse_experts(".")(tensors, desc)
    original = load_file(reference_file(MOE))
    for fused, parts in ((FUSED_GATE_UP, ("gate_proj", "up_proj")), (FUSED_DOWN, ("down_proj",))):
        w = torch.stack(
            [torch.cat([original[expert(e, p)].float() for p in parts]) for e in range(EXPERTS)]
        )
        scale = w.abs().amax(-1, keepdim=True) / 7
        q = torch.clamp(torch.round(w / scale), -8, 7)
        tensors[fused] = pack_int4_rows(q)
        tensors[fused + ".weight_scale"] = scale
        tensors[fused + ".weight_offset"] = torch.zeros_like(scale)
        tensors[fused + ".scale_bias"] = 8 * (q * scale).sum(-1, keepdim=True)
        for suffix in ("", ".weight_scale", ".weight_offset", ".scale_bias"):
            desc[fused + suffix] = "W4A8_DYNAMIC"


def test_int4_fused_experts(load_draft, copy_checkpoint):
    folder = copy_checkpoint(MOE)
    edit_checkpoint(folder, int4_fused_experts)
    tensors = load_all(folder)
    assert tensors[FUSED_GATE_UP].shape == (EXPERTS, 32, 64)  # two codes a byte along out
    params = dict(load_draft(folder).named_parameters())
    for fused, param in ((FUSED_GATE_UP, W13), (FUSED_DOWN, W2)):
        want = dequantize_int4_fp32(tensors, fused, "W4A8_DYNAMIC", "1.0.0").bfloat16()
        assert torch.equal(params[param], want), param


# -- memory: one tensor at a time, no full fp32 copy -------------------------------------------


def test_decoding_never_allocates_a_full_fp32_copy():
    """A 4M-element fused int4 expert tensor: the largest single allocation while decoding is
    below the fp32 size of the tensor (the bf16 result itself is half of it)."""
    from torch.profiler import ProfilerActivity, profile

    from sglang_mtp_dequant.formats.checkpoint import TensorInfo
    from sglang_mtp_dequant.formats.schemes import scheme_for

    experts, out, hidden = 8, 512, 1024
    codes = torch.randint(-128, 128, (experts, out // 2, hidden), dtype=torch.int8)
    companions = {"weight_scale": torch.rand(experts, out, 1) + 0.01}

    info = TensorInfo("mtp.experts.gate_up_proj", "f.safetensors", torch.int8, tuple(codes.shape))
    decoder = scheme_for("W4A8_DYNAMIC").prepare(info, companions, 0, format_version="1.0.0")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = decoder.decompress(codes, torch.bfloat16)
    largest = max(e.cpu_memory_usage for e in prof.events())
    full_fp32 = experts * out * hidden * 4
    assert result.shape == (experts, out, hidden)
    assert 0 < largest < full_fp32, f"largest allocation {largest} B, full fp32 copy {full_fp32} B"


def test_stream_holds_no_decoded_tensor_after_yielding():
    """The transform is lazy: each decoded tensor is released once sglang's loader drops it."""
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from sglang_mtp_dequant.serving.stream import DequantizingStream
    from support.checkpoints import open_checkpoint
    from support.cpu_sglang import path_weights

    folder = fixture_dir(MOE)
    is_draft = lambda name: name.startswith("mtp.")  # noqa: E731
    plan = DequantPlan.build(open_checkpoint(folder, wanted=is_draft))
    stream = DequantizingStream(lambda: plan, torch.bfloat16, is_draft)
    alive = []
    for name, tensor in stream.apply(path_weights(folder)):
        if name in plan.to_dequantize:
            alive.append(weakref.ref(tensor))
        del tensor  # tensors hold no reference cycles: refcounting frees them right here
        # the generator's frame still names the latest result until it decodes the next one
        assert all(ref() is None for ref in alive[:-1])
    assert len(alive) == 15 and stream.stats.dequantized == 15
