"""How loading and ``doctor`` scale with the number of experts in one shard: plugin vs stock.

Usage (``make bench-scaling`` runs the first line)::

    .venv/bin/python benchmarks/bench_scaling.py --json .cache/bench/scaling.json
    .venv/bin/python benchmarks/bench_scaling.py --experts 64 128 --reps 3

For each N in ``--experts`` (default 64, 128, 256, 512) a Qwen3.5-MoE W8A8_DYNAMIC draft with
N routed experts is written into ONE safetensors file (``moe_draft.py``: the test fixture's
dimensions, hidden 64 and expert intermediate 32, so the cost measured is per tensor, not per
byte; 9 tensors per expert: three weights, each with weight_scale and weight_offset). Then,
in this process (sglang's CPU set-up of ``cpu_sglang.prepare_cpu_process``, plugins loaded by
sglang's own ``load_plugins()``):

- ``stock``: sglang's real ``Qwen3_5ForCausalLMMTP`` (``build_draft`` of the checkpoint's
  ``draft_model_config``) loaded from ``DefaultModelLoader``'s own weight stream
  (``sglang_weights``) by the unwrapped ``load_weights.__wrapped__``: what sglang does alone
  (it loads the raw codes, wrongly, but pays the same loader costs);
- ``plugin``: the same, through the hook: planning (headers, companions), the decoding stream
  and the misload guard;
- ``doctor``: ``doctor.diagnose(folder)`` (plan, stock prediction and the meta-device dry run
  of sglang's draft class), in this warm process, and ``diagnose(folder, dry_run=False)``
  (the plan and the table without the dry run);
- ``doctor CLI``: ``sglang-mtp-dequant doctor FOLDER --json`` in a fresh process, what an
  operator runs (interpreter start and imports included), once per N.

Loads are interleaved (stock, plugin, plugin, stock, ...) after one untimed warm-up load of
each kind; the draft is built anew before every load (not timed). Medians of ``--reps``.
Everything is written under one ``tempfile.TemporaryDirectory`` and removed at the end.

Targets (from the issue): at 512 experts the plugin's load within 3x stock's, and doctor at
512 experts within 4x doctor at 64. Ends with:
``scaling plugin_vs_stock_512 <X> doctor_512_vs_64 <Y> doctor_cli_512_vs_64 <Z>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
from machine import describe, finish
from moe_draft import MoeShape, write_checkpoint


@contextlib.contextmanager
def quiet_stderr():
    """sglang's per-shard progress bar writes to fd 2 on every load (its ``disable`` argument
    is explicit, so TQDM_DISABLE does not reach it): silence it around the timed calls; an
    exception still propagates and is printed once stderr is back."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def load_once(folder: str, plugin: bool) -> float:
    """One ``load_weights`` of a freshly built draft; seconds of the load alone."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    config, model = new_draft(folder)
    method = type(model).load_weights
    if not plugin:
        method = method.__wrapped__
    weights = sglang_weights(config, model)
    started = time.perf_counter()
    method(model, weights)
    return time.perf_counter() - started


def doctor_cli(folder: str, log: str) -> float:
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    started = time.perf_counter()
    run = subprocess.run(
        [script, "doctor", folder, "--json", "--log", log], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if run.returncode != 0 or json.loads(run.stdout)["verdict"] != "ok":
        raise RuntimeError(f"doctor failed on {folder}: {run.stdout[-2000:]}{run.stderr[-2000:]}")
    return seconds


def measure(folder: str, reps: int, cli_log: str | None) -> dict:
    from sglang_mtp_dequant.tools.doctor import diagnose

    times: dict[str, list[float]] = {"stock": [], "plugin": [], "doctor": [], "plan_only": []}
    load_once(folder, False)  # warm-up of each kind: page cache, first-call costs
    load_once(folder, True)
    report = diagnose(folder)
    assert report.verdict == "ok", report.problems
    for rep in range(reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        for plugin in order:
            times["plugin" if plugin else "stock"].append(load_once(folder, plugin))
        started = time.perf_counter()
        diagnose(folder)
        times["doctor"].append(time.perf_counter() - started)
        started = time.perf_counter()
        diagnose(folder, dry_run=False)
        times["plan_only"].append(time.perf_counter() - started)
    result = {k: statistics.median(v) for k, v in times.items()}
    result["samples"] = times
    result["draft_tensors"] = len(report.tensors)
    result["doctor_cli"] = doctor_cli(folder, cli_log) if cli_log else None
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--experts", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-cli", action="store_true", help="skip the fresh-process doctor")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(describe(), flush=True)
    started = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        folders = {}
        for n in args.experts:
            folders[n] = os.path.join(tmp, f"q35moe_{n}_experts")
            written = write_checkpoint(folders[n], MoeShape.tiny(n))
            rows[n] = {"file_tensors": written["tensors"]}
        from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

        prepare_cpu_process(folders[args.experts[0]])
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang_mtp_dequant.serving.context import registered_targets

        target = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
        assert target in registered_targets(), "load_plugins() did not hook the draft class"
        logging.disable(logging.WARNING)
        for n in args.experts:
            cli_log = None if args.no_cli else os.path.join(tmp, f"doctor-{n}.log")
            with quiet_stderr():
                rows[n].update(measure(folders[n], args.reps, cli_log))
            samples = ", ".join(
                f"{k} " + " ".join(f"{s:.3f}" for s in v) for k, v in rows[n]["samples"].items()
            )
            print(f"  {n} experts: {samples}", flush=True)
        logging.disable(logging.NOTSET)
    print(f"\none shard, medians of {args.reps} interleaved loads (seconds):")
    print(
        "| experts | tensors in the file | stock load | plugin load | plugin / stock "
        "| diagnose() | ms per draft tensor | diagnose(dry_run=False) | doctor CLI |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        cli = f"{r['doctor_cli']:.2f}" if r["doctor_cli"] is not None else "-"
        per_tensor = r["doctor"] / r["draft_tensors"] * 1000
        print(
            f"| {n} | {r['file_tensors']} | {r['stock']:.3f} | {r['plugin']:.3f} "
            f"| {r['plugin'] / r['stock']:.2f} | {r['doctor']:.3f} | {per_tensor:.2f} "
            f"| {r['plan_only']:.3f} | {cli} |"
        )
    print(
        "(diagnose(): the doctor's whole answer in this warm process, the meta-device dry run "
        "of sglang's draft class included; doctor CLI: `sglang-mtp-dequant doctor --json` in "
        "a fresh process, once)"
    )
    first, last = rows[args.experts[0]], rows[args.experts[-1]]
    load_ratio = last["plugin"] / last["stock"]
    doctor_ratio = last["doctor"] / first["doctor"]
    cli_ratio = (
        last["doctor_cli"] / first["doctor_cli"]
        if first["doctor_cli"] is not None
        else float("nan")
    )
    n0, n1 = args.experts[0], args.experts[-1]
    print(
        f"at {n1} experts the plugin's load is {load_ratio:.2f}x stock's (target <= 3); "
        f"diagnose() at {n1} is {doctor_ratio:.2f}x diagnose() at {n0} (target <= 4; "
        f"{n1 // n0}x the tensors); the doctor CLI {cli_ratio:.2f}x"
    )
    finish(started, args.json, args.reps, rows)
    print(
        f"scaling plugin_vs_stock_{n1} {load_ratio:.2f} doctor_{n1}_vs_{n0} {doctor_ratio:.2f} "
        f"doctor_cli_{n1}_vs_{n0} {cli_ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
