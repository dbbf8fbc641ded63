"""The plugin is active in the scheduler processes sglang's own launcher spawns (TP, multi-node).

Usage (what the tests run, each in its own session, so nothing can signal pytest)::

    python test/integration/test_processes.py --tp 2 --nnodes 1 --node-rank 0 --out infos.json
    python test/integration/test_processes.py --tp 2 --nnodes 2 --node-rank 1 --out infos.json

The launcher does what ``Engine._launch_subprocesses`` does up to the schedulers (load_plugins,
``_set_envs_and_config`` which forces ``spawn``, publish, PortArgs) and then calls sglang's own
``Engine._launch_scheduler_processes``: it computes this node's ranks
(``_calculate_rank_ranges(node_rank)``), spawns ``run_scheduler_process`` for each, and waits
for each scheduler's init info through sglang's own pipe.

Mocked, and why: sglang's ``Scheduler`` class, which builds the target and draft models on an
accelerator. A test-only plugin (entry point ``mtp_dequant_probe``, found on PYTHONPATH)
replaces it with ``ProbeScheduler`` through sglang's HookRegistry, so it exists in a scheduler
process only if that process ran ``load_plugins()``; it reports whether this package's hook is
on the draft class there. Everything before it is sglang's real start-up code.

Not run here, documented in docs/deployment.md from sglang's code: the DP controller path
(``run_data_parallel_controller_process`` calls ``load_plugins()`` before spawning its
schedulers, which call it again), and a real second machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

if __name__ == "__main__":  # the launcher: CPU-only torchvision shim before sglang imports
    from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable

    ensure_torchvision_importable()

import pytest

from sglang_mtp_dequant.tools.cpu_sglang import free_port
from support.paths import TEST, fixture_dir

pytestmark = pytest.mark.slow  # spawns processes (see pyproject.toml)

FIXTURE = fixture_dir("q35_dense_w8a8_dynamic")
HOOK_TARGET = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
OUR_HOOK = "sglang_mtp_dequant[Qwen3_5ForCausalLMMTP]"
PROBE_KEY = "mtp_dequant_probe"
#: a launcher (one sglang import) plus its schedulers (one each) must finish within this
LAUNCH_TIMEOUT = 600.0

# -- the probe: what a scheduler process reports instead of building models ---------------


def process_report() -> dict:
    """This process's plugin state, as seen by sglang and by this package."""
    import sglang.srt.plugins as sglang_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.ray_setup import inactive_targets

    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "plugins_loaded": sglang_plugins._plugins_loaded,
        "inactive_targets": inactive_targets(),
        "hooks": [getattr(h, "__qualname__", "?") for _, h, _ in HookRegistry._hooks[HOOK_TARGET]],
    }
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        report.update(tp_rank=parallel.tp_rank, node_rank=parallel.node_rank)
    except Exception as exc:  # no context published: report it, the test decides
        report["context_error"] = repr(exc)
    return report


class _NoMetrics:
    def _shutdown_fpm(self) -> None:
        return None


class ProbeScheduler:
    """Stands in for ``sglang.srt.managers.scheduler.Scheduler`` (built with its arguments)."""

    def __init__(self, server_args, port_args, *args, **kwargs) -> None:
        self.report = process_report()
        # read by run_scheduler_process's ``finally`` after the event loop returns
        self.gracefully_exit = False
        self.async_d2h_worker = None
        self.metrics_reporter = _NoMetrics()

    def get_init_info(self) -> dict:
        return {"status": "ready", PROBE_KEY: self.report}

    def run_event_loop(self) -> None:
        return None


def register_probe() -> None:
    """Entry point of the test-only plugin: swap sglang's Scheduler for the probe."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler", ProbeScheduler, HookType.REPLACE
    )


def write_probe_site(folder: str) -> str:
    """A PYTHONPATH folder: the probe plugin's entry point, and a test-only sitecustomize
    that applies the CPU torchvision shim in the children sglang and Ray start (spawned
    schedulers, Ray workers) before they import sglang."""
    dist = os.path.join(folder, "mtp_dequant_probe-0.0.dist-info")
    os.makedirs(dist, exist_ok=True)
    with open(os.path.join(dist, "METADATA"), "w") as handle:
        handle.write("Metadata-Version: 2.1\nName: mtp-dequant-probe\nVersion: 0.0\n")
    with open(os.path.join(dist, "entry_points.txt"), "w") as handle:
        handle.write(f"[sglang.srt.plugins]\n{PROBE_KEY} = test_processes:register_probe\n")
    with open(os.path.join(folder, "sitecustomize.py"), "w") as handle:
        handle.write(
            "# test-only (written by test_processes.py): CPU torchvision shim for the\n"
            "# processes sglang and Ray start; other interpreters are left alone\n"
            "import sys\n"
            "if '--multiprocessing-fork' in sys.argv or any(\n"
            "    a.endswith('default_worker.py') for a in sys.argv\n"
            "):\n"
            "    from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable\n"
            "    ensure_torchvision_importable()\n"
        )
    return folder


def probe_env(site: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([site, TEST, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def server_args_kwargs(tp: int, nnodes: int = 1, node_rank: int = 0) -> dict:
    """An MTP (EAGLE) deployment of the quantized fixture, as ServerArgs keywords."""
    return dict(
        model_path=FIXTURE,
        device="cpu",
        tp_size=tp,
        nnodes=nnodes,
        node_rank=node_rank,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )


# -- the launcher (run as a script) ---------------------------------------------------------


def launcher_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", default=None)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)

    import multiprocessing

    from sglang.srt.plugins import load_plugins

    load_plugins()  # python -m sglang.launch_server does this first (launch_server.py)
    from sglang.srt.entrypoints.engine import Engine, _set_envs_and_config
    from sglang.srt.managers.scheduler import run_scheduler_process
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(
        dist_init_addr=opts.dist_init_addr,
        **server_args_kwargs(opts.tp, opts.nnodes, opts.node_rank),
    )
    # Engine._launch_subprocesses, in order, up to the schedulers
    server_args.resolve_once()
    _set_envs_and_config(server_args)  # forces the spawn start method
    publish(server_args, role="tokenizer")
    port_args = PortArgs.init_new(server_args)
    result, procs = Engine._launch_scheduler_processes(
        server_args, port_args, run_scheduler_process
    )
    result.wait_for_ready()
    for proc in procs:
        proc.join(60)
    launcher = process_report()
    launcher.pop("tp_rank", None)
    with open(opts.out, "w") as handle:
        json.dump(
            {
                "launcher": launcher,
                "start_method": multiprocessing.get_start_method(),
                "schedulers": [info[PROBE_KEY] for info in result.scheduler_infos],
                "exit_codes": [proc.exitcode for proc in procs],
            },
            handle,
        )


# -- the tests ------------------------------------------------------------------------------


@dataclass
class Launch:
    """One launcher subprocess (a node's `launch_server`), in its own session."""

    proc: subprocess.Popen
    out: str
    log: str
    started: float

    def result(self) -> dict:
        try:
            self.proc.wait(max(1.0, self.started + LAUNCH_TIMEOUT - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher and its schedulers
            self.proc.wait()
            pytest.fail(f"launcher still running after {LAUNCH_TIMEOUT:.0f} s: {self._tail()}")
        assert self.proc.returncode == 0, self._tail()
        with open(self.out) as handle:
            return json.load(handle)

    def _tail(self) -> str:
        with open(self.log, errors="replace") as handle:
            return handle.read()[-4000:]


def start_launch(tmp, site: str, name: str, *args: str) -> Launch:
    out, log = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.log")
    with open(log, "w") as log_handle:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args, "--out", out],
            env=probe_env(site),
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a scheduler's SIGQUIT reaches the launcher, never pytest
        )
    return Launch(proc, out, log, time.monotonic())


@pytest.fixture(scope="module")
def launches():
    """Both launches run at once (independent processes, as on two machines)."""
    with tempfile.TemporaryDirectory(prefix="mtp-launch-") as tmp:
        yield from _launches(tmp)


def _launches(tmp: str):
    site = write_probe_site(os.path.join(tmp, "site"))
    port = free_port()
    runs = {
        "single_node_tp2": start_launch(tmp, site, "single", "--tp", "2"),
        "node1_of_2_tp2": start_launch(
            tmp,
            site,
            "node1",
            "--tp",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--dist-init-addr",
            f"127.0.0.1:{port}",
        ),
    }
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()


def assert_scheduler_has_plugin(report: dict, launcher_pid: int) -> None:
    assert report["pid"] != launcher_pid and report["ppid"] == launcher_pid, report
    assert report["plugins_loaded"] is True, report
    assert report["inactive_targets"] == [], report
    assert OUR_HOOK in report["hooks"], report


def test_single_node_tp2_every_scheduler_has_the_plugin(launches):
    got = launches["single_node_tp2"].result()
    assert got["start_method"] == "spawn"  # fresh interpreters: nothing inherited
    assert got["exit_codes"] == [0, 0]
    assert sorted(s["tp_rank"] for s in got["schedulers"]) == [0, 1]
    for report in got["schedulers"]:
        assert_scheduler_has_plugin(report, got["launcher"]["pid"])


def test_second_node_spawns_only_its_ranks_each_with_the_plugin(launches):
    """--nnodes 2 --node-rank 1: that node's launcher starts TP rank 1 only, plugin active."""
    got = launches["node1_of_2_tp2"].result()
    assert got["start_method"] == "spawn"
    assert got["exit_codes"] == [0]
    (report,) = got["schedulers"]
    assert (report["tp_rank"], report["node_rank"]) == (1, 1)
    assert_scheduler_has_plugin(report, got["launcher"]["pid"])


def test_launcher_itself_has_the_plugin(launches):
    """The process that will create Ray actors (RayEngine) is a launcher: guarded there."""
    for run in launches.values():
        launcher = run.result()["launcher"]
        assert launcher["plugins_loaded"] and launcher["inactive_targets"] == [], launcher


if __name__ == "__main__":
    launcher_main(sys.argv[1:])
