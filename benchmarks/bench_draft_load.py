"""sglang's own draft load, stock vs plugin, as the checkpoint grows target tensors around it.

Usage (``make bench-draft-load`` runs the first line)::

    .venv/bin/python benchmarks/bench_draft_load.py --json .cache/bench/draft_load.json
    .venv/bin/python benchmarks/bench_draft_load.py --targets 0 200000 --reps 3
    .venv/bin/python benchmarks/bench_draft_load.py --targets 0 276000 --reps 9

For each N in ``--targets`` (default 0, 50,000, 100,000, 200,000, 400,000) the msmodelslim-written
Qwen3.5 dense W8A8_DYNAMIC fixture (``q35_dense_w8a8_dynamic``: target and MTP draft) is
rewritten as a sharded V1 export (``test/support/sharded.py``): N tiny W8A8_DYNAMIC target
expert tensors over four shards, the fixture's own tensors in the shard after them, every name
in ``quant_model_weights.safetensors.index.json`` and the description. The draft sits behind N
tensors it never reads; the cost of walking them is per tensor, not per byte.

In this process (sglang's CPU set-up of ``cpu_sglang.prepare_cpu_process``, plugins loaded by
sglang's own ``load_plugins()``), each load is sglang's ``DefaultModelLoader.load_model`` of the
draft's ``ModelConfig`` (``support.cpu_sglang.load_model``: build, file resolution, weight
stream, the class's ``load_weights``, post-processing):

- ``stock``: with the plugin's hook bypassed (``plugin.bypassed``): what sglang does alone;
- ``plugin``: through the hook: the narrowed file list, planning, decoding and the guard.

Loads alternate (stock, plugin, plugin, stock, ...) after one untimed load of each kind; the
median of ``--reps`` per kind and size. Beside them, sglang's own ServerArgs and ``ModelConfig``
of the draft before each load (the same code either way: what sglang spends on the checkpoint's
size before the loader starts), and the plain read of the index and the description (``read``:
the bytes any narrowing reads to learn which files hold the draft's tensors). Every plugin load
must stream one file and load parameters bit-identical to the plugin's load of the unsharded
fixture (checked, not timed).
Everything is written under one ``tempfile.TemporaryDirectory`` and removed at the end.

Target (issue #27): plugin / stock <= 0.4 at 200,000 target tensors, and the plugin's load flat
in N. Ends with ``draft_load plugin_vs_stock_<N> <R> plugin_<max>_vs_plugin_0 <F>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
from bench_scaling import quiet_stderr
from machine import describe, finish

from support.paths import fixture_dir
from support.sharded import write_sharded

FIXTURE = "q35_dense_w8a8_dynamic"
TARGET_SHARDS = 4
GOAL_AT = 200_000
KINDS = ("stock", "plugin")
LISTINGS = ("quant_model_weights.safetensors.index.json", "quant_model_description.json")


def write_checkpoint(folder: str, targets: int) -> int:
    """The fixture behind ``targets`` target tensors in TARGET_SHARDS shards; the file count."""
    if targets == 0:
        return len(write_sharded(fixture_dir(FIXTURE), folder, lambda name: 1))
    per_shard = [targets // TARGET_SHARDS] * TARGET_SHARDS
    per_shard[-1] += targets - sum(per_shard)
    filler = {i + 1: n for i, n in enumerate(per_shard)}
    last = TARGET_SHARDS + 1
    return len(write_sharded(fixture_dir(FIXTURE), folder, lambda name: last, filler=filler))


def load_once(folder: str, plugin: bool):
    """One ``DefaultModelLoader.load_model`` of the draft; ``(seconds, model, config_seconds)``,
    the last being sglang's own ServerArgs + ``ModelConfig`` of the draft before the load (the
    same code with or without the plugin; it parses the description too)."""
    from sglang_mtp_dequant.serving.plugin import bypassed
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, publish_context
    from support.cpu_sglang import load_model

    started = time.perf_counter()
    publish_context(folder)
    config = draft_model_config(folder)
    configured = time.perf_counter()
    if plugin:
        model = load_model(config)
    else:
        with bypassed():
            model = load_model(config)
    return time.perf_counter() - configured, model, configured - started


def read_listings(folder: str) -> float:
    """Seconds to read the index and the description's bytes (page cache warm after a load)."""
    started = time.perf_counter()
    for name in LISTINGS:
        with open(os.path.join(folder, name), "rb") as handle:
            handle.read()
    return time.perf_counter() - started


def parameters(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if n != "lm_head.weight"}


def check_plugin_load(model, reference: dict, files: int) -> str:
    """The plugin's load streamed one file and holds the unsharded fixture's parameters."""
    import torch

    from sglang_mtp_dequant.serving.load import last_draft_load

    load = last_draft_load()
    assert load is not None
    assert load.skipped_files == files - 1, load.narrowing_summary()
    got = parameters(model)
    assert set(got) == set(reference)
    for name, want in reference.items():
        assert torch.equal(got[name].view(torch.uint8), want.view(torch.uint8)), name
    return load.narrowing_summary() or ""


def measure(folder: str, files: int, reps: int, reference: dict) -> dict:
    times: dict[str, list[float]] = {kind: [] for kind in (*KINDS, "config", "read")}
    said = ""
    for rep in range(reps):
        for plugin in (False, True) if rep % 2 == 0 else (True, False):
            seconds, model, config_seconds = load_once(folder, plugin)
            times["plugin" if plugin else "stock"].append(seconds)
            times["config"].append(config_seconds)
            if plugin:
                said = check_plugin_load(model, reference, files)
            del model
            times["read"].append(read_listings(folder))
    result: dict = {k: statistics.median(v) for k, v in times.items()}
    result["samples"] = times
    result["plugin_says"] = said
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--targets", type=int, nargs="+", default=[0, 50_000, 100_000, 200_000, 400_000]
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(describe(), flush=True)
    started = time.perf_counter()
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-draft-load-") as tmp:
        folders = {}
        for n in args.targets:
            folders[n] = os.path.join(tmp, f"q35_dense_behind_{n}")
            rows[n] = {"files": write_checkpoint(folders[n], n)}
        from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

        prepare_cpu_process(folders[args.targets[0]])
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang_mtp_dequant.serving.context import registered_targets

        target = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
        assert target in registered_targets(), "load_plugins() did not hook the draft class"
        logging.disable(logging.WARNING)
        with quiet_stderr():
            load_once(fixture_dir(FIXTURE), False)  # untimed: first-call costs of each kind
            reference = parameters(load_once(fixture_dir(FIXTURE), True)[1])
        for n in args.targets:
            with quiet_stderr():
                rows[n].update(measure(folders[n], rows[n]["files"], args.reps, reference))
            samples = ", ".join(
                f"{k} " + " ".join(f"{s:.3f}" for s in v) for k, v in rows[n]["samples"].items()
            )
            print(f"  {n} target tensors: {samples}; plugin: {rows[n]['plugin_says']}", flush=True)
        logging.disable(logging.NOTSET)
    base = rows[args.targets[0]]["plugin"]
    print(f"\nDefaultModelLoader.load_model of the draft, medians of {args.reps} alternated loads:")
    print("| target tensors | files | stock (s) | plugin (s) | plugin / stock | plugin / plugin at "
          f"{args.targets[0]} | sglang's ModelConfig before either (s) | reading index + "
          "description (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(
            f"| {n:,} | {r['files']} | {r['stock']:.3f} | {r['plugin']:.3f} "
            f"| {r['plugin'] / r['stock']:.2f} | {r['plugin'] / base:.2f} | {r['config']:.3f} "
            f"| {r['read']:.3f} |"
        )
    at = GOAL_AT if GOAL_AT in rows else args.targets[-1]
    ratio = rows[at]["plugin"] / rows[at]["stock"]
    last = args.targets[-1]
    flat = rows[last]["plugin"] / base
    print(
        f"at {at:,} target tensors the plugin's draft load is {ratio:.2f}x stock's (goal <= 0.4); "
        f"at {last:,} it is {flat:.2f}x the plugin's load at {args.targets[0]:,} (flat: ~1)"
    )
    if last != args.targets[0]:
        span = last - args.targets[0]
        slope = {
            k: (rows[last][k] - rows[args.targets[0]][k]) / span * 1e6
            for k in (*KINDS, "config", "read")
        }
        print(
            f"per target tensor, {args.targets[0]:,} to {last:,}: stock {slope['stock']:.2f} us, "
            f"plugin {slope['plugin']:.2f} us (sglang's ModelConfig before the load: "
            f"{slope['config']:.2f} us; reading the index and the description: "
            f"{slope['read']:.2f} us)"
        )
    finish(started, args.json, args.reps, rows)
    print(
        f"draft_load plugin_vs_stock_{at} {ratio:.2f} "
        f"plugin_{last}_vs_plugin_{args.targets[0]} {flat:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
