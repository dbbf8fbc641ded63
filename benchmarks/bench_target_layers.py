"""What the build-time check of target layers costs (``serving/target_layers.py``), on a
description shaped like the largest real ModelSlim export.

Usage::

    .venv/bin/python benchmarks/bench_target_layers.py [--reps 5] [--recipe qwen3.5] [--json PATH]

The shape: Qwen3.5-397B-A17B (60 layers, 45 Gated DeltaNet and 15 full attention, 512 routed
experts of 1024 and a shared expert per layer, hidden 4096, vocab 248320) and its MTP layer,
described as msmodelslim's Qwen3.6 recipe describes a hybrid model: attention, experts, shared
experts and the GDN ``in_proj_qkv`` / ``in_proj_z`` W8A8_DYNAMIC (weight, weight_scale,
weight_offset entries), everything else FLOAT: ~2.8e5 entries. Only ``config.json`` and
``quant_model_description.json`` are written (the check reads no tensor). sglang's own
``_get_quantization_config`` (its NPU branch, as on NPU) parses it, and sglang's
``Qwen3_5MoeForCausalLM`` is built on the meta device with that config, as the loader builds
it. Then, ``--reps`` times each: ``supply_packed_names`` (hook 1, on a fresh config each time)
and ``unserved_layers`` (hook 2, the module walk and the description lookups), beside what
sglang's own two steps took. Prints the machine line and a last line
``target_layers recipe R supply_ms S check_ms C sglang_config_ms Q sglang_build_ms B entries N``.
``--recipe qwen3.5`` describes the GDN projections FLOAT: nothing is supplied, and the cost is
what the hooks add to a checkpoint they leave untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
import torch
from machine import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_CONFIG = os.path.join(ROOT, "test/fixtures/modelslim/q35moe_w8a8_dynamic/config.json")
LAYERS, EXPERTS = 60, 512
Q8 = "W8A8_DYNAMIC"


def config_397b() -> dict:
    with open(BASE_CONFIG) as handle:
        config = json.load(handle)
    config["text_config"].update(
        hidden_size=4096,
        num_hidden_layers=LAYERS,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (LAYERS // 4),
        full_attention_interval=4,  # what sglang reads (configs/qwen3_next.py)
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_value_heads=64,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=EXPERTS,
        num_experts_per_tok=10,
        moe_intermediate_size=1024,
        shared_expert_intermediate_size=1024,
        vocab_size=248320,
    )
    return config


def description(config: dict, gdn: str = Q8) -> dict[str, str]:
    """The Qwen3.6 recipe's rule on every layer of ``config`` and its MTP layer (``gdn="FLOAT"``:
    the Qwen3.5 recipe's, every Gated DeltaNet projection FLOAT)."""
    text = config["text_config"]
    out: dict[str, str] = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0"}

    def linear(prefix: str, scheme: str) -> None:
        out[f"{prefix}.weight"] = scheme
        if scheme != "FLOAT":
            out[f"{prefix}.weight_scale"] = out[f"{prefix}.weight_offset"] = scheme

    def block(prefix: str, kind: str) -> None:
        if kind == "linear_attention":
            for name in ("in_proj_qkv", "in_proj_z"):
                linear(f"{prefix}.linear_attn.{name}", gdn)
            for name in ("in_proj_b", "in_proj_a", "out_proj", "conv1d"):
                linear(f"{prefix}.linear_attn.{name}", "FLOAT")
            out[f"{prefix}.linear_attn.A_log"] = out[f"{prefix}.linear_attn.dt_bias"] = "FLOAT"
        else:
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linear(f"{prefix}.self_attn.{name}", Q8)
        for e in range(text["num_experts"]):
            for name in ("gate_proj", "up_proj", "down_proj"):
                linear(f"{prefix}.mlp.experts.{e}.{name}", Q8)
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear(f"{prefix}.mlp.shared_expert.{name}", Q8)
        linear(f"{prefix}.mlp.gate", "FLOAT")
        linear(f"{prefix}.mlp.shared_expert_gate", "FLOAT")
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{prefix}.{norm}.weight"] = "FLOAT"

    for i, kind in enumerate(text["layer_types"]):
        block(f"model.language_model.layers.{i}", kind)  # the release layout msmodelslim keeps
    block("mtp.layers.0", "full_attention")
    for name in ("model.language_model.embed_tokens.weight", "model.language_model.norm.weight"):
        out[name] = "FLOAT"
    out["lm_head.weight"] = "FLOAT"
    return out


def timed(function, reps: int) -> tuple[float, object]:
    """Median milliseconds of ``reps`` calls, and the last result."""
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--recipe",
        choices=("qwen3.6", "qwen3.5"),
        default="qwen3.6",
        help="qwen3.5: the GDN projections FLOAT (a checkpoint the hooks leave untouched)",
    )
    args = parser.parse_args(argv)
    print(describe(), flush=True)
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()  # before sglang imports (a CUDA torchvision beside CPU torch)
    # sglang's ModelSlim MoE method looks its NPU ops up when it is built (never called here):
    # the e2e harness's CPU stand-ins stand in for torch_npu's registration
    sys.path.insert(0, os.path.join(ROOT, "e2e", "site"))
    import e2e_shim_npu_ops

    e2e_shim_npu_ops.register()
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    from sglang_mtp_dequant.serving import sglang_private, target_layers
    from sglang_mtp_dequant.tools.cpu_env import (
        generic_rope_on_cpu,
        npu_quantization_rule,
        placeholder_vllm_rotary,
    )
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    with tempfile.TemporaryDirectory() as folder:
        config = config_397b()
        described = description(config, Q8 if args.recipe == "qwen3.6" else "FLOAT")
        with open(os.path.join(folder, "config.json"), "w") as handle:
            json.dump(config, handle)
        with open(os.path.join(folder, "quant_model_description.json"), "w") as handle:
            json.dump(described, handle)
        prepare_cpu_process(folder, quantization="modelslim", dtype="bfloat16")
        model_config = ModelConfig.from_server_args(
            sglang_private.published_server_args(), model_path=folder
        )
        load_config = LoadConfig(load_format="auto")

        def sglang_config():
            return sglang_private.quantization_config(model_config, load_config)

        # one NPU context for the config and the build: sglang's class hands the config the
        # class's mapping again when built, and the context restores that mapping on exit
        with npu_quantization_rule():
            config_ms, quant_config = timed(sglang_config, args.reps)
            supply_times = []
            for _ in range(args.reps):  # a fresh config each time (sglang writes a new mapping)
                fresh = sglang_config()
                started = time.perf_counter()
                supplied = target_layers.supply_packed_names(fresh)
                supply_times.append((time.perf_counter() - started) * 1000)
            supply_ms = statistics.median(supply_times)
            quant_config = sglang_config()
            target_layers.supply_packed_names(quant_config)
            started = time.perf_counter()
            with set_default_torch_dtype(torch.bfloat16), torch.device("meta"):
                with placeholder_vllm_rotary(), generic_rope_on_cpu():
                    model = sglang_private.initialize_model(model_config, load_config, quant_config)
            build_ms = (time.perf_counter() - started) * 1000
            check_ms, unserved = timed(
                lambda: target_layers.unserved_layers(model, quant_config), args.reps
            )
    from sglang.srt.layers.linear import LinearBase

    linears = sum(isinstance(m, LinearBase) for m in model.modules())
    print(
        f"{args.recipe} recipe, {type(model).__name__} on meta: {len(described)} description "
        f"entries, {linears} linear layers; supplied {supplied}; unserved after it: {len(unserved)}"
    )
    line = (
        f"target_layers recipe {args.recipe} supply_ms {supply_ms:.1f} check_ms {check_ms:.1f} "
        f"sglang_config_ms {config_ms:.0f} sglang_build_ms {build_ms:.0f} entries {len(described)}"
    )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "machine": describe(),
                    "recipe": args.recipe,
                    "entries": len(described),
                    "linear_layers": linears,
                    "supply_ms": supply_ms,
                    "check_ms": check_ms,
                    "sglang_config_ms": config_ms,
                    "sglang_build_ms": build_ms,
                    "unserved": len(unserved),
                },
                handle,
                indent=1,
            )
    print(line)
    return 0 if not unserved else 1


if __name__ == "__main__":
    sys.exit(main())
