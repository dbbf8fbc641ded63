"""What dequantizing a real-size MTP draft costs, against a plain cast of the same int8 tensors.

Usage (``make bench`` runs the first line)::

    .venv/bin/python benchmarks/bench_dequant.py --json .cache/bench/results.json
    .venv/bin/python benchmarks/bench_dequant.py --variants      # the torch path's variants
    .venv/bin/python benchmarks/bench_dequant.py --skip-load     # no sglang loads
    .venv/bin/python benchmarks/bench_dequant.py --skip-load --busy 2   # on a loaded machine

Sets of tensors (int8 codes, f32 per-row scales, zero offsets: W8A8_DYNAMIC as msmodelslim
writes it), decoded with the plugin's own path (``AffineInt8().prepare`` -> ``AffineDecoder
.decompress``, to bf16: the numba kernel of ``schemes/fused_bf16.py``), and with its torch
fallback (``decompress(..., fused=False)``, what runs where numba cannot) for comparison:

- ``dense``: one Qwen3.5-27B MTP layer (hidden 5120, 24 heads x 256 gated q, 4 KV heads,
  intermediate 17408): q_proj 12288x5120, k/v_proj 1024x5120, o_proj 5120x6144,
  gate/up_proj 17408x5120, down_proj 5120x17408 (372 M codes; ``mtp.fc`` stays FLOAT).
- ``moe``: one Qwen3.5-35B-A3B MTP layer (hidden 2048, 16 heads, 2 KV heads, 256 experts of
  intermediate 512): q/k/v_proj and 3 x 256 expert projections, the parts the shipped MoE
  recipe quantizes once its ``mtp*`` exclude is removed (824 M codes in 771 tensors).

Measured in one process, interleaved (cast, dequant, torch path, torch path, dequant, cast,
...), several repetitions, medians: wall time per set for ``q.to(torch.bfloat16)`` and for
each decoder. The kernel's one-time start-up (numba compiling it, and loading it from numba's
disk cache in the next process) is measured in fresh child processes. Peak memory:
each method runs in a fresh child process that streams the set like sglang's loader (one
decoded tensor alive at a time); the kernel's peak-RSS counter gives the growth over the
inputs, and "extra" is the dequant growth minus the cast growth (both make the same bf16
output). Then, through sglang's real ``Qwen3_5ForCausalLMMTP.load_weights``: load time of a
27B-shaped MTP checkpoint that needs nothing (all FLOAT) with and without the plugin hook, and
of the W8A8_DYNAMIC one (stock: raw codes; plugin: dequantized); then the W8A8_DYNAMIC load
once per new process, where the kernel's start-up counts, against the torch path.

Ends with ``dequant_vs_cast_ratio <R> peak_extra_mb <M>``: R is the largest median ratio over
the two sets, timed at torch's default thread count and at one thread (what sglang's
``ModelRunner.load_model`` sets on NPU/GPU), M the larger of the sets' peak extras.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

warnings.filterwarnings("ignore")  # sglang's import-time notes about CUDA-only kernels

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MIB = 1024 * 1024

# Qwen3.5-27B text_config: hidden 5120, 24 heads, 4 KV heads, head_dim 256, intermediate 17408
DENSE_27B = {
    "mtp.layers.0.self_attn.q_proj.weight": (12288, 5120),
    "mtp.layers.0.self_attn.k_proj.weight": (1024, 5120),
    "mtp.layers.0.self_attn.v_proj.weight": (1024, 5120),
    "mtp.layers.0.self_attn.o_proj.weight": (5120, 6144),
    "mtp.layers.0.mlp.gate_proj.weight": (17408, 5120),
    "mtp.layers.0.mlp.up_proj.weight": (17408, 5120),
    "mtp.layers.0.mlp.down_proj.weight": (5120, 17408),
}


def moe_35b_a3b() -> dict[str, tuple[int, int]]:
    """Qwen3.5-35B-A3B: hidden 2048, 16 heads / 2 KV heads of 256, 256 experts of 512."""
    shapes = {
        "mtp.layers.0.self_attn.q_proj.weight": (8192, 2048),
        "mtp.layers.0.self_attn.k_proj.weight": (512, 2048),
        "mtp.layers.0.self_attn.v_proj.weight": (512, 2048),
    }
    for e in range(256):
        prefix = f"mtp.layers.0.mlp.experts.{e}"
        shapes[f"{prefix}.gate_proj.weight"] = (512, 2048)
        shapes[f"{prefix}.up_proj.weight"] = (512, 2048)
        shapes[f"{prefix}.down_proj.weight"] = (2048, 512)
    return shapes


SETS = {"dense": DENSE_27B, "moe": moe_35b_a3b()}


@dataclass
class Item:
    name: str
    codes: torch.Tensor
    decoder: object  # sglang_mtp_dequant.schemes.AffineDecoder


def make_items(shapes: dict[str, tuple[int, int]], seed: int = 0) -> list[Item]:
    """Random int8 codes and positive per-row scales, prepared by the plugin's own scheme."""
    from sglang_mtp_dequant.checkpoint import TensorInfo
    from sglang_mtp_dequant.schemes import scheme_for

    gen = torch.Generator().manual_seed(seed)
    scheme = scheme_for("W8A8_DYNAMIC")
    items = []
    for name, shape in shapes.items():
        codes = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
        scale = torch.rand((shape[0], 1), generator=gen) * 1e-3 + 1e-5
        info = TensorInfo(name=name, file="<bench>", dtype=torch.int8, shape=shape)
        companions = {"weight_scale": scale, "weight_offset": torch.zeros_like(scale)}
        items.append(Item(name, codes, scheme.prepare(info, companions, 0)))
    return items


def cast(item: Item) -> torch.Tensor:
    return item.codes.to(torch.bfloat16)


def dequant(item: Item) -> torch.Tensor:
    return item.decoder.decompress(item.codes, torch.bfloat16)


def dequant_torch(item: Item) -> torch.Tensor:
    return item.decoder.decompress(item.codes, torch.bfloat16, fused=False)


METHODS: dict[str, Callable[[Item], torch.Tensor]] = {
    "cast": cast,
    "dequant": dequant,
    "torch path": dequant_torch,
}


def time_sets(items_by_set: dict[str, list[Item]], reps: int) -> dict:
    """Interleaved repetitions; per set and method: wall and CPU seconds of each repetition."""
    timings = {s: {m: {"wall": [], "cpu": []} for m in METHODS} for s in items_by_set}
    for rep in range(reps + 1):  # repetition 0 warms up caches and allocator, not recorded
        order = list(METHODS) if rep % 2 == 0 else list(reversed(METHODS))
        for set_name, items in items_by_set.items():
            for method in order:
                fn = METHODS[method]
                wall, cpu = time.perf_counter(), time.process_time()
                for item in items:
                    out = fn(item)
                    del out
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if rep:
                    timings[set_name][method]["wall"].append(wall)
                    timings[set_name][method]["cpu"].append(cpu)
    return timings


# -- peak memory, one child process per (set, method) --------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_peak(set_name: str, method: str) -> None:
    """(Child) stream one set through one method; print peak RSS growth over the inputs.

    The kernel's high-water mark (VmHWM) is reset after the inputs exist (``5`` into
    ``/proc/self/clear_refs``), so set-up transients do not count and nothing is sampled.
    """
    items = make_items(SETS[set_name])
    fn = METHODS[method]
    fn(items[0])  # first-call set-up (thread pool, allocator) outside the measurement
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    base = _status_bytes("VmRSS")
    for item in items:
        out = fn(item)
        del out
    peak = _status_bytes("VmHWM")
    largest = max(i.codes.numel() for i in items) * 2
    print(json.dumps({"growth": peak - base, "largest_output": largest}))


def peak_memory(set_name: str, method: str) -> dict:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child-peak", set_name, method],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the kernel's one-time start-up, in fresh processes ------------------------------------


def child_start_up() -> None:
    """(Child) seconds of the first bf16 decode in this process: numba compiles the kernel,
    or loads it from its disk cache (``NUMBA_CACHE_DIR``, set by the parent)."""
    item = make_items({"w": (64, 64)})[0]
    t0 = time.perf_counter()
    out = dequant(item)
    first = time.perf_counter() - t0
    assert torch.equal(out, dequant_torch(item))
    print(json.dumps({"first_decode_s": first}))


def kernel_start_up(cache: str) -> dict:
    """First decode in a process with an empty numba cache, then in the next process."""
    import shutil

    cache_dir = os.path.join(cache, "numba-start-up")
    shutil.rmtree(cache_dir, ignore_errors=True)
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    seconds = {}
    for label in ("compile", "cached"):
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child-start-up"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        seconds[label] = json.loads(out.stdout.strip().splitlines()[-1])["first_decode_s"]
    print(
        f"kernel start-up, once per process: {seconds['compile']:.2f} s with an empty numba "
        f"cache (compiling), {seconds['cached']:.2f} s in the next process (numba's disk cache)"
    )
    return seconds


# -- the torch-path variants measured before choosing its shipped body ---------------------


def variant_functions() -> dict[str, Callable[[Item, int], torch.Tensor]]:
    """Alternative bodies for the torch path of ``AffineDecoder.decompress`` (per-row scale,
    no offset); the shipped bf16 path is the numba kernel, timed by the main run.

    Each must give the shipped method's bits exactly; ``--variants`` checks that.
    """

    def blocks(rows: int, cols: int, block: int):
        step = max(1, block // max(1, cols))
        for r0 in range(0, rows, step):
            yield r0, min(rows, r0 + step)

    def fresh_temp(item: Item, block: int) -> torch.Tensor:
        q, s = item.codes, item.decoder.scale
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        for r0, r1 in blocks(*q.shape, block):
            work = q[r0:r1].to(torch.float32)
            work.mul_(s[r0:r1])
            out[r0:r1].copy_(work)
        return out

    def reused_buffer(item: Item, block: int) -> torch.Tensor:
        q, s = item.codes, item.decoder.scale
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        buf = torch.empty((max(1, block // q.shape[1]), q.shape[1]), dtype=torch.float32)
        for r0, r1 in blocks(*q.shape, block):
            work = buf[: r1 - r0]
            work.copy_(q[r0:r1])
            work.mul_(s[r0:r1])
            out[r0:r1].copy_(work)
        return out

    def mul_out_buffer(item: Item, block: int) -> torch.Tensor:
        q, s = item.codes, item.decoder.scale
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        buf = torch.empty((max(1, block // q.shape[1]), q.shape[1]), dtype=torch.float32)
        for r0, r1 in blocks(*q.shape, block):
            work = buf[: r1 - r0]
            torch.mul(q[r0:r1], s[r0:r1], out=work)
            out[r0:r1].copy_(work)
        return out

    def mul_out_bf16(item: Item, block: int) -> torch.Tensor:
        q, s = item.codes, item.decoder.scale
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        for r0, r1 in blocks(*q.shape, block):
            torch.mul(q[r0:r1], s[r0:r1], out=out[r0:r1])
        return out

    def whole_tensor(item: Item, block: int) -> torch.Tensor:
        return (item.codes.to(torch.float32) * item.decoder.scale).to(torch.bfloat16)

    return {
        "fresh fp32 block, mul_, copy_": fresh_temp,
        "reused fp32 buffer, mul_, copy_": reused_buffer,
        "torch.mul(q, s, out=fp32 buffer), copy_": mul_out_buffer,
        "torch.mul(q, s, out=bf16 rows)": mul_out_bf16,
        "whole tensor, no blocks": whole_tensor,
    }


def run_variants(reps: int) -> None:
    """Time each variant x block size x thread count on the dense set, print a table.

    Wall and process CPU time are both recorded: on a shared machine the CPU time is the
    steadier of the two, and a variant that only wins on one of them has not won.
    """
    items = make_items(DENSE_27B)
    expected = [dequant(i) for i in items]
    variants = variant_functions()
    blocks = [1 << 16, 1 << 18, 1 << 20, 1 << 22]
    configs = [("cast", 0)] + [(v, b) for v in variants for b in blocks]
    configs = [c for c in configs if not (c[0] == "whole tensor, no blocks" and c[1] != blocks[0])]
    for name, block in configs[1:]:
        for item, want in zip(items, expected, strict=True):
            assert torch.equal(variants[name](item, block), want), f"{name} differs"
    default_threads = torch.get_num_threads()
    print(f"variants on the dense set (372 M codes), {reps} interleaved repetitions, medians")
    print("| variant | block (elements) | threads | wall ms | CPU ms | wall / cast | CPU / cast |")
    print("|---|---|---|---|---|---|---|")
    for threads in sorted({1, default_threads}, reverse=True):
        torch.set_num_threads(threads)
        wall: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        cpu: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        for rep in range(reps + 1):
            for config in configs if rep % 2 == 0 else list(reversed(configs)):
                name, block = config
                w, c = time.perf_counter(), time.process_time()
                for item in items:
                    out = cast(item) if name == "cast" else variants[name](item, block)
                    del out
                if rep:
                    wall[config].append(time.perf_counter() - w)
                    cpu[config].append(time.process_time() - c)
        base_w = statistics.median(wall[("cast", 0)])
        base_c = statistics.median(cpu[("cast", 0)])
        for config in configs:
            name, block = config
            mw, mc = statistics.median(wall[config]), statistics.median(cpu[config])
            shown = "-" if name == "cast" or name.startswith("whole") else f"{block:,}"
            print(
                f"| {name} | {shown} | {threads} | {mw * 1000:.0f} | {mc * 1000:.0f} "
                f"| {mw / base_w:.2f} | {mc / base_c:.2f} |",
                flush=True,
            )
    torch.set_num_threads(default_threads)


# -- loads through sglang ---------------------------------------------------------------

LOAD_VERSION = "1"


def config_27b() -> dict:
    """A text-only Qwen3.5-27B config (small vocabulary: the draft's MTP layer is full size)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": 1024,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "full_attention_interval": 4,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "dtype": "bfloat16",
    }


def write_load_checkpoints(items: list[Item], cache: str) -> tuple[str, str]:
    """A 27B-shaped MTP checkpoint twice: all FLOAT (bf16), and W8A8_DYNAMIC as msmodelslim
    lays it out. Written once into ``cache`` (about 1.3 GB), reused afterwards."""
    from accept.export import DESCRIPTION_GLOBALS, add_w8a8_dynamic
    from safetensors.torch import save_file

    float_dir = os.path.join(cache, "q35_27b_mtp_float")
    quant_dir = os.path.join(cache, "q35_27b_mtp_w8a8_dynamic")
    stamp = os.path.join(cache, f"checkpoints-v{LOAD_VERSION}.done")
    if os.path.isfile(stamp):
        return float_dir, quant_dir
    config = config_27b()
    hidden = config["hidden_size"]
    gen = torch.Generator().manual_seed(1)
    small = {
        "model.embed_tokens.weight": (torch.randn(1024, hidden, generator=gen) * 0.02),
        "mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=gen) * 0.01,
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(hidden),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(hidden),
        "mtp.norm.weight": torch.zeros(hidden),
        "mtp.layers.0.input_layernorm.weight": torch.zeros(hidden),
        "mtp.layers.0.post_attention_layernorm.weight": torch.zeros(hidden),
        "mtp.layers.0.self_attn.q_norm.weight": torch.zeros(256),
        "mtp.layers.0.self_attn.k_norm.weight": torch.zeros(256),
    }
    small = {k: v.to(torch.bfloat16) for k, v in small.items()}
    for folder in (float_dir, quant_dir):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
    tensors = dict(small)
    tensors.update({i.name: dequant(i) for i in items})
    save_file(tensors, os.path.join(float_dir, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    quant = dict(small)
    description: dict = {name: "FLOAT" for name in small}
    for item in items:
        scale = item.decoder.scale.contiguous()
        base = item.name[: -len(".weight")]
        add_w8a8_dynamic(quant, description, base, item.codes, scale, torch.zeros_like(scale))
    description.update(DESCRIPTION_GLOBALS)
    shard = "quant_model_weights-00001-of-00001.safetensors"
    save_file(quant, os.path.join(quant_dir, shard), metadata={"format": "pt"})
    with open(os.path.join(quant_dir, "quant_model_description.json"), "w", encoding="utf-8") as h:
        json.dump(description, h, indent=4)
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write("ok\n")
    return float_dir, quant_dir


def loads_through_sglang(items: list[Item], cache: str, reps: int) -> dict:
    """Median ``load_weights`` seconds, stock vs hooked, for the FLOAT and the W8A8 checkpoint."""
    import logging

    from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, prepare_cpu_process, publish_context

    float_dir, quant_dir = write_load_checkpoints(items, cache)
    logging.disable(logging.WARNING)
    prepare_cpu_process(float_dir)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_mtp_dequant.checkpoint import Checkpoint
    from sglang_mtp_dequant.plan import DequantPlan
    from sglang_mtp_dequant.plugin import registered_targets

    assert any(t.endswith("Qwen3_5ForCausalLMMTP.load_weights") for t in registered_targets())
    cases = [
        ("FLOAT checkpoint, stock", float_dir, False),
        ("FLOAT checkpoint, plugin", float_dir, True),
        ("W8A8_DYNAMIC checkpoint, stock (raw codes)", quant_dir, False),
        ("W8A8_DYNAMIC checkpoint, plugin", quant_dir, True),
    ]
    seconds: dict[str, list[float]] = {c[0]: [] for c in cases}
    plan_seconds: list[float] = []
    for rep in range(reps + 1):
        for label, folder, plugin in cases if rep % 2 == 0 else list(reversed(cases)):
            publish_context(folder)
            builder = CpuDraftBuilder(folder)
            model = builder.build_draft()
            method = type(model).load_weights
            if not plugin:
                method = method.__wrapped__
            t0 = time.perf_counter()
            method(model, builder.weights())
            if rep:
                seconds[label].append(time.perf_counter() - t0)
            del model
        t0 = time.perf_counter()
        DequantPlan.build(Checkpoint.open(float_dir, wanted=lambda n: n.startswith("mtp.")))
        if rep:
            plan_seconds.append(time.perf_counter() - t0)
    logging.disable(logging.NOTSET)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    overhead = med["FLOAT checkpoint, plugin"] - med["FLOAT checkpoint, stock"]
    print()
    print(f"sglang Qwen3_5ForCausalLMMTP.load_weights, 27B-shaped MTP layer, medians of {reps}:")
    print("| checkpoint, loader | load_weights s |")
    print("|---|---|")
    for label, value in med.items():
        print(f"| {label} | {value:.3f} |")
    plan_ms = statistics.median(plan_seconds) * 1000
    print(
        f"plugin overhead on the FLOAT checkpoint: {overhead * 1000:+.0f} ms "
        f"({overhead / med['FLOAT checkpoint, stock']:+.1%}; the hook's own work, header "
        f"read + plan, is {plan_ms:.1f} ms)"
    )
    return {"seconds": seconds, "medians": med, "float_overhead_s": overhead, "plan_ms": plan_ms}


def child_fresh_load(folder: str, when: str) -> None:
    """(Child) one hooked ``load_weights`` of ``folder`` in a new process: what a scheduler
    pays once. ``when`` the kernel warm-up starts: ``"draft"`` (as the draft load begins:
    the worst case, nothing to hide it behind) or ``"target"`` (sglang's ``ModelRunner
    .load_model`` BEFORE hook, speculative decoding on: the warm-up runs while the target
    model loads; here it is waited for, since any real target load takes longer)."""
    import logging
    import threading

    from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, prepare_cpu_process, publish_context

    logging.disable(logging.WARNING)
    prepare_cpu_process(folder)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    warm_up_s = 0.0
    if when == "target":
        from sglang_mtp_dequant.plugin import warm_up_before_model_load

        eagle = {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
        }
        publish_context(folder, **eagle)
        t0 = time.perf_counter()
        warm_up_before_model_load()
        for thread in threading.enumerate():
            if thread.name == "mtp-dequant-warm-up":
                thread.join()
        warm_up_s = time.perf_counter() - t0
    publish_context(folder)
    builder = CpuDraftBuilder(folder)
    model = builder.build_draft()
    t0 = time.perf_counter()
    type(model).load_weights(model, builder.weights())
    print(json.dumps({"load_weights_s": time.perf_counter() - t0, "warm_up_s": warm_up_s}))


def fresh_process_loads(quant_dir: str, reps: int) -> dict:
    """The 27B-shaped W8A8_DYNAMIC MTP layer loaded once per new process: the kernel with its
    warm-up started during the target load (what the plugin does) or only at the draft load
    (the worst case), against the torch path (``NUMBA_DISABLE_JIT=1``: no numba at all)."""
    modes = {
        "kernel, warm-up during the target load": ("target", {}),
        "kernel, warm-up at the draft load": ("draft", {}),
        "torch path (NUMBA_DISABLE_JIT=1)": ("draft", {"NUMBA_DISABLE_JIT": "1"}),
    }
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode in modes if rep % 2 == 0 else list(reversed(modes)):
            when, env = modes[mode]
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child-fresh-load", quant_dir, when],
                check=True,
                capture_output=True,
                text=True,
                env=dict(os.environ, **env),
            )
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: statistics.median(r["load_weights_s"] for r in v) for m, v in runs.items()}
    warm = statistics.median(r["warm_up_s"] for r in runs["kernel, warm-up during the target load"])
    print(f"W8A8_DYNAMIC checkpoint, plugin, first load in a new process, medians of {reps}:")
    print("| decoder | load_weights s |")
    print("|---|---|")
    for mode, value in med.items():
        print(f"| {mode} | {value:.3f} |")
    print(f"(the warm-up itself, off the load's path: {warm:.2f} s)")
    return {"runs": runs, "medians": med, "warm_up_s": warm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", default=None)
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N other processes spinning on the CPUs while timing (a loaded machine)",
    )
    parser.add_argument("--cache", default=os.path.join(REPO, ".cache", "bench"))
    parser.add_argument("--child-peak", nargs=2, metavar=("SET", "METHOD"))
    parser.add_argument("--child-start-up", action="store_true")
    parser.add_argument("--child-fresh-load", nargs=2, metavar=("FOLDER", "WARM_UP_AT"))
    args = parser.parse_args()
    if args.child_fresh_load:
        child_fresh_load(*args.child_fresh_load)
        return 0
    if args.child_peak:
        child_peak(*args.child_peak)
        return 0
    if args.child_start_up:
        child_start_up()
        return 0
    if args.variants:
        run_variants(args.reps)
        return 0

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"load average {load_before:.1f}"
    )
    start_up = kernel_start_up(args.cache)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    if busy:
        print(f"{len(busy)} busy-looping processes share the CPUs while timing")
    items_by_set = {name: make_items(shapes) for name, shapes in SETS.items()}
    for name, items in items_by_set.items():
        codes = sum(i.codes.numel() for i in items)
        print(f"set {name}: {len(items)} tensors, {codes / 1e6:.0f} M int8 codes")
    memory = {s: {m: peak_memory(s, m) for m in METHODS} for s in SETS}
    record: dict = {"reps": args.reps, "sets": {}, "kernel_start_up_s": start_up}
    ratios, extras = [], []
    default_threads = torch.get_num_threads()
    # torch's default, then one thread: what sglang's ModelRunner.load_model sets on NPU/GPU
    for threads in sorted({default_threads, 1}, reverse=True):
        torch.set_num_threads(threads)
        timings = time_sets(items_by_set, args.reps)
        print()
        print(f"{threads} thread(s):")
        print(
            "| set | cast ms | dequant ms | ratio | torch path ms | torch path ratio "
            "| peak growth cast MB | peak growth dequant MB | extra MB |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, items in items_by_set.items():
            t = timings[name]
            cast_ms = statistics.median(t["cast"]["wall"]) * 1000
            deq_ms = statistics.median(t["dequant"]["wall"]) * 1000
            torch_ms = statistics.median(t["torch path"]["wall"]) * 1000
            ratio = deq_ms / cast_ms
            growth_cast = memory[name]["cast"]["growth"] / MIB
            growth_deq = memory[name]["dequant"]["growth"] / MIB
            extra = growth_deq - growth_cast
            ratios.append(ratio)
            extras.append(extra)
            print(
                f"| {name} | {cast_ms:.0f} | {deq_ms:.0f} | {ratio:.2f} | {torch_ms:.0f} "
                f"| {torch_ms / cast_ms:.2f} | {growth_cast:.0f} | {growth_deq:.0f} "
                f"| {extra:.1f} |"
            )
            record["sets"][f"{name}, {threads} thread(s)"] = {
                "tensors": len(items),
                "codes": sum(i.codes.numel() for i in items),
                "cast_ms_median": cast_ms,
                "dequant_ms_median": deq_ms,
                "torch_path_ms_median": torch_ms,
                "ratio": ratio,
                "wall_s": t,
                "memory": memory[name],
                "extra_mb": extra,
            }
    torch.set_num_threads(default_threads)
    for process in busy:
        process.kill()
        process.wait()
    print(
        f"medians of {args.reps} interleaved repetitions; peak growth (torch's default threads): "
        "RSS high-water mark over the inputs while streaming the set, one output alive at a time"
    )
    if not args.skip_load:
        record["loads"] = loads_through_sglang(items_by_set["dense"], args.cache, args.reps)
        quant_dir = write_load_checkpoints(items_by_set["dense"], args.cache)[1]
        record["fresh_loads"] = fresh_process_loads(quant_dir, min(args.reps, 3))
    record["load_average"] = [load_before, os.getloadavg()[0]]
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
    print(f"total {time.perf_counter() - started:.0f} s, load average now {os.getloadavg()[0]:.1f}")
    print(f"dequant_vs_cast_ratio {max(ratios):.2f} peak_extra_mb {max(extras):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
