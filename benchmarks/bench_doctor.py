"""How long ``sglang-mtp-dequant doctor`` takes on a checkpoint laid out like Qwen3.5-27B W8A8.

Usage::

    .venv/bin/python benchmarks/bench_doctor.py [--keep DIR]     # default: a temporary folder

Writes a 27B-shaped msmodelslim W8A8_DYNAMIC checkpoint as *sparse* files (every tensor of the
real layout with its real shape and dtype: 64 hybrid layers, the vision tower, embedding,
lm_head and the MTP layer; ~29 GB apparent, a few KB on disk): the headers are real, the weight
bytes are holes that read as zeros, and the companions (weight_scale, weight_offset) hold real
values (``support.real_layouts.write_checkpoint``). Then it times the console script end to end
(a fresh Python process, as an operator runs it) and ``diagnose`` in this process, twice (the
first call pays sglang's imports). The doctor reads headers and the small companions only (its
dry run builds the draft on the meta device), so the apparent size must not matter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
from machine import describe

from support.real_layouts import Layout, write_checkpoint
from support.shapes import HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, KV_HEADS, VOCAB

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_CONFIG = os.path.join(ROOT, "test/fixtures/modelslim/q35_dense_w8a8_dynamic/config.json")


def config_27b() -> dict:
    """The test fixture's Qwen3.5 config with Qwen3.5-27B's text dimensions (hidden 5120, 24/4
    heads of 256, MLP 17408, vocab 248320, 64 layers): sglang builds the draft from it."""
    with open(FIXTURE_CONFIG) as handle:
        config = json.load(handle)
    config["text_config"].update(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=VOCAB,
        num_hidden_layers=64,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 16,
        linear_num_value_heads=48,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
    )
    return config


def linear(prefix: str, out: int, inp: int, quantized: bool) -> list[tuple[str, str, tuple]]:
    if not quantized:
        return [(f"{prefix}.weight", "BF16", (out, inp))]
    return [
        (f"{prefix}.weight", "I8", (out, inp)),
        (f"{prefix}.weight_scale", "F32", (out, 1)),
        (f"{prefix}.weight_offset", "F32", (out, 1)),
    ]


def decoder_layer(prefix: str, full_attention: bool) -> list:
    out = []
    if full_attention:
        out += linear(f"{prefix}.self_attn.q_proj", HEADS * HEAD_DIM * 2, HIDDEN, True)
        out += linear(f"{prefix}.self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN, True)
        out += linear(f"{prefix}.self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN, True)
        out += linear(f"{prefix}.self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM, True)
        out += [(f"{prefix}.self_attn.q_norm.weight", "BF16", (HEAD_DIM,))]
        out += [(f"{prefix}.self_attn.k_norm.weight", "BF16", (HEAD_DIM,))]
    else:
        la = f"{prefix}.linear_attn"
        out += linear(f"{la}.in_proj_qkv", 10240, HIDDEN, True)
        out += linear(f"{la}.in_proj_z", 6144, HIDDEN, True)
        out += linear(f"{la}.in_proj_b", 48, HIDDEN, False)
        out += linear(f"{la}.in_proj_a", 48, HIDDEN, False)
        out += linear(f"{la}.out_proj", HIDDEN, 6144, True)
        out += [(f"{la}.conv1d.weight", "BF16", (10240, 1, 4)), (f"{la}.A_log", "F32", (48,))]
        out += [(f"{la}.dt_bias", "BF16", (48,)), (f"{la}.norm.weight", "F32", (128,))]
    for proj, shape in (
        ("gate_proj", (INTERMEDIATE, HIDDEN)),
        ("up_proj", (INTERMEDIATE, HIDDEN)),
        ("down_proj", (HIDDEN, INTERMEDIATE)),
    ):
        out += linear(f"{prefix}.mlp.{proj}", *shape, True)
    out += [(f"{prefix}.input_layernorm.weight", "BF16", (HIDDEN,))]
    out += [(f"{prefix}.post_attention_layernorm.weight", "BF16", (HIDDEN,))]
    return out


def layout() -> list[tuple[str, str, tuple]]:
    tensors = [("model.language_model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    for i in range(64):
        tensors += decoder_layer(f"model.language_model.layers.{i}", i % 4 == 3)
    tensors += [("model.language_model.norm.weight", "BF16", (HIDDEN,))]
    for i in range(27):
        b = f"model.visual.blocks.{i}"
        tensors += [
            (f"{b}.attn.qkv.weight", "BF16", (3456, 1152)),
            (f"{b}.attn.proj.weight", "BF16", (1152, 1152)),
        ]
        tensors += [
            (f"{b}.mlp.linear_fc1.weight", "BF16", (4304, 1152)),
            (f"{b}.mlp.linear_fc2.weight", "BF16", (1152, 4304)),
        ]
        tensors += [(f"{b}.norm1.weight", "BF16", (1152,)), (f"{b}.norm2.weight", "BF16", (1152,))]
    tensors += [("lm_head.weight", "BF16", (VOCAB, HIDDEN))]
    tensors += [("mtp.fc.weight", "BF16", (HIDDEN, 2 * HIDDEN))]
    tensors += [
        ("mtp.pre_fc_norm_embedding.weight", "BF16", (HIDDEN,)),
        ("mtp.pre_fc_norm_hidden.weight", "BF16", (HIDDEN,)),
    ]
    tensors += decoder_layer("mtp.layers.0", True)
    tensors += [("mtp.norm.weight", "BF16", (HIDDEN,))]
    return tensors


def write_sparse_checkpoint(folder: str, shards: int = 12) -> tuple[list, int]:
    """The layout in ``shards`` files with an index, through the tests' header-first writer
    (``support.real_layouts.write_checkpoint``, sparse); returns the tensors and the apparent
    bytes."""
    tensors = layout()
    per_shard = -(-len(tensors) // shards)
    description = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0", "group_size": 0}
    checkpoint = Layout(description=description, config=config_27b())
    for s in range(shards):
        file = f"quant_model_weights-{s + 1:05d}-of-{shards:05d}.safetensors"
        for tensor, dtype, shape in tensors[s * per_shard : (s + 1) * per_shard]:
            quantized = dtype == "I8" or "_scale" in tensor or "_offset" in tensor
            checkpoint.add(tensor, dtype, shape, "W8A8_DYNAMIC" if quantized else "FLOAT", file)
    return tensors, write_checkpoint(folder, checkpoint, sparse=True, index=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", help="write the checkpoint here and keep it")
    args = parser.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        run_doctor(args.keep, os.path.join(args.keep, "doctor.log"))
        return
    with tempfile.TemporaryDirectory(prefix="doctor-27b-") as folder:
        run_doctor(folder, os.path.join(folder, "doctor.log"))


def run_doctor(folder: str, log: str) -> None:
    tensors, apparent = write_sparse_checkpoint(folder)
    params = sum(int(np.prod(shape)) for _, _, shape in tensors)
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    started = time.perf_counter()
    run = subprocess.run(
        [script, "doctor", folder, "--json", "--log", log], capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    report = json.loads(run.stdout)
    from sglang_mtp_dequant.tools.doctor import diagnose

    started = time.perf_counter()
    diagnose(folder)  # the first call imports sglang and its model modules
    first = time.perf_counter() - started
    started = time.perf_counter()
    again = diagnose(folder)
    inner = time.perf_counter() - started
    assert again.verdict == report["verdict"] and again.dry_run == report["dry_run"], again
    print(
        f"checkpoint: {len(tensors)} tensors ({params / 1e9:.1f} B parameters) in 12 shards, "
        f"{apparent / 2**30:.1f} GiB apparent (sparse)"
    )
    print(f"doctor verdict {report['verdict']!r}, counts {report['counts']}, exit {run.returncode}")
    unfilled = len(report["unfilled_parameters"])
    print(f"dry run: {report['dry_run']}; unfilled parameters: {unfilled}")
    print(describe())
    print(
        f"console script, fresh process: {wall:.2f} s; diagnose() in this process: {first:.2f} s "
        f"the first time (sglang's imports), then {inner:.2f} s"
    )


if __name__ == "__main__":
    main()
