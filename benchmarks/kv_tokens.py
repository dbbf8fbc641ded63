"""KV tokens in sglang's own server on the CPU: the draft's vocab copies never allocated, or stock.

Usage::

    .venv/bin/python benchmarks/kv_tokens.py                        # every fixture, 3 rounds
    .venv/bin/python benchmarks/kv_tokens.py --fixtures float --rounds 2 --reading host
    .venv/bin/python benchmarks/kv_tokens.py --json .cache/bench/kv_tokens.json

Issue #50, item 2. Each run is sglang's own server as the end-to-end harness starts it
(``e2e/server.py``: ``python -m sglang.launch_server`` with EAGLE 3/1/4, the CPU flags, a free
loopback port, ``/health`` awaited, the process group stopped after), serving a copy of an e2e
float fixture (``float``: every layer full attention; ``hybrid``: Gated DeltaNet, which also
sizes a Mamba state pool, and ``hybrid-radix`` the same with sglang's radix cache on, which
fits that pool to memory) whose embedding, lm_head and ``vocab_size`` are padded to Qwen3.5's
real vocabulary (248,320 rows; zero rows, written to a temporary folder). The launch flags are
the harness's, less its ``--max-total-tokens`` / ``--max-running-requests`` caps (sglang sizes
the pools itself) and with ``--mem-fraction-static`` given here. Three arms, same flags, their
order rotated round by round so a drift of the machine falls on all of them:

- ``stock``: the plugin off (``SGLANG_PLUGINS=none``);
- ``own``: the plugin on, ``SGLANG_MTP_DEQUANT_SHARE_VOCAB=off`` (its switch: as stock);
- ``plugin``: the plugin on; the draft's ``embed_tokens`` / ``lm_head`` never allocated.

Per run: sglang's ``max_total_num_tokens`` (and ``max_mamba_cache_size``), the draft's ``mem
usage`` as sglang logs it at ``Load weight end``, the plugin's INFO line, and two greedy
requests (16 tokens each) whose output ids and ``spec_accept_length`` must agree across arms.

What the number means on a CPU: sglang sizes its pools from free memory read twice (before the
weights load, and at sizing), and on a CPU that is the host's ``MemAvailable``, so whatever
other processes on this shared machine allocate in between moves the pool by more than the
draft's vocabulary does (``--reading host`` shows it). ``--reading device`` (the default)
gives each server's processes a device of ``--device-gib`` whose free memory is that size less
what the process holds (``e2e/site/e2e_shim_device_memory.py``: what an accelerator reports to
the rank that owns it), and one more stock run on a device ``--calibrate-mib`` larger measures
sglang's own conversion of bytes into tokens (and Mamba slots): ``bytes/token`` below. Only
written pages are resident on a CPU: stock's draft writes its embedding copy (the checkpoint's
embedding, loaded into it) and never touches its lm_head copy, so the expected gain here is the
embedding copy (vocab x hidden x 4 bytes, float32) over ``bytes/token``; on an accelerator
both copies are allocated and both come back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.machine import describe  # noqa: E402
from e2e.client import generate  # noqa: E402
from e2e.inputs import heldout_prompts  # noqa: E402
from e2e.server import Server, ServerRun  # noqa: E402

#: name -> (e2e fixture, harness flags dropped besides the caps): ``hybrid-radix`` keeps sglang's
#: radix cache on, so it fits ``max_mamba_cache_size`` to memory (under ``--disable-radix-cache``
#: it is the running-request count: 48 with EAGLE)
FIXTURES = {
    "float": ("test/fixtures/e2e/float", ()),
    "hybrid": ("test/fixtures/e2e/hybrid_float", ()),
    "hybrid-radix": ("test/fixtures/e2e/hybrid_float", ("--disable-radix-cache",)),
}
#: Qwen3.5's vocabulary (config.json vocab_size of every Qwen3.5 / 3.6 checkpoint)
VOCAB = 248_320
ARMS = ("stock", "own", "plugin")
#: the e2e launch's caps, removed: sglang sizes the pools from memory
UNCAPPED = ("--max-total-tokens", "--max-running-requests")
SWITCH = "SGLANG_MTP_DEQUANT_SHARE_VOCAB"
DEVICE_ENV = "E2E_DEVICE_BYTES"
DEVICE_LINE = "get_free_cpu_memory answers a device of"
PATTERNS = {
    "tokens": re.compile(r"max_total_num_tokens=(\d+)"),
    "mamba": re.compile(r"max_mamba_cache_size: (\d+)"),
    "draft_gb": re.compile(r"type=\w+MTP, .*mem usage=(-?[\d.]+) GB"),
    "held_back": re.compile(r"sglang-mtp-dequant: .* ([\d,]+) bytes on this rank never allocated"),
}


@dataclass(frozen=True)
class MeasuredRun(ServerRun):
    """A harness run with the pools uncapped, its own ``--mem-fraction-static``, the vocab
    switch, and (``device_bytes``) the device reading of ``e2e_shim_device_memory``."""

    fraction: str = "0.3"
    share_vocab: bool = True
    device_bytes: int | None = None
    dropped: tuple[str, ...] = ()

    def command(self, port: int) -> list[str]:
        cmd = super().command(port)
        for flag in UNCAPPED:
            at = cmd.index(flag)
            del cmd[at : at + 2]
        cmd = [part for part in cmd if part not in self.dropped]
        cmd[cmd.index("--mem-fraction-static") + 1] = self.fraction
        return cmd

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env[SWITCH] = "on" if self.share_vocab else "off"
        env.pop(DEVICE_ENV, None)
        if self.device_bytes is not None:
            env[DEVICE_ENV] = str(self.device_bytes)
        return env


@dataclass
class Result:
    fixture: str
    arm: str
    tokens: int
    mamba: int | None
    draft_gb: float | None
    held_back: int | None
    outputs: list[list[int]]
    accept: list[float]
    seconds: float
    device_bytes: int | None
    command: str = field(repr=False, default="")


def padded_fixture(source: str, dest: str, vocab: int = VOCAB) -> dict[str, Any]:
    """``source`` copied to ``dest`` with its embedding and lm_head padded with zero rows to
    ``vocab`` rows and ``vocab_size`` set to it; returns the new config."""
    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if name.endswith(".safetensors"):
            tensors = load_file(path)
            for key in ("model.embed_tokens.weight", "lm_head.weight"):
                rows = tensors[key]
                pad = torch.zeros(vocab - rows.shape[0], rows.shape[1], dtype=rows.dtype)
                tensors[key] = torch.cat([rows, pad])
            save_file(tensors, os.path.join(dest, name), metadata={"format": "pt"})
        elif name != "config.json" and os.path.isfile(path):
            shutil.copy(path, dest)
    with open(os.path.join(source, "config.json")) as handle:
        config = json.load(handle)
    config["vocab_size"] = vocab
    with open(os.path.join(dest, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    return config


def parse_log(path: str, device: bool) -> dict[str, Any]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    if device and DEVICE_LINE not in text:
        raise RuntimeError(f"{path}: the device reading's shim did not announce itself")
    found: dict[str, Any] = {}
    for key, pattern in PATTERNS.items():
        hits = pattern.findall(text)
        found[key] = hits[-1].replace(",", "") if hits else None
    if found["tokens"] is None:
        raise RuntimeError(f"{path}: no max_total_num_tokens line")
    return {
        "tokens": int(found["tokens"]),
        "mamba": None if found["mamba"] is None else int(found["mamba"]),
        "draft_gb": None if found["draft_gb"] is None else float(found["draft_gb"]),
        "held_back": None if found["held_back"] is None else int(found["held_back"]),
    }


def measure(fixture: str, folder: str, arm: str, args: argparse.Namespace, index: int,
            device_bytes: int | None, prompts: list[list[int]]) -> Result:  # fmt: skip
    """One server of ``arm`` up, two greedy requests, down; its figures from its log."""
    run = MeasuredRun(
        f"kv-{fixture}-{index:02d}-{arm}", folder, speculative=True, plugin=arm != "stock",
        draft_quantization=None, fraction=args.fraction, share_vocab=arm == "plugin",
        device_bytes=device_bytes, dropped=FIXTURES[fixture][1],
    )  # fmt: skip
    started = time.perf_counter()
    with Server(run, args.log_dir) as server:
        answers = [generate(server.url, ids, max_new_tokens=16) for ids in prompts]
        command = run.shell_command(server.port)
    figures = parse_log(server.log_path, device_bytes is not None)
    return Result(
        fixture, arm, **figures, outputs=[a.output_ids for a in answers],
        accept=[float(a.meta.get("spec_accept_length", 0.0)) for a in answers],
        seconds=time.perf_counter() - started, device_bytes=device_bytes,
        command=f"{DEVICE_ENV}={device_bytes} {command}" if device_bytes else command,
    )  # fmt: skip


def spread(values: list[int]) -> str:
    if not values:
        return "-"
    mean = statistics.mean(values)
    return f"{mean:,.0f} ({min(values):,}-{max(values):,}, n={len(values)})"


def summarize(fixture: str, config: dict, results: list[Result], args: argparse.Namespace) -> str:
    """The fixture's table row: tokens (and Mamba slots) per arm with their spread, the gain,
    and the gain expected from the bytes stock's draft holds resident and ``bytes/token``."""
    by_arm = {arm: [r for r in results if r.arm == arm] for arm in ARMS}
    tokens = {arm: [r.tokens for r in rows] for arm, rows in by_arm.items()}
    mean = {arm: statistics.mean(values) for arm, values in tokens.items()}
    gain = mean["plugin"] - mean["stock"]
    resident = VOCAB * config["hidden_size"] * 4  # the embedding copy, float32, TP 1
    lines = [
        f"{fixture}: max_total_num_tokens stock {spread(tokens['stock'])}, own (switch off) "
        f"{spread(tokens['own'])}, plugin {spread(tokens['plugin'])}; gain over stock "
        f"{gain:,.0f} tokens ({gain / mean['stock']:+.1%}), over own "
        f"{mean['plugin'] - mean['own']:,.0f}"
    ]
    mamba = {arm: [r.mamba for r in rows if r.mamba is not None] for arm, rows in by_arm.items()}
    if fixture.startswith("hybrid"):
        lines.append(
            f"{fixture}: max_mamba_cache_size stock {spread(mamba['stock'])}, own "
            f"{spread(mamba['own'])}, plugin {spread(mamba['plugin'])}"
        )
    calibration = [r for r in results if r.arm == "calibration"]
    if calibration:
        per_token = float(args.fraction) * args.calibrate_mib * 2**20
        per_token /= calibration[0].tokens - statistics.mean(tokens["stock"])
        lines.append(
            f"{fixture}: bytes/token {per_token:,.0f} (stock on a device {args.calibrate_mib} MiB "
            f"larger: +{calibration[0].tokens - statistics.mean(tokens['stock']):,.0f} tokens); "
            f"resident bytes given back {resident:,} (the embedding copy) -> expected gain "
            f"{resident / per_token:,.0f} tokens; measured {gain:,.0f} over stock, "
            f"{mean['plugin'] - mean['own']:,.0f} over own"
        )
        slots = {arm: statistics.mean(values) for arm, values in mamba.items() if values}
        if calibration[0].mamba is not None and calibration[0].mamba != slots.get("stock"):
            per_slot = float(args.fraction) * args.calibrate_mib * 2**20
            per_slot /= calibration[0].mamba - slots["stock"]
            over = {arm: slots["plugin"] - slots[arm] for arm in ("stock", "own")}
            lines.append(
                f"{fixture}: bytes/Mamba slot {per_slot:,.0f} (the same run: "
                f"+{calibration[0].mamba - slots['stock']:,.0f} slots) -> expected gain "
                f"{resident / per_slot:,.0f} slots; measured {over['stock']:,.0f} over stock, "
                f"{over['own']:,.0f} over own"
            )
    held = {r.held_back for r in by_arm["plugin"]}
    draft = {arm: sorted({r.draft_gb for r in rows}) for arm, rows in by_arm.items()}
    outputs = {json.dumps(r.outputs) for r in results}
    accept = {arm: sorted({tuple(r.accept) for r in rows}) for arm, rows in by_arm.items()}
    lines.append(
        f"{fixture}: plugin's INFO bytes {sorted(held)}; draft mem usage at Load weight end (GB) "
        f"{draft}; greedy outputs identical in all {len(results)} runs: {len(outputs) == 1}; "
        f"spec_accept_length per arm {accept}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fixtures", nargs="*", default=list(FIXTURES), choices=list(FIXTURES))
    parser.add_argument("--rounds", type=int, default=3, help="runs per arm, order rotated")
    parser.add_argument("--reading", choices=("device", "host"), default="device")
    parser.add_argument("--device-gib", type=float, default=4.0)
    parser.add_argument("--calibrate-mib", type=int, default=256)
    parser.add_argument("--fraction", default="0.3", help="--mem-fraction-static")
    parser.add_argument("--log-dir", default=os.path.join(ROOT, ".cache", "bench", "kv_tokens"))
    parser.add_argument("--json", default=None, help="write every run here")
    parser.add_argument(
        "--summarize", help="print a --json file's summaries again (run with the same flags)"
    )
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as handle:
            runs = [Result(**run) for run in json.load(handle)]
        for fixture in dict.fromkeys(r.fixture for r in runs):
            config = json.load(open(os.path.join(ROOT, FIXTURES[fixture][0], "config.json")))
            rows = [r for r in runs if r.fixture == fixture]
            print(summarize(fixture, config, rows, args), flush=True)
        return 0
    if args.reading == "host" and args.fraction == "0.3":
        args.fraction = "0.08"  # of the host's free memory: a pool of about 1.5 GB here
    device = int(args.device_gib * 2**30) if args.reading == "device" else None
    print(describe(), flush=True)
    print(f"reading {args.reading}; load average {os.getloadavg()}", flush=True)
    prompts = heldout_prompts(2, 32)
    everything: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="kv-tokens-") as root:
        for fixture in args.fixtures:
            folder = os.path.join(root, fixture)
            config = padded_fixture(os.path.join(ROOT, FIXTURES[fixture][0]), folder)
            results: list[Result] = []
            for round_ in range(args.rounds):
                for arm in ARMS[round_ % 3 :] + ARMS[: round_ % 3]:
                    result = measure(fixture, folder, arm, args, len(everything), device, prompts)
                    everything.append(result)
                    results.append(result)
                    print(f"{fixture} {arm}: tokens {result.tokens:,} mamba {result.mamba} "
                          f"draft {result.draft_gb} GB held back {result.held_back} accept "
                          f"{result.accept} ({result.seconds:.0f} s)", flush=True)  # fmt: skip
            if device is not None:
                extra = device + args.calibrate_mib * 2**20
                result = measure(fixture, folder, "stock", args, len(everything), extra, prompts)
                result.arm = "calibration"
                everything.append(result)
                results.append(result)
                print(f"{fixture} calibration: tokens {result.tokens:,} mamba {result.mamba}")
            print(summarize(fixture, config, results, args), flush=True)
            for shown in {r.arm: r for r in results}.values():
                print(f"command ({shown.arm}): {shown.command}", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in everything], handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
