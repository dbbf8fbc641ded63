"""What decoding costs: eager torch against a plain cast, per expert-parallel rank, and in memory.

Usage (``make bench`` runs the first line)::

    .venv/bin/python benchmarks/bench_dequant.py --json .cache/bench/results.json
    .venv/bin/python benchmarks/bench_dequant.py --variants      # candidate decode bodies
    .venv/bin/python benchmarks/bench_dequant.py --floor         # their kernels, in cache
    .venv/bin/python benchmarks/bench_dequant.py --variants --only "previous body" --sets moe \\
        --reps 15                                                # a focused A/B
    .venv/bin/python benchmarks/bench_dequant.py --skip-ep --reps 3   # timing and memory only

Two sets of W8A8_DYNAMIC tensors as msmodelslim writes them (random int8 codes, positive f32
per-row scales, zero offsets), prepared by the plugin's own scheme (``AffineInt8().prepare``)
and decoded to bf16 by ``AffineDecoder.decompress`` (``schemes/affine.py``: eager torch, three
passes over each block of rows through one reused fp32 buffer):

- ``dense``: one Qwen3.5-27B MTP layer (hidden 5120, 24 heads x 256 gated q, 4 KV heads,
  intermediate 17408): q_proj 12288x5120, k/v_proj 1024x5120, o_proj 5120x6144,
  gate/up_proj 17408x5120, down_proj 5120x17408 (7 tensors, 372 M codes).
- ``moe``: one Qwen3.5-35B-A3B MTP layer (hidden 2048, 16 heads / 2 KV heads of 256, 256
  experts of intermediate 512): q/k/v_proj and 3 x 256 expert projections, the parts the
  shipped MoE recipe quantizes once its ``mtp*`` exclude is removed (771 tensors, 824 M codes).

Measured:

- R, ``dequant_vs_cast_ratio``: median wall time of decoding each set against
  ``q.to(torch.bfloat16)`` (what stock sglang does with the same codes), interleaved
  repetitions (cast, dequant, dequant, cast, ...), at torch's default thread count and at one
  thread (what sglang's ``ModelRunner.load_model`` sets on NPU/GPU); R is the worst of the four.
- F, ``ep2_rank_decode_fraction``: a Qwen3.5-35B-A3B-shaped W8A8_DYNAMIC checkpoint (one MTP
  layer, 256 experts, ``moe_draft.py``) loaded through the plugin by sglang's real
  ``Qwen3_5ForCausalLMMTP`` and ``DefaultModelLoader`` in separate processes
  (``test/support/rank_worker.py``): once at world size 1, once by two gloo ranks at EP=2
  (sglang's own ``init_distributed_environment`` / ``initialize_model_parallel``). F = codes
  decoded by the
  busiest EP=2 rank / codes decoded at EP=1 (``DequantizingStream.stats.decoded_codes``). Every
  expert each rank holds is checked bit for bit (a digest) against the world-size-1 load.
- M, ``peak_extra_mb``: each method streams a set in a fresh child process, one decoded tensor
  alive at a time as in sglang's loader; the kernel's RSS high-water mark (``VmHWM``, reset
  through ``/proc/self/clear_refs`` once the inputs exist, so nothing is sampled and set-up
  does not count) gives each method's growth; M = the larger over the sets of the growth when
  decoding minus the growth when casting (both produce the same bf16 outputs), each the median
  of ``--mem-runs`` children (3), in MiB. The children run with glibc's mmap threshold fixed
  (``LIVE_ENV``), so that RSS is the memory alive: with glibc's default the heap keeps blocks
  of freed tensors resident depending on what ran before, which moved one child's growth by
  a MiB between runs (one default run per set and method is printed beside it). tracemalloc
  cannot be used: it does not see torch's allocations. The bound it is held to is one fp32
  block buffer of the decoder (``affine.BLOCK_ELEMENTS`` x 4 bytes, printed).

``--variants`` times the decode bodies that were candidates for ``dequantize`` on both sets
and thread counts (after checking that each gives the formula's bits) and prints a table:
the measurements behind the body ``schemes/affine.py`` ships. ``--floor`` times, in cache, the
torch operations such a body is made of, one block at a time, against the cast of the same
block: the lowest ratio any body built from them can reach on this machine.

Ends with: ``dequant_vs_cast_ratio <R> ep2_rank_decode_fraction <F> peak_extra_mb <M>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

import support_on_path  # noqa: E402, F401  (test/ on sys.path, for support.*)
from machine import describe  # noqa: E402
from moe_draft import MoeShape, write_checkpoint  # noqa: E402

from support.paths import TEST  # noqa: E402
from support.shapes import QWEN35_27B_MTP  # noqa: E402

MIB = 1024 * 1024

SETS = {"dense": QWEN35_27B_MTP, "moe": MoeShape.qwen35_35b_a3b().quantized()}


@dataclass
class Item:
    name: str
    codes: torch.Tensor
    decoder: object  # sglang_mtp_dequant.formats.schemes.AffineDecoder


def make_items(shapes: dict[str, tuple[int, int]], seed: int = 0) -> list[Item]:
    """Random int8 codes and positive per-row scales, prepared by the plugin's own scheme."""
    from sglang_mtp_dequant.formats.checkpoint import TensorInfo
    from sglang_mtp_dequant.formats.schemes import scheme_for

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


METHODS: dict[str, Callable[[Item], torch.Tensor]] = {"cast": cast, "dequant": dequant}


def interleaved(
    items_by_set: dict[str, list[Item]], methods: dict[str, Callable], reps: int
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Per set and method: wall and CPU seconds of each repetition over the whole set.

    The order of the methods alternates between repetitions, so drift in the machine's load
    hits all alike; repetition 0 warms caches and the allocator and is not recorded.
    """
    timings = {s: {m: {"wall": [], "cpu": []} for m in methods} for s in items_by_set}
    for rep in range(reps + 1):
        order = list(methods) if rep % 2 == 0 else list(reversed(methods))
        for set_name, items in items_by_set.items():
            for method in order:
                fn = methods[method]
                wall, cpu = time.perf_counter(), time.process_time()
                for item in items:
                    out = fn(item)
                    del out
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if rep:
                    timings[set_name][method]["wall"].append(wall)
                    timings[set_name][method]["cpu"].append(cpu)
    return timings


def thread_counts() -> list[int]:
    """torch's default, then one thread (sglang's ``ModelRunner.load_model`` on NPU/GPU)."""
    return sorted({torch.get_num_threads(), 1}, reverse=True)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


# -- peak memory, one child process per (set, method) --------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_peak(set_name: str, method: str) -> None:
    """(Child) stream one set through one method; print the RSS high-water mark's growth."""
    items = make_items(SETS[set_name])
    fn = METHODS[method]
    fn(items[0])  # first-call set-up (thread pool, allocator) outside the measurement
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
        handle.write("5")  # reset VmHWM to the current RSS
    base = _status_bytes("VmRSS")
    for item in items:
        out = fn(item)
        del out
    print(json.dumps({"growth": _status_bytes("VmHWM") - base}))


# glibc's initial mmap threshold. Fixed (the variable turns its dynamic raising off), every
# allocation of this size or more is mapped when made and unmapped when freed, so a child's RSS
# is what is alive; by default glibc raises the threshold past blocks it has freed and keeps
# later ones of that size on its heap, which then stays resident between tensors.
LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def peak_memory(set_name: str, method: str, live: bool) -> int:
    """RSS growth of one fresh child streaming ``set_name`` through ``method``."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child-peak", set_name, method],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **LIVE_ENV} if live else None,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["growth"]


def peak_memory_runs(runs: int) -> dict[str, dict[str, dict[str, list[int]]]]:
    """Per allocator mode (``live``: threshold fixed, ``default``), set and method: the RSS
    growth of fresh children, alternating cast and dequant; ``runs`` children each for
    ``live``, one for ``default``."""
    growth: dict[str, dict[str, dict[str, list[int]]]] = {
        mode: {s: {m: [] for m in METHODS} for s in SETS} for mode in ("live", "default")
    }
    for mode, count in (("live", runs), ("default", 1)):
        for run in range(count):
            for s in SETS:
                for m in METHODS if run % 2 == 0 else reversed(METHODS):
                    growth[mode][s][m].append(peak_memory(s, m, live=mode == "live"))
    return growth


def largest_output_mib(set_name: str) -> float:
    """The largest bf16 tensor of a set: what one decoded tensor alive at a time costs."""
    return max(rows * cols for rows, cols in SETS[set_name].values()) * 2 / MIB


def block_buffer_mib() -> float:
    """The largest scratch buffer the decoder allocates per block, from its own constants."""
    from sglang_mtp_dequant.formats.schemes import affine

    return affine.BLOCK_ELEMENTS * 4 / MIB


# -- codes decoded per rank under expert parallelism ---------------------------------------


def _rank_processes(folder: str, out_dir: str, world: int, ep: int, tag: str) -> list[dict]:
    """Run ``world`` ranks of one load (``test/support/rank_worker.py``), return their reports."""
    from sglang_mtp_dequant.tools.cpu_sglang import free_port

    port = free_port()
    # the worker imports support.* as the tests do: test/ on the child's PYTHONPATH
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TEST, inherited]))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "support.rank_worker", "--folder", folder, "--rank", str(r)]
            + ["--world", str(world), "--ep", str(ep), "--port", str(port), "--out", out_dir]
            + ["--tag", tag],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    errors = [p.communicate()[1] for p in procs]
    for r, proc in enumerate(procs):
        if proc.returncode != 0:
            error_file = os.path.join(out_dir, f"rank{r}.error")
            why = open(error_file).read() if os.path.exists(error_file) else errors[r]
            raise RuntimeError(f"{tag} rank {r} exit {proc.returncode}:\n{why[-3000:]}")
    reports = []
    for r in range(world):
        with open(os.path.join(out_dir, f"{tag}.rank{r}.json"), encoding="utf-8") as handle:
            reports.append(json.load(handle))
    return reports


def expert_parallel(experts: int) -> dict:
    """F: codes decoded by the busiest rank at EP=2 over codes decoded at EP=1 (see top)."""
    shape = MoeShape.qwen35_35b_a3b(experts)
    with tempfile.TemporaryDirectory(prefix="bench-ep-") as tmp:
        folder = os.path.join(tmp, "q35moe_35b_a3b_mtp_w8a8_dynamic")
        started = time.perf_counter()
        written = write_checkpoint(folder, shape)
        print(
            f"EP: wrote a Qwen3.5-35B-A3B-shaped MTP checkpoint, {experts} experts, "
            f"{written['tensors']} tensors, {written['codes'] / 1e6:.0f} M int8 codes "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        started = time.perf_counter()
        single = _rank_processes(folder, tmp, world=1, ep=1, tag="ep1")[0]
        pair = _rank_processes(folder, tmp, world=2, ep=2, tag="ep2")
        seconds = time.perf_counter() - started
    mismatched, held = [], {}
    for report in pair:
        assert report["ranks"]["moe_ep_size"] == 2, report["ranks"]
        for param, experts_held in report["digests"].items():
            want = single["digests"][param]
            held.setdefault(param, set()).update(experts_held)
            mismatched += [(param, e) for e, d in experts_held.items() if want[e] != d]
    complete = all(held[p] == set(single["digests"][p]) for p in single["digests"])
    total = single["stats"]["decoded_codes"]
    busiest = max(r["stats"]["decoded_codes"] for r in pair)
    fraction = busiest / total
    print("| load | rank | tensors decoded | codes decoded | expert tensors passed on | load s |")
    print("|---|---|---|---|---|---|")
    for label, reports in (("EP=1 (world size 1)", [single]), ("EP=2, TP=2", pair)):
        for r in reports:
            s = r["stats"]
            print(
                f"| {label} | {r['rank']} | {s['dequantized']} | {s['decoded_codes']:,} "
                f"| {s['left_to_other_ranks']} | {r['load_weights_s']:.2f} |"
            )
    print(
        f"busiest EP=2 rank decodes {fraction:.3f} of the EP=1 codes; each rank's experts equal "
        f"the EP=1 load's bit for bit: {not mismatched} "
        f"({sum(len(v) for r in pair for v in r['digests'].values())} expert slices compared, "
        f"all {experts} experts held by some rank: {complete}); {seconds:.0f} s"
    )
    if mismatched or not complete:
        raise AssertionError(
            f"EP=2 experts differ from EP=1: {mismatched[:5]}, complete={complete}"
        )
    return {
        "experts": experts,
        "fraction": fraction,
        "ep1": {k: v for k, v in single.items() if k != "digests"},
        "ep2": [{k: v for k, v in r.items() if k != "digests"} for r in pair],
    }


# -- the candidate bodies for dequantize ---------------------------------------------------


def variant_functions() -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Candidate bodies for ``dequantize`` on the benchmark's case (int8 codes, per-row fp32
    scale, no offset, bf16 output); ``--variants`` first checks each gives the formula's bits.
    """
    bf16, f32 = torch.bfloat16, torch.float32
    empty = torch.empty(0)

    def three_passes(block: int, per_thread: bool = False):
        def body(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            rows, cols = q.shape
            out = torch.empty((rows, cols), dtype=bf16)
            step = max(1, block * (torch.get_num_threads() if per_thread else 1) // cols)
            buf = torch.empty((min(step, rows), cols), dtype=f32)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                work = buf[: r1 - r0]
                work.copy_(q[r0:r1])
                work.mul_(s[r0:r1])
                out[r0:r1].copy_(work)
            return out

        return body

    def mixed_mul(block: int):
        def body(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            rows, cols = q.shape
            out = torch.empty((rows, cols), dtype=bf16)
            step = max(1, block // cols)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                torch.mul(q[r0:r1], s[r0:r1], out=out[r0:r1])
            return out

        return body

    def norm_affine(x: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
        """out = x * s per row in fp32, one rounding: eval-mode batch norm with mean 0, var 1,
        eps 0 and the scale as its weight (bf16 input, fp32 parameters: fp32 arithmetic)."""
        n = x.shape[0]
        torch.ops.aten.native_batch_norm.out(
            x.view(1, n, -1), s.view(-1), None, torch.zeros(n), torch.ones(n), False, 0.0, 0.0,
            out=out.view(1, n, -1), save_mean=empty, save_invstd=empty,
        )  # fmt: skip

    def two_passes(block: int):
        def body(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            rows, cols = q.shape
            out = torch.empty((rows, cols), dtype=bf16)
            step = max(1, block // cols)
            buf = torch.empty((min(step, rows), cols), dtype=bf16)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                work = buf[: r1 - r0]
                work.copy_(q[r0:r1])  # exact: int8 fits bf16's 8-bit significand
                norm_affine(work, s[r0:r1], out[r0:r1])
            return out

        return body

    def two_passes_in_output(block: int):
        def body(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            out = torch.empty(q.shape, dtype=bf16)
            step = max(1, block // q.shape[1]) if block else q.shape[0]
            for qb, sb, ob in zip(q.split(step), s.split(step), out.split(step), strict=True):
                ob.copy_(qb)  # the cast itself: exact
                norm_affine(ob, sb, ob)
            return out

        return body

    def whole_tensor(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (q.to(f32) * s).to(bf16)

    return {
        "3 passes (int8->fp32, mul_, ->bf16), fp32 block 64K": three_passes(1 << 16),
        "3 passes, fp32 block 256K (the shipped body, written out)": three_passes(1 << 18),
        "3 passes, fp32 block 256K per torch thread": three_passes(1 << 18, per_thread=True),
        "3 passes, fp32 block 1M": three_passes(1 << 20),
        "mixed dtypes: torch.mul(int8, fp32, out=bf16), block 256K": mixed_mul(1 << 18),
        "2 passes via a bf16 block of 256K (cast, batch-norm affine into the output)": (
            two_passes(1 << 18)
        ),
        "2 passes in the output (cast, batch-norm affine in place), blocks of 1M": (
            two_passes_in_output(1 << 20)
        ),
        "2 passes in the output, whole tensor": two_passes_in_output(0),
        "2 passes in the output, blocks of 4M": two_passes_in_output(1 << 22),
        "whole tensor: (q.float() * s).to(bf16)": whole_tensor,
    }


def run_variants(reps: int, only: list[str], sets: list[str]) -> None:
    """Time the cast, the shipped ``dequantize`` and the candidate bodies (those whose name
    contains one of ``only``, all when empty) on ``sets``, interleaved, at both thread counts.

    Columns per set: the ratio of the medians, and the median of the per-repetition ratios
    (each repetition's time over the same repetition's cast, seconds apart: on a shared machine
    the steadier of the two).
    """
    items_by_set = {name: make_items(SETS[name]) for name in sets}
    variants = {
        name: fn
        for name, fn in variant_functions().items()
        if not only or any(word in name for word in only)
    }
    for items in items_by_set.values():
        for item in items[:4] + items[-2:]:
            q, s = item.codes, item.decoder.scale
            want = (q.to(torch.float32) * s).to(torch.bfloat16).view(torch.int16)
            for name, fn in variants.items():
                assert torch.equal(fn(q, s).view(torch.int16), want), f"{name} differs"
            assert torch.equal(dequant(item).view(torch.int16), want), "dequantize differs"
    methods: dict[str, Callable[[Item], torch.Tensor]] = {
        "cast (q.to(bf16))": cast,
        "shipped: dequantize (3 passes, fp32 block 256K)": dequant,
    }
    for name, fn in variants.items():
        methods[name] = lambda item, fn=fn: fn(item.codes, item.decoder.scale)
    print(f"candidate bodies, {reps} interleaved repetitions; time / the cast's time")
    header = "| body | threads |" + "".join(
        f" {s} ms | {s}: ratio of medians | {s}: median of ratios |" for s in sets
    )
    print(header)
    print("|---|---|" + "---|---|---|" * len(sets))
    default_threads = torch.get_num_threads()
    first = next(iter(methods))
    for threads in thread_counts():
        torch.set_num_threads(threads)
        t = interleaved(items_by_set, methods, reps)
        for method in methods:
            cells = []
            for s in sets:
                wall, base = t[s][method]["wall"], t[s][first]["wall"]
                per_rep = statistics.median(a / b for a, b in zip(wall, base, strict=True))
                ratio = statistics.median(wall) / statistics.median(base)
                cells.append(f" {median_ms(wall):.0f} | {ratio:.2f} | {per_rep:.2f} |")
            print(f"| {method} | {threads} |" + "".join(cells), flush=True)
    torch.set_num_threads(default_threads)


def block_kernels(
    rows: int, cols: int, gen: torch.Generator
) -> tuple[dict[str, Callable[[], object]], int]:
    """The kernels ``--floor`` times on one (rows, cols) block, every output preallocated."""
    bf16, f32 = torch.bfloat16, torch.float32
    q = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    # near 1: the scale pass runs 200 times on the same block, and a real scale (~1e-3) would
    # take it into subnormals within a few calls, which are far slower
    scale = 1 + torch.rand((rows, 1), generator=gen) * 1e-7
    work = torch.empty((rows, cols), dtype=f32)
    out = torch.empty((rows, cols), dtype=bf16)
    out3 = out.view(1, rows, cols)
    empty, zeros, ones = torch.empty(0), torch.zeros(rows), torch.ones(rows)
    kernels = {
        "cast": lambda: out.copy_(q),
        "to_fp32": lambda: work.copy_(q),
        "scale": lambda: work.mul_(scale),
        "round": lambda: out.copy_(work),
        "norm": lambda: torch.ops.aten.native_batch_norm.out(
            out3,
            scale.view(-1),
            None,
            zeros,
            ones,
            False,
            0.0,
            0.0,
            out=out3,
            save_mean=empty,
            save_invstd=empty,
        ),
    }
    return kernels, q.numel()


def run_floor(reps: int) -> None:
    """Each torch operation of a decode body, timed on one block in cache, against the cast.

    One block of the decoder's size (``affine.BLOCK_ELEMENTS`` codes) per set's row width
    (2048: the MoE experts, 5120: the dense layer), every output preallocated, so what is timed
    is the kernels alone: no allocation, no page fault, no Python loop, inputs in cache. The
    three passes of the shipped body (codes -> fp32, the scale, the one rounding to bf16) are
    timed singly; their sum over the cast is the lowest ratio a body made of them can reach,
    before the loop and the memory traffic the real decode adds. The two-pass candidate is the
    cast itself plus torch's batch-norm kernel scaling the bf16 block in place in fp32.
    """
    from sglang_mtp_dequant.formats.schemes import affine

    gen = torch.Generator().manual_seed(0)
    print(f"kernels on one block of {affine.BLOCK_ELEMENTS} codes in cache, ns per code, "
          f"medians of {reps} runs of 200 calls")  # fmt: skip
    print("| threads | row width | cast int8->bf16 | int8->fp32 | fp32 * row scale | "
          "fp32->bf16 | the three passes / the cast | batch-norm affine, bf16 in place "
          "| cast + batch-norm / the cast |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    default_threads = torch.get_num_threads()
    for threads in thread_counts():
        torch.set_num_threads(threads)
        for cols in (2048, 5120):
            kernels, codes = block_kernels(affine.BLOCK_ELEMENTS // cols, cols, gen)
            samples: dict[str, list[float]] = {k: [] for k in kernels}
            for rep in range(reps + 1):
                for name, kernel in kernels.items():
                    started = time.perf_counter()
                    for _ in range(200):
                        kernel()
                    if rep:
                        samples[name].append((time.perf_counter() - started) / 200)
            ns = {k: statistics.median(v) * 1e9 / codes for k, v in samples.items()}
            passes = ns["to_fp32"] + ns["scale"] + ns["round"]
            print(
                f"| {threads} | {cols} | {ns['cast']:.3f} | {ns['to_fp32']:.3f} "
                f"| {ns['scale']:.3f} | {ns['round']:.3f} | **{passes / ns['cast']:.2f}** "
                f"| {ns['norm']:.3f} | **{(ns['cast'] + ns['norm']) / ns['cast']:.2f}** |",
                flush=True,
            )
    torch.set_num_threads(default_threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", default=None)
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--floor", action="store_true", help="the kernels of a body, in cache")
    parser.add_argument(
        "--only", action="append", default=[], help="with --variants: bodies whose name has this"
    )
    parser.add_argument(
        "--sets", nargs="+", default=list(SETS), choices=list(SETS), help="with --variants"
    )
    parser.add_argument("--skip-ep", action="store_true")
    parser.add_argument("--ep-experts", type=int, default=256)
    parser.add_argument("--child-peak", nargs=2, metavar=("SET", "METHOD"))
    parser.add_argument("--mem-runs", type=int, default=3, help="fresh processes per set, method")
    args = parser.parse_args()
    if args.child_peak:
        child_peak(*args.child_peak)
        return 0
    print(describe(), flush=True)
    if args.variants:
        run_variants(args.reps, args.only, args.sets)
        return 0
    if args.floor:
        run_floor(args.reps)
        return 0

    started = time.perf_counter()
    items_by_set = {name: make_items(shapes) for name, shapes in SETS.items()}
    for name, items in items_by_set.items():
        codes = sum(i.codes.numel() for i in items)
        print(f"set {name}: {len(items)} tensors, {codes / 1e6:.0f} M int8 codes")
    record: dict = {"machine": describe(), "reps": args.reps, "timing": {}}
    ratios = []
    default_threads = torch.get_num_threads()
    print(f"\ndecode vs cast, {args.reps} interleaved repetitions, medians:")
    print("| threads | set | cast ms | dequant ms | **ratio** | CPU ratio |")
    print("|---|---|---|---|---|---|")
    for threads in thread_counts():
        torch.set_num_threads(threads)
        timings = interleaved(items_by_set, METHODS, args.reps)
        for name in items_by_set:
            t = timings[name]
            cast_ms, deq_ms = median_ms(t["cast"]["wall"]), median_ms(t["dequant"]["wall"])
            cpu_ratio = median_ms(t["dequant"]["cpu"]) / median_ms(t["cast"]["cpu"])
            ratios.append(deq_ms / cast_ms)
            print(
                f"| {threads} | {name} | {cast_ms:.0f} | {deq_ms:.0f} | **{deq_ms / cast_ms:.2f}** "
                f"| {cpu_ratio:.2f} |",
                flush=True,
            )
            record["timing"][f"{name}, {threads} thread(s)"] = t
    torch.set_num_threads(default_threads)
    del items_by_set

    growth = peak_memory_runs(args.mem_runs)
    extras: dict[str, float] = {}
    print(
        f"\npeak memory, {default_threads} threads, one decoded tensor alive at a time: RSS "
        f"growth of fresh processes in MiB; live: glibc's mmap threshold fixed, medians of "
        f"{args.mem_runs} (each run in brackets); default: glibc as it comes, one run"
    )
    print("| set | cast, live | dequant, live | **extra, live** | cast, default | dequant, default "
          "| extra, default | largest output |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for s in SETS:
        live = {m: statistics.median(g) / MIB for m, g in growth["live"][s].items()}
        runs = {m: " ".join(f"{g / MIB:.2f}" for g in growth["live"][s][m]) for m in METHODS}
        default = {m: g[0] / MIB for m, g in growth["default"][s].items()}
        extras[s] = live["dequant"] - live["cast"]
        print(
            f"| {s} | {live['cast']:.2f} ({runs['cast']}) | {live['dequant']:.2f} "
            f"({runs['dequant']}) | **{extras[s]:.2f}** | {default['cast']:.2f} "
            f"| {default['dequant']:.2f} | {default['dequant'] - default['cast']:.2f} "
            f"| {largest_output_mib(s):.1f} |"
        )
    print(
        f"(one fp32 block buffer of the decoder: {block_buffer_mib():.2f} MiB; the kernel's RSS "
        "counters are batched, so a growth is exact only to a few hundred KiB)"
    )
    record["memory"] = {"growth_bytes": growth, "extra_live_mib": extras}

    fraction = float("nan")
    if not args.skip_ep:
        print()
        ep = expert_parallel(args.ep_experts)
        record["expert_parallel"] = ep
        fraction = ep["fraction"]
    record["load_average_end"] = os.getloadavg()[0]
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
    print(f"total {time.perf_counter() - started:.0f} s, load average now {os.getloadavg()[0]:.1f}")
    print(
        f"dequant_vs_cast_ratio {max(ratios):.2f} ep2_rank_decode_fraction {fraction:.3f} "
        f"peak_extra_mb {max(extras.values()):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
