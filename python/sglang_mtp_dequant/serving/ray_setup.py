"""The plugin in sglang's Ray scheduler actors: activated there, or the launch is refused.

Usage (nothing to do where the driver leaves Ray uninitialized: the launch guard does it)::

    ray.init(runtime_env={"worker_process_setup_hook": SETUP_HOOK})   # or a hook calling setup()

Why: sglang's Ray ``SchedulerActor`` builds the draft but never calls ``load_plugins()``; the
only public way to run code in every worker of a job is its ``worker_process_setup_hook``.
``guard_ray_launch`` initializes Ray with ``setup``, or asks a worker per node of an initialized
job and refuses the launch when one lacks the hook (docs/deployment.md, "Ray").
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import logging
import os
import pkgutil
import time
from typing import Any

from ..errors import MtpDequantError
from ..formats.checkpoint import Checkpoint, WeightSource
from ..formats.config import CheckpointConfig
from . import context, sglang_private
from .drafts import DRAFT_SPECS

logger = logging.getLogger("sglang_mtp_dequant")

SETUP_HOOK = "sglang_mtp_dequant.serving.ray_setup.setup"
LAUNCH_TARGET = sglang_private.RAY_LAUNCH_TARGET
#: where Ray keeps a job's setup hook once ray.init has processed the runtime env
_RAY_HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
#: set by `ray job submit` for the entrypoint driver: the job's config, runtime env included
_RAY_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"

#: how long the launch check waits for a Ray worker per node to report
PROBE_TIMEOUT_S = 300.0

_guard_registered = False


class PluginNotInRayWorkersError(MtpDequantError, RuntimeError):
    """A Ray launch whose scheduler actors would build the draft without this plugin."""


def setup() -> None:
    """Ray's ``worker_process_setup_hook``: activate plugins as an sglang scheduler does;
    raises (failing the worker, and its actor) when the hook is not in place afterwards."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    missing = inactive_targets()
    if missing:
        raise PluginNotInRayWorkersError(
            subject=f"Ray worker pid {os.getpid()}",
            problem=(
                f"sglang's load_plugins() ran but the dequantization hook is not applied to "
                f"{', '.join(missing)} (SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS')!r}; "
                "see the sglang.srt.plugins log above)"
            ),
            hint=(
                "install sglang-mtp-dequant on every Ray node and do not exclude 'mtp_dequant' "
                "with SGLANG_PLUGINS there"
            ),
        )


def inactive_targets() -> list[str]:
    """Draft classes whose installed ``load_weights`` lacks this plugin's hook here."""
    missing = []
    for spec in DRAFT_SPECS:
        try:
            method = pkgutil.resolve_name(spec.target)
        except Exception:
            continue
        hooks = sglang_private.hooks_around(method)
        if not any(getattr(hook, "__qualname__", None) == spec.hook_name for hook in hooks):
            missing.append(spec.target)
    return missing


def register_launch_guard() -> None:
    """Register ``guard_ray_launch`` when this environment can launch sglang on Ray at all."""
    global _guard_registered
    if _guard_registered or importlib.util.find_spec("ray") is None:
        return
    try:
        if importlib.util.find_spec("sglang.srt.ray") is None:
            return
    except ImportError:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        pkgutil.resolve_name(LAUNCH_TARGET)
    except Exception as exc:  # another sglang: say so, sglang's loader would only log it
        logger.warning(
            "sglang-mtp-dequant: %s is not available in sglang %s (%s: %s); Ray launches are "
            "NOT guarded: start Ray with worker_process_setup_hook=%s yourself",
            LAUNCH_TARGET,
            context.sglang_version(),
            type(exc).__name__,
            exc,
            SETUP_HOOK,
        )
        return
    HookRegistry.register(LAUNCH_TARGET, guard_ray_launch, HookType.BEFORE)
    _guard_registered = True


def guard_ray_launch(cls: type, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``RayEngine._launch_scheduler_processes``, no actor yet: ``ray.init()`` as
    sglang's first Ray call would, plus the setup hook; a job initialized otherwise is judged by
    what a worker per node reports (``workers_without_plugin``)."""
    server_args = kwargs.get("server_args", args[0] if args else None)
    if not draft_may_need_plugin(server_args):
        return
    import ray

    if not ray.is_initialized():
        job_hook = setup_hook_of(_submitted_job_runtime_env())
        if job_hook is None:
            ray.init(runtime_env={"worker_process_setup_hook": SETUP_HOOK})
            logger.info(
                "sglang-mtp-dequant: initialized Ray with worker_process_setup_hook=%s, so "
                "sglang's SchedulerActors load the plugin",
                SETUP_HOOK,
            )
            return
        ray.init()  # the submitted job's runtime env carries its hook (Ray refuses it twice)
        why = f"the submitted Ray job's worker_process_setup_hook is {job_hook!r}"
    else:
        job_hook = setup_hook_of(ray.get_runtime_context().runtime_env)
        why = "Ray was initialized before the launch " + (
            "without a worker_process_setup_hook" if job_hook is None else f"with hook {job_hook!r}"
        )
    problems = workers_without_plugin(ray)
    if problems:
        raise _refusal(why, problems)
    logger.info(
        "sglang-mtp-dequant: a Ray worker of this job on each node reports the plugin's hook on "
        "every draft class (worker_process_setup_hook %r): sglang's SchedulerActors load it",
        job_hook,
    )


def worker_report() -> dict[str, Any]:
    """What one Ray worker of the job reports, run in it as a task (after its setup hook)."""
    return {"pid": os.getpid(), "inactive": inactive_targets()}


def workers_without_plugin(ray: Any) -> list[str]:
    """One line per alive Ray node whose worker of this job reports a draft class unhooked, or
    no report (a raising setup hook ends its worker; a hang: ``PROBE_TIMEOUT_S``)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(worker_report)
    refs = {
        node["NodeID"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        for node in ray.nodes()
        if node.get("Alive")
    }
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    problems = []
    for node, ref in refs.items():
        try:
            report = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - Ray's own error, reported as is
            with contextlib.suppress(Exception):  # a task that failed has nothing to cancel
                ray.cancel(ref, force=True)
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            problems.append(
                f"node {node}: its Ray worker of this job gave no report ({type(exc).__name__}: "
                f"{reason[:300]}; a worker_process_setup_hook that raises ends the worker: "
                "its error is in the worker's log)"
            )
            continue
        if report["inactive"]:
            problems.append(
                f"node {node}: Ray worker pid {report['pid']} has no dequantization hook on "
                f"{', '.join(report['inactive'])}"
            )
    return problems


def setup_hook_of(runtime_env: Any) -> str | None:
    """The job-level setup hook a runtime env carries, in either form Ray keeps it."""
    if not runtime_env:
        return None
    env_vars = runtime_env.get("env_vars") or {}
    hook = env_vars.get(_RAY_HOOK_ENV_VAR) or runtime_env.get("worker_process_setup_hook")
    return hook if isinstance(hook, str) else None


def _submitted_job_runtime_env() -> dict | None:
    raw = os.environ.get(_RAY_JOB_CONFIG_ENV_VAR)
    if not raw:
        return None
    try:
        return json.loads(raw).get("runtime_env")
    except (ValueError, AttributeError):
        return None


def draft_may_need_plugin(server_args: Any) -> bool:
    """False only for no draft, or a local folder whose draft tensors hold no codes: refusing a
    launch that would have worked is loud, the opposite silent."""
    if not getattr(server_args, "speculative_algorithm", None):
        return False
    path = getattr(server_args, "speculative_draft_model_path", None) or getattr(
        server_args, "model_path", None
    )
    if not path or not os.path.isdir(path):
        return True
    try:
        files = tuple(sorted(glob.glob(os.path.join(path, "*.safetensors"))))
        source = WeightSource(str(path), str(path), files, "every *.safetensors of the folder")
        config = CheckpointConfig.read(str(path))  # NextN drafts: num_hidden_layers
        rules = [spec.draft_names(config) for spec in DRAFT_SPECS]
        ckpt = Checkpoint.open(source, wanted=lambda name: any(rule(name) for rule in rules))
    except Exception:  # noqa: BLE001 - anything unknown: assume the plugin is needed
        return True
    return any(info.holds_codes for info in ckpt.tensors.values())


def _refusal(why: str, problems: list[str]) -> PluginNotInRayWorkersError:
    return PluginNotInRayWorkersError(
        subject="refusing this Ray launch",
        problem=(
            f"{why} and this job's Ray workers report the plugin's hook missing, so sglang's "
            "SchedulerActors (which build the draft and never call load_plugins()) would load "
            "the quantized draft WITHOUT dequantization"
        ),
        hint=(
            "give the job the setup hook, e.g. "
            f'ray.init(runtime_env={{"worker_process_setup_hook": "{SETUP_HOOK}"}}) before '
            "creating the engine, or `ray job submit --runtime-env-json "
            f'\'{{"worker_process_setup_hook": "{SETUP_HOOK}"}}\' -- ...`; a hook of your own '
            f"is accepted when it calls {SETUP_HOOK}() (the check is what the workers report, "
            "not the hook's name). Or leave Ray uninitialized and the plugin does it"
        ),
        details=problems,
    )
