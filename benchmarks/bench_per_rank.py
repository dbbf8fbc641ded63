"""What the plugin costs on each rank of a TP/EP deployment, on the test fixtures.

Usage::

    .venv/bin/python benchmarks/bench_per_rank.py                  # fixtures + 27B-shaped decode
    .venv/bin/python benchmarks/bench_per_rank.py --reps 20 --json .cache/bench/per_rank.json
    .venv/bin/python benchmarks/bench_per_rank.py --skip-real-size --skip-activation
    .venv/bin/python benchmarks/bench_per_rank.py --threads 1    # on a shared, loaded machine

sglang hands every rank's ``load_weights`` the whole checkpoint stream and its loaders keep
the rank's shard afterwards. The plugin works on that stream before the sharding: every rank
builds the same plan and decodes every quantized dense tensor in full, while under expert
parallelism it decodes only the experts the rank's FusedMoE keeps (``ownership.py``; how much
that saves at EP=2 is ``bench_dequant.py``'s F). So the costs below are paid once per rank,
whatever the TP size.

Measured, medians over ``--reps`` repetitions, in this process:

1. ``plan``: ``Checkpoint.open`` (safetensors headers of the files sglang resolves, the
   description, the index files) + ``DequantPlan.build`` (reads the small scale/offset
   tensors) on each fixture;
2. ``decode``: ``decompress`` of every planned tensor of the fixture to bf16;
3. ``load``: sglang's real draft ``load_weights`` over ``DefaultModelLoader``'s own weight
   stream, stock (``__wrapped__``) and through the hook (plan + decode + stream + the misload
   guard); ``overhead`` = hook - stock;
4. ``real-size decode`` (unless ``--skip-real-size``): the 7 W8A8_DYNAMIC projections of one
   Qwen3.5-27B MTP layer (372 M int8 codes, random, per-row scales), decoded one at a time as
   the stream does: what each rank of a 27B deployment decodes;
5. ``activation`` (unless ``--skip-activation``): in a fresh interpreter that already imported
   sglang's scheduler, the extra import the Ray launch guard's hook target costs (``ray`` and
   ``sglang.srt.ray.engine``), paid once per process that loads plugins when Ray is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

import support_on_path  # noqa: E402, F401  (test/ on sys.path, for support.*)
from machine import describe  # noqa: E402

from support.shapes import QWEN35_27B_MTP  # noqa: E402

FIXTURES = os.path.join(REPO, "test", "fixtures", "modelslim")
DEFAULT_FIXTURES = ("q35_dense_w8a8_dynamic", "q35moe_w8a8_dynamic")


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def fixture_costs(name: str, reps: int) -> dict:
    from sglang_mtp_dequant.formats.checkpoint import Checkpoint
    from sglang_mtp_dequant.formats.naming import mtp_prefix
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
        sglang_weights,
    )
    from sglang_mtp_dequant.tools.resolve import resolve_checkpoint

    folder = os.path.join(FIXTURES, name)
    wanted = mtp_prefix(None)
    source = resolve_checkpoint(folder)

    def build_plan() -> DequantPlan:
        return DequantPlan.build(Checkpoint.open(source, wanted=wanted))

    plan = build_plan()
    entries = plan.to_dequantize
    codes = plan.checkpoint.read_many(entry.info for entry in entries.values())

    def decode_all() -> None:
        for tensor_name, q in codes.items():
            entries[tensor_name].decoder.decompress(q, torch.bfloat16)

    publish_context(folder)
    config = draft_model_config(folder)
    stock_model, hooked_model = build_draft(config), build_draft(config)
    method = type(stock_model).load_weights

    def load(hooked: bool) -> None:
        if hooked:
            method(hooked_model, sglang_weights(config, hooked_model))
        else:
            method.__wrapped__(stock_model, sglang_weights(config, stock_model))

    logging_off()
    load(False)  # warm the page cache and the imports
    load(True)
    stock, hooked = [], []
    for _ in range(reps):  # interleaved, so drift in machine load hits both alike
        stock.append(median_seconds(lambda: load(False), 1))
        hooked.append(median_seconds(lambda: load(True), 1))
    return {
        "fixture": name,
        "tensors_decoded": len(codes),
        "quantized_bytes": sum(q.numel() * q.element_size() for q in codes.values()),
        "plan_ms": 1e3 * median_seconds(build_plan, reps),
        "decode_ms": 1e3 * median_seconds(decode_all, reps),
        "load_stock_ms": 1e3 * statistics.median(stock),
        "load_hooked_ms": 1e3 * statistics.median(hooked),
        "overhead_ms": 1e3 * (statistics.median(hooked) - statistics.median(stock)),
    }


def logging_off() -> None:
    import logging

    logging.getLogger("sglang_mtp_dequant").setLevel(logging.WARNING)


def real_size_decode(reps: int) -> dict:
    """Every rank of a 27B deployment decodes these 372 M codes in full."""
    from sglang_mtp_dequant.formats.checkpoint import TensorInfo
    from sglang_mtp_dequant.formats.schemes import scheme_for

    gen = torch.Generator().manual_seed(0)
    items = []
    for name, (rows, cols) in QWEN35_27B_MTP.items():
        q = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
        scale = torch.rand((rows, 1), generator=gen) * 1e-3 + 1e-4
        info = TensorInfo(name, "synthetic", torch.int8, (rows, cols))
        decoder = scheme_for("W8A8_DYNAMIC").prepare(
            info, {"weight_scale": scale, "weight_offset": torch.zeros_like(scale)}, 0
        )
        items.append((q, decoder))

    def decode_all() -> None:
        for q, decoder in items:
            decoder.decompress(q, torch.bfloat16)  # one decoded tensor alive at a time

    decode_all()
    codes = sum(q.numel() for q, _ in items)
    seconds = median_seconds(decode_all, reps)
    return {"codes": codes, "decode_s": seconds, "gb_per_s": codes / seconds / 1e9}


ACTIVATION_PROBE = """
import time
from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable
ensure_torchvision_importable()
import sglang.srt.managers.scheduler, sglang.srt.models.qwen3_5_mtp
t = time.perf_counter()
import ray, sglang.srt.ray.engine
print("RAY_GUARD_IMPORT_S", time.perf_counter() - t)
"""


def activation_cost() -> dict:
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"ray_guard_import_s": None, "note": "ray is not installed: no guard, no cost"}
    out = subprocess.run(
        [sys.executable, "-c", ACTIVATION_PROBE], capture_output=True, text=True, timeout=600
    )
    for line in out.stdout.splitlines():
        if line.startswith("RAY_GUARD_IMPORT_S"):
            return {"ray_guard_import_s": float(line.split()[1])}
    raise RuntimeError(out.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--fixtures", nargs="*", default=list(DEFAULT_FIXTURES))
    parser.add_argument("--skip-real-size", action="store_true")
    parser.add_argument("--skip-activation", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's own choice); on a shared, loaded box "
        "1 thread avoids the oversubscription that multiplies the decode time",
    )
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)

    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    print(describe(), flush=True)
    prepare_cpu_process(os.path.join(FIXTURES, opts.fixtures[0]))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    result: dict = {
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "fixtures": [fixture_costs(name, opts.reps) for name in opts.fixtures],
    }
    print(f"per rank (every rank does all of this at EP=1), medians of {opts.reps}:")
    print(
        f"{'fixture':28} {'decoded':>7} {'plan ms':>8} {'decode ms':>9} "
        f"{'stock load ms':>13} {'hooked ms':>9} {'overhead ms':>11}"
    )
    for row in result["fixtures"]:
        print(
            f"{row['fixture']:28} {row['tensors_decoded']:7d} {row['plan_ms']:8.2f} "
            f"{row['decode_ms']:9.2f} {row['load_stock_ms']:13.2f} "
            f"{row['load_hooked_ms']:9.2f} {row['overhead_ms']:11.2f}"
        )
    if not opts.skip_real_size:
        real = real_size_decode(max(3, opts.reps // 5))
        result["real_size_27b_mtp_layer"] = real
        print(
            f"27B-shaped MTP layer: {real['codes'] / 1e6:.0f} M codes decoded per rank in "
            f"{real['decode_s']:.2f} s ({real['gb_per_s']:.2f} G codes/s, "
            f"{result['torch_threads']} torch threads)"
        )
    if not opts.skip_activation:
        result["activation"] = activation_cost()
        cost = result["activation"]["ray_guard_import_s"]
        print(
            "Ray launch guard, extra import per process that loads plugins: "
            + (f"{cost:.2f} s" if cost is not None else "none (ray not installed)")
        )
    result["load_average_at_end"] = os.getloadavg()[0]
    print(
        f"load average {result['load_average_at_start']:.1f} -> "
        f"{result['load_average_at_end']:.1f} on {result['cpus']} CPUs"
    )
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
