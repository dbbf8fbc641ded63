"""sglang's server start-up with the plugin on and off, on a checkpoint the plugin leaves untouched.

Usage::

    .venv/bin/python benchmarks/bench_startup.py [--pairs 3] [--folder test/fixtures/e2e/w8a8]

Issue #40, item 6: a ModelSlim export whose every layer has its method (the bundled
Qwen3.5-recipe hybrid export ``test/fixtures/e2e/hybrid_w8a8`` by default, or the dense W8A8
fixture) must start in the same time with the plugin as without. Each start is sglang's own
server as the end-to-end harness starts it on the CPU (``e2e/server.py``: ``python -m
sglang.launch_server --quantization modelslim``, no speculation, a free loopback port, ``/health``
awaited, then the whole process group stopped and nothing left running), the plugin on (the
default) and off (``SGLANG_PLUGINS=none``), alternated pair by pair (on/off, then off/on), so a
drift of the machine's speed falls on both arms.

Per start it prints the seconds until ``/health`` answered and sglang's own start-up timings
from the server's log (``Engine startup timings``: ``load_weight``, which holds the plugin's
load-time hooks, ``scheduler_e2e`` and ``tokenizer_e2e``). What the plugin does outside the
model load is sglang's ``load_plugins()`` in each process (import the plugin, ``register()``,
apply its hooks): ``--plugin-reps`` fresh interpreters time that call, sglang's scheduler
module imported first as in the scheduler process, plugin on and off. Then min and median per
arm. The machine is shared: the load average is printed before and after, and the minimum is
the figure to compare. Last line::

    startup <folder> pairs N ready_s on=min/median off=min/median load_weight_s on=.. off=.. \\
        load_plugins_ms on=.. off=..
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from e2e.machine import describe  # noqa: E402
from e2e.plan import MODELSLIM  # noqa: E402
from e2e.server import Server, ServerRun  # noqa: E402

#: sglang 0.5.23's start-up summary line in a server's log
TIMINGS = re.compile(r"Engine startup timings \(s\): (.*)")
#: the figures of that line reported per start
TIMING_KEYS = ("load_weight", "scheduler_e2e", "tokenizer_e2e")
ARMS = ("on", "off")

#: one fresh interpreter: sglang's scheduler module imported, then sglang's load_plugins() timed
LOAD_PLUGINS = """
import sys, time
import sglang.srt.managers.scheduler
from sglang.srt.plugins import load_plugins
before = len(sys.modules)
started = time.perf_counter()
load_plugins()
ms = (time.perf_counter() - started) * 1000
print(f"modules {len(sys.modules) - before} load_plugins_ms {ms:.1f}")
"""


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def sglang_timings(log_path: str) -> dict[str, float]:
    """The figures of sglang's ``Engine startup timings`` line in a server's log ({} if none)."""
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        found = TIMINGS.findall(handle.read())
    if not found:
        return {}
    pairs = re.findall(r"(\w+)=([0-9.]+)", found[-1])
    return {key: float(value) for key, value in pairs if key in TIMING_KEYS}


def start_once(folder: str, plugin: bool, log_dir: str, index: int) -> dict:
    """One server up and down; its seconds to ready and sglang's own timings."""
    label = f"startup-{index:02d}-{'on' if plugin else 'off'}"
    run = ServerRun(label, folder, speculative=False, plugin=plugin, quantization=MODELSLIM)
    with Server(run, log_dir) as server:
        ready = server.started_seconds
    return {"plugin": plugin, "ready_s": ready, **sglang_timings(server.log_path)}


def load_plugins_ms(plugin: bool) -> tuple[float, int]:
    """sglang's ``load_plugins()`` in a fresh interpreter with a server's environment (the
    CPU shims on the path, ``SGLANG_PLUGINS`` as the arm says): milliseconds, and how many
    modules it imported."""
    env = ServerRun("load_plugins", ROOT, speculative=False, plugin=plugin).environment()
    out = subprocess.run(
        [sys.executable, "-c", LOAD_PLUGINS], env=env, capture_output=True, text=True, check=True
    )
    words = out.stdout.split()
    return float(words[-1]), int(words[-3])


def summary(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--folder", default=os.path.join(ROOT, "test/fixtures/e2e/hybrid_w8a8"))
    parser.add_argument("--pairs", type=int, default=3, help="plugin on/off server pairs")
    parser.add_argument("--plugin-reps", type=int, default=3, help="load_plugins() timings per arm")
    parser.add_argument("--log-dir", default=os.path.join(ROOT, ".cache", "bench", "startup"))
    parser.add_argument("--json", default=None, help="write every start here")
    args = parser.parse_args(argv)
    folder = os.path.abspath(args.folder)
    print(describe(), flush=True)
    print(f"load average before: {load_average()}", flush=True)
    starts = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        for plugin in order:
            start = start_once(folder, plugin, args.log_dir, len(starts))
            starts.append(start)
            sglang = ", ".join(f"{k} {start[k]:.2f}" for k in TIMING_KEYS if k in start)
            print(
                f"pair {pair} plugin {'on ' if plugin else 'off'}: ready in "
                f"{start['ready_s']:.1f} s (sglang's timings, s: {sglang}); load average "
                f"{load_average()}",
                flush=True,
            )
    loads: dict[str, list[float]] = {arm: [] for arm in ARMS}
    modules: dict[str, list[int]] = {arm: [] for arm in ARMS}
    for _ in range(args.plugin_reps):
        for arm in ARMS:
            ms, count = load_plugins_ms(arm == "on")
            loads[arm].append(ms)
            modules[arm].append(count)
    print(
        f"load_plugins() ms, fresh interpreters: on {loads['on']}, off {loads['off']}; modules "
        f"it imported: on {modules['on']}, off {modules['off']}"
    )
    print(f"load average after: {load_average()}")
    by_arm = {arm: [s for s in starts if s["plugin"] == (arm == "on")] for arm in ARMS}

    def figure(key: str) -> str:
        return " ".join(
            f"{arm}={summary([s[key] for s in by_arm[arm] if key in s])}" for arm in ARMS
        )

    for key in ("ready_s", *TIMING_KEYS):
        print(f"{key} min/median: {figure(key)}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": describe(), "starts": starts, "load_plugins_ms": loads}, handle)
    print(
        f"startup {os.path.basename(folder)} pairs {args.pairs} ready_s {figure('ready_s')} "
        f"load_weight_s {figure('load_weight')} load_plugins_ms on={summary(loads['on'])} "
        f"off={summary(loads['off'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
