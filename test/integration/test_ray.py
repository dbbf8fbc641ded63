"""sglang's Ray path: its SchedulerActors get the plugin, or the launch is refused loudly.

Usage (what the tests run, in its own session so nothing can signal pytest)::

    python test/integration/test_ray.py --out result.json

The driver script calls sglang's own ``RayEngine._launch_scheduler_processes`` (what
``--use-ray`` and ``RayEngine`` run after ``Engine._launch_subprocesses``' preparation) twice,
on a local Ray cluster whose node advertises one GPU (``RAY_OVERRIDE_RESOURCES``, because the
real SchedulerActor asks for ``num_gpus=1``; nothing uses a GPU):

1. Ray already initialized without the setup hook: the launch guard must refuse before any
   actor is created;
2. Ray not initialized (as under ``launch_server --use-ray``): the guard initializes Ray with
   ``sglang_mtp_dequant.serving.ray_setup.setup`` as the job's worker setup hook; sglang creates its
   real ``SchedulerActor``, which must report the plugin active in its own process;
3. on that same job (Ray initialized, with the hook, as after a user's own
   ``ray.init(runtime_env=...)``) the guard must let the launch go ahead;
4. Ray initialized with a hook of the user's own that calls ``setup()``: accepted (the guard
   asks one worker per node whether the hook is applied, not the hook's name), and sglang's
   ``SchedulerActor`` reports the plugin active;
5. Ray initialized with a hook of the user's own that does not call it: refused, naming what
   the worker reported, before any actor exists.

Mocked, and why: inside the actor, sglang's ``Scheduler`` (it builds models on a GPU) is the
probe of ``test_processes.py``, installed by a test-only plugin that only ``load_plugins()``
(run by our setup hook) can install: an actor that did not activate plugins would build
sglang's real Scheduler and fail. Everything else is Ray's and sglang's own code.

Beside the driver, at the same time: ``setup()`` in a fresh interpreter whose environment
excludes this plugin (``SGLANG_PLUGINS``), which must raise (Ray then ends that worker and
the actor dies with ``ActorDiedError`` carrying the message; seen with Ray 2.60, not rerun
here to keep this file's time down).
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

if __name__ == "__main__":  # the driver: CPU-only torchvision shim before sglang imports
    from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable

    ensure_torchvision_importable()

import pytest
from test_processes import (
    FIXTURE,
    OUR_HOOK,
    PROBE_KEY,
    probe_env,
    process_report,
    server_args_kwargs,
    write_probe_site,
)

pytestmark = pytest.mark.slow  # spawns processes (see pyproject.toml)

SETUP_HOOK = "sglang_mtp_dequant.serving.ray_setup.setup"
#: a user's own job-level hooks (written to the probe site, on every worker's PYTHONPATH): one
#: does its own set-up and calls ours, as docs/deployment.md tells users; the other forgets it
USER_HOOKS_MODULE = "user_ray_hooks"
USER_HOOK = f"{USER_HOOKS_MODULE}.set_up_worker"
USER_HOOK_BARE = f"{USER_HOOKS_MODULE}.set_up_worker_without_the_plugin"
USER_HOOKS_SOURCE = (
    "import os\n\n\n"
    "def set_up_worker():\n"
    "    os.environ['USER_HOOK_RAN'] = '1'\n"
    "    from sglang_mtp_dequant.serving.ray_setup import setup\n\n"
    "    setup()\n\n\n"
    "def set_up_worker_without_the_plugin():\n"
    "    os.environ['USER_HOOK_RAN'] = '1'\n"
)
DRIVER_TIMEOUT = 600.0  # a hang guard, not a speed limit (shared CI machines)
SUBPROCESS_TIMEOUT = 600.0

# -- the driver (run as a script) -----------------------------------------------------------


def driver_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    result: dict = {}

    import ray
    from sglang.srt.plugins import load_plugins

    from sglang_mtp_dequant.serving.sglang_private import RAY_LAUNCH_TARGET, patched_targets

    load_plugins()  # as python -m sglang.launch_server / Engine.__init__ do
    result["guard_applied"] = RAY_LAUNCH_TARGET in patched_targets()
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.managers.scheduler import run_scheduler_process
    from sglang.srt.ray.engine import RayEngine
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    from sglang_mtp_dequant.serving.ray_setup import PluginNotInRayWorkersError

    server_args = ServerArgs(use_ray=True, **server_args_kwargs(tp=1))
    server_args.resolve_once()
    _set_envs_and_config(server_args)
    publish(server_args, role="tokenizer")
    port_args = PortArgs.init_new(server_args)

    # 1. Ray initialized by someone else, without the hook: refused before any actor exists
    started = time.monotonic()
    ray.init(include_dashboard=False)
    try:
        RayEngine._launch_scheduler_processes(server_args, port_args, run_scheduler_process)
        result["refused"] = None
    except PluginNotInRayWorkersError as exc:
        result["refused"] = str(exc)
    result["actors_after_refusal"] = _count_actors()
    ray.shutdown()
    result["refusal_seconds"] = time.monotonic() - started

    # 2. Ray not initialized: the guard initializes it with the setup hook
    started = time.monotonic()
    init_result, _ = RayEngine._launch_scheduler_processes(
        server_args, port_args, run_scheduler_process
    )
    result["launch_seconds"] = time.monotonic() - started
    result["job_runtime_env"] = dict(ray.get_runtime_context().runtime_env)
    result["schedulers"] = [info[PROBE_KEY] for info in init_result.scheduler_infos]
    result["driver"] = process_report()
    # 3. the same job (Ray initialized, with the hook): what a driver that ran
    #    ray.init(runtime_env={"worker_process_setup_hook": ...}) itself gets: accepted
    from sglang_mtp_dequant.serving.ray_setup import guard_ray_launch

    try:
        guard_ray_launch(RayEngine, server_args, port_args, run_scheduler_process)
        result["initialized_with_hook"] = "accepted"
    except PluginNotInRayWorkersError as exc:
        result["initialized_with_hook"] = str(exc)
    for actor in init_result.scheduler_actors:
        ray.kill(actor)
    ray.shutdown()

    # 4. Ray initialized by the driver with a hook of the user's own that calls setup():
    #    accepted by what the workers report, and sglang's actor has the plugin
    started = time.monotonic()
    ray.init(include_dashboard=False, runtime_env={"worker_process_setup_hook": USER_HOOK})
    try:
        own_result, _ = RayEngine._launch_scheduler_processes(
            server_args, port_args, run_scheduler_process
        )
        result["own_hook_calling_setup"] = "accepted"
        result["own_hook_schedulers"] = [info[PROBE_KEY] for info in own_result.scheduler_infos]
        for actor in own_result.scheduler_actors:
            ray.kill(actor)
    except PluginNotInRayWorkersError as exc:
        result["own_hook_calling_setup"] = str(exc)
    result["own_hook_job_hook"] = ray.get_runtime_context().runtime_env.get(
        "worker_process_setup_hook"
    )
    ray.shutdown()
    result["own_hook_seconds"] = time.monotonic() - started

    # 5. a hook of the user's own that does not call setup(): refused, by the workers' report
    started = time.monotonic()
    ray.init(include_dashboard=False, runtime_env={"worker_process_setup_hook": USER_HOOK_BARE})
    try:
        guard_ray_launch(RayEngine, server_args, port_args, run_scheduler_process)
        result["own_hook_without_setup"] = None
    except PluginNotInRayWorkersError as exc:
        result["own_hook_without_setup"] = str(exc)
    result["actors_after_own_hook_refusal"] = _count_actors()
    ray.shutdown()
    result["own_hook_refusal_seconds"] = time.monotonic() - started
    with open(opts.out, "w") as handle:
        json.dump(result, handle)


def _count_actors() -> int:
    from ray.util.state import list_actors

    try:
        return len(list_actors())
    except Exception:  # the state API needs the dashboard; fall back to the GCS view
        import ray

        return len(ray._private.state.actors())


# -- the tests ------------------------------------------------------------------------------


class Child:
    """A subprocess in its own session (nothing it starts can signal pytest), killed whole
    if it outlives its deadline."""

    def __init__(self, args: list[str], env: dict[str, str], log: str, timeout: float) -> None:
        self.log, self.deadline = log, time.monotonic() + timeout
        with open(log, "w") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, *args],
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait(self) -> tuple[int, str]:
        try:
            self.proc.wait(max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with open(self.log, errors="replace") as handle:
            return self.proc.returncode, handle.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


SETUP_IN_FRESH_INTERPRETER = (
    "from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable\n"
    "ensure_torchvision_importable()\n"
    "import sglang.srt.plugins as p\n"
    "assert not p._plugins_loaded\n"
    "from sglang_mtp_dequant.serving.ray_setup import setup\n"
    "setup()\n"
    "print('SETUP RETURNED')\n"
)


@pytest.fixture(scope="module")
def runs():
    """The Ray driver and a bare ``setup()`` with the plugin excluded, started together."""
    # not pytest's tmp_path: its base folders rotate under concurrent pytest sessions
    with tempfile.TemporaryDirectory(prefix="mtp-ray-") as tmp:
        return _runs(tmp)


def _runs(tmp: str) -> dict:
    site = write_probe_site(os.path.join(tmp, "site"))
    with open(os.path.join(site, f"{USER_HOOKS_MODULE}.py"), "w") as handle:
        handle.write(USER_HOOKS_SOURCE)
    out = os.path.join(tmp, "result.json")
    ray_tmp = os.path.join("/tmp", f"rt{os.getpid()}")  # Ray's socket paths must stay short
    driver_env = probe_env(
        site,
        # one CPU: Ray prestarts a worker per CPU (ray/_private/services.py), each one paying
        # the CPU shim import; the GPU is only advertised (SchedulerActor asks for num_gpus=1)
        RAY_OVERRIDE_RESOURCES=json.dumps({"CPU": 1, "GPU": 1}),
        RAY_TMPDIR=ray_tmp,
        RAY_USAGE_STATS_ENABLED="0",
        # loopback only: with Ray's "cluster" mode off, its node IP is 127.0.0.1 instead of the
        # machine's own address, so every Ray and sglang socket of this test stays on loopback
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    driver_env.pop("RAY_ADDRESS", None)  # a local cluster of its own, never a shared one
    children = {
        "driver": Child(
            [os.path.abspath(__file__), "--out", out],
            driver_env,
            os.path.join(tmp, "driver.log"),
            DRIVER_TIMEOUT,
        ),
        # what a Ray worker whose environment excludes this plugin would run
        "excluded": Child(
            ["-c", SETUP_IN_FRESH_INTERPRETER],
            probe_env(site, SGLANG_PLUGINS="mtp_dequant_probe"),
            os.path.join(tmp, "excluded.log"),
            SUBPROCESS_TIMEOUT,
        ),
    }
    try:
        results = {name: child.wait() for name, child in children.items()}
    finally:
        for child in children.values():
            child.kill()
        subprocess.run(["rm", "-rf", ray_tmp], check=False)
    code, log = results["driver"]
    assert code == 0, f"driver exit {code}:\n{log[-5000:]}"
    with open(out) as handle:
        results["ray"] = json.load(handle)
    seconds = {k: round(v, 1) for k, v in results["ray"].items() if k.endswith("seconds")}
    print("ray driver seconds:", seconds)
    return results


@pytest.fixture
def ray_run(runs):
    return runs["ray"]


def test_guard_is_registered_in_the_driver(ray_run):
    assert ray_run["guard_applied"] is True


def test_ray_initialized_without_the_hook_is_refused_before_any_actor(ray_run):
    message = ray_run["refused"]
    assert message is not None, "the launch went ahead without the setup hook"
    assert "refusing this Ray launch" in message and SETUP_HOOK in message
    assert "WITHOUT dequantization" in message
    assert ray_run["actors_after_refusal"] == 0


def test_guard_initializes_ray_with_the_setup_hook(ray_run):
    from sglang_mtp_dequant.serving.ray_setup import setup_hook_of

    assert setup_hook_of(ray_run["job_runtime_env"]) == SETUP_HOOK


def test_ray_initialized_with_the_hook_is_accepted(ray_run):
    assert ray_run["initialized_with_hook"] == "accepted"


def test_own_hook_calling_setup_is_accepted_and_its_actor_has_the_plugin(ray_run):
    """A job whose own worker_process_setup_hook calls setup(): the guard asks the job's
    workers, not the hook's name, and lets the launch go; sglang's real SchedulerActor then
    reports the plugin's hook applied in its own process."""
    assert ray_run["own_hook_calling_setup"] == "accepted", ray_run["own_hook_calling_setup"]
    assert ray_run["own_hook_job_hook"] == USER_HOOK
    (actor,) = ray_run["own_hook_schedulers"]
    assert actor["plugins_loaded"] is True and actor["inactive_targets"] == [], actor
    assert OUR_HOOK in actor["hooks"], actor


def test_own_hook_without_setup_is_refused_by_what_the_workers_report(ray_run):
    message = ray_run["own_hook_without_setup"]
    assert message is not None, "a job whose workers lack the hook was let through"
    assert "refusing this Ray launch" in message and USER_HOOK_BARE in message, message
    # the worker's own report: every draft class unhooked in its process
    assert "has no dequantization hook on sglang.srt.models.qwen3_5_mtp." in message, message
    assert f"calls {SETUP_HOOK}()" in message, message  # the way out: one's own hook calling it
    assert ray_run["actors_after_own_hook_refusal"] == 0


def test_scheduler_actor_has_the_plugin_in_its_own_process(ray_run):
    (actor,) = ray_run["schedulers"]
    assert actor["pid"] != ray_run["driver"]["pid"]
    assert actor["plugins_loaded"] is True, actor
    assert actor["inactive_targets"] == [], actor
    assert OUR_HOOK in actor["hooks"], actor
    assert actor["tp_rank"] == 0


# -- setup() itself, in a fresh interpreter (what Ray does in each worker), no cluster ------


def test_setup_raises_when_the_worker_would_load_the_draft_unhooked(runs):
    """SGLANG_PLUGINS in a worker's environment excluding us: setup() raises, so Ray fails
    the worker and the actor instead of letting it build the draft unhooked."""
    code, log = runs["excluded"]
    assert code != 0 and "SETUP RETURNED" not in log
    assert "PluginNotInRayWorkersError" in log
    assert "Qwen3_5ForCausalLMMTP.load_weights" in log
    assert "SGLANG_PLUGINS='mtp_dequant_probe'" in log


def test_float_draft_or_no_draft_needs_no_activation():
    """The guard stays out of launches the plugin has nothing to do for."""
    from types import SimpleNamespace

    from sglang_mtp_dequant.serving.ray_setup import draft_may_need_plugin

    float_mtp = os.path.join(os.path.dirname(FIXTURE), "q35_dense_float_mtp")
    assert draft_may_need_plugin(SimpleNamespace(speculative_algorithm=None)) is False
    assert (
        draft_may_need_plugin(
            SimpleNamespace(
                speculative_algorithm="EAGLE",
                speculative_draft_model_path=None,
                model_path=float_mtp,
            )
        )
        is False
    )
    assert (
        draft_may_need_plugin(
            SimpleNamespace(
                speculative_algorithm="EAGLE", speculative_draft_model_path=None, model_path=FIXTURE
            )
        )
        is True
    )
    # a hub id: not resolved here (no sglang context in the driver yet), so the guard acts
    assert (
        draft_may_need_plugin(
            SimpleNamespace(
                speculative_algorithm="EAGLE",
                speculative_draft_model_path="no-such-org/no-such-model",
                model_path=FIXTURE,
            )
        )
        is True
    )


def test_nextn_draft_named_after_the_layer_count_needs_activation(tmp_path):
    """DeepSeek/GLM NextN drafts are ``model.layers.<num_hidden_layers>.*``: the guard reads
    config.json to find them (an int8 one needs the plugin; a float one does not)."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file

    from sglang_mtp_dequant.serving.ray_setup import draft_may_need_plugin

    for dtype, expected in ((torch.int8, True), (torch.bfloat16, False)):
        folder = tmp_path / str(dtype).replace("torch.", "")
        folder.mkdir()
        (folder / "config.json").write_text(
            json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 2})
        )
        save_file(
            {
                "model.layers.1.mlp.down_proj.weight": torch.ones(4, 4, dtype=torch.int8),
                "model.layers.2.mlp.down_proj.weight": torch.ones(4, 4, dtype=dtype),
            },
            str(folder / "model.safetensors"),
        )
        args = SimpleNamespace(
            speculative_algorithm="NEXTN", speculative_draft_model_path=None, model_path=folder
        )
        assert draft_may_need_plugin(args) is expected, dtype


if __name__ == "__main__":
    driver_main(sys.argv[1:])
