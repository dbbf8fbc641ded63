"""One rank of a tensor-parallel draft load, as a spawned child (used by test_tensor_parallel.py).

Usage (the test does this for rank 0 and rank 1 of one run)::

    layouts = (Layout("dense_tp2", folder, ep_size=1, port=p1), Layout("moe_tp2_ep2", moe, 2, p2))
    ctx = multiprocessing.get_context("spawn")
    ctx.Process(target=tp_worker.run_rank, args=(RankJob(rank, 2, layouts, out),)).start()
    # -> out/rank<r>.process.json        (plugins loaded before? hook registered/applied)
    #    out/<tag>.rank<r>.safetensors   (this rank's draft parameters, loaded through the hook)
    #    out/<tag>.rank<r>.json          (ranks sglang computed, the plugin's log lines,
    #                                     absmax per parameter of the same load without the hook)
    #    out/rank<r>.error               (only on failure: the traceback)

Each child is what one of sglang's scheduler processes is for the draft: a fresh interpreter
(spawn, the start method sglang forces) that activates plugins with sglang's own
``load_plugins()``, publishes its ServerArgs with its world rank, joins sglang's own gloo
process groups (``init_distributed_environment`` / ``initialize_model_parallel``), builds the
real ``Qwen3_5ForCausalLMMTP`` from sglang's draft ``ModelConfig`` and loads the whole checkpoint
through sglang's own ``DefaultModelLoader`` stream; sglang's weight loaders keep this rank's
shard. What a child cannot do
here it does not pretend to: no forward pass, no GPU.

The child never returns into multiprocessing's teardown: it ends with ``os._exit`` (a gloo
group's destructor can wait for a peer that already left), and a watchdog kills it if the
rendezvous or the load ever stalls, so the parent's join always ends.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
from dataclasses import dataclass

HOOK_TARGET = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"


@dataclass(frozen=True)
class Layout:
    """One load: a checkpoint, the parallel layout to load it under, its rendezvous port.

    Each load publishes its own ServerArgs (the plugin finds the checkpoint folder in the
    published context, as in a real scheduler) and joins fresh process groups; results are
    written as ``<tag>.rank<r>.safetensors`` / ``.json``.
    """

    tag: str
    folder: str
    ep_size: int
    port: int


@dataclass(frozen=True)
class RankJob:
    """Everything one rank needs; plain values only (pickled into a spawned child)."""

    rank: int
    world_size: int
    layouts: tuple[Layout, ...]
    out_dir: str
    watchdog_seconds: float = 570.0


class _Records(logging.Handler):
    """Keeps the plugin's own log lines, the per-load evidence that the hook ran."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_rank(job: RankJob) -> None:
    """Entry point of the spawned child; always ends the process with ``os._exit``."""
    faulthandler.dump_traceback_later(job.watchdog_seconds, exit=True)
    code = 0
    try:
        _run_layouts(job)
    except BaseException as exc:  # report, then exit nonzero: the parent reads the file
        code = 1
        import traceback

        with open(os.path.join(job.out_dir, f"rank{job.rank}.error"), "w") as handle:
            handle.write("".join(traceback.format_exception(exc)))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_layouts(job: RankJob) -> None:
    from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable

    ensure_torchvision_importable()  # CPU-only environment shim (see cpu_sglang.py)

    # exactly what run_scheduler_process does first in every scheduler sglang spawns
    import sglang.srt.plugins as sglang_plugins

    loaded_before = sglang_plugins._plugins_loaded
    sglang_plugins.load_plugins()
    process = {"pid": os.getpid(), "plugins_loaded_before": loaded_before, "hook": _hook_evidence()}
    with open(os.path.join(job.out_dir, f"rank{job.rank}.process.json"), "w") as handle:
        json.dump(process, handle)
    for layout in job.layouts:
        _join_layout(job, layout)
        try:
            _load_and_save(job, layout.tag, layout.folder)
        finally:
            from sglang.srt.distributed import parallel_state

            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()


def _join_layout(job: RankJob, layout: Layout) -> None:
    """Publish this rank's ServerArgs and join sglang's gloo groups for ``layout``."""
    from sglang_mtp_dequant.tools.cpu_sglang import join_parallel_world

    join_parallel_world(
        layout.folder,
        world_size=job.world_size,
        rank=job.rank,
        port=layout.port,
        ep_size=layout.ep_size,
    )


def _load_and_save(job: RankJob, tag: str, folder: str) -> None:
    """Build the real draft, load it with the plugin and stock, write this rank's shards."""
    import torch
    from safetensors.torch import save_file
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel

    from sglang_mtp_dequant.tools.cpu_sglang import build_draft, draft_model_config, sglang_weights

    par = get_parallel()
    ranks = {
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "tp_size": parallel_state.get_tensor_model_parallel_world_size(),
        "published_tp_rank": par.tp_rank,
        "moe_ep_rank": par.moe_ep_rank,
        "moe_ep_size": par.moe_ep_size,
        "moe_tp_rank": par.moe_tp_rank,
        "moe_tp_size": par.moe_tp_size,
    }
    records = _Records()
    plugin_logger = logging.getLogger("sglang_mtp_dequant")
    plugin_logger.addHandler(records)
    plugin_logger.setLevel(logging.INFO)
    try:
        config = draft_model_config(folder)
        assert config.dtype == torch.bfloat16
        draft = build_draft(config)
        type(draft).load_weights(draft, sglang_weights(config, draft))  # through the hook
        stock = build_draft(config)
        type(stock).load_weights.__wrapped__(stock, sglang_weights(config, stock))  # sglang alone
    finally:
        plugin_logger.removeHandler(records)
    params = {n: p.detach().contiguous() for n, p in draft.named_parameters()}
    save_file(params, os.path.join(job.out_dir, f"{tag}.rank{job.rank}.safetensors"))
    report = {
        "ranks": ranks,
        "plugin_log": records.lines,
        "stock_absmax": {
            n: float(p.detach().float().abs().max()) for n, p in stock.named_parameters()
        },
    }
    with open(os.path.join(job.out_dir, f"{tag}.rank{job.rank}.json"), "w") as handle:
        json.dump(report, handle)


def _hook_evidence() -> dict:
    """Whether this process's ``load_plugins()`` put this package's hook on the draft class."""
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.context import registered_targets

    hooks = [h for _, h, _ in HookRegistry._hooks.get(HOOK_TARGET, [])]
    return {
        "registered": HOOK_TARGET in registered_targets(),
        "applied": HOOK_TARGET in HookRegistry._patched,
        "wrapped": hasattr(Qwen3_5ForCausalLMMTP.load_weights, "__wrapped__"),
        "hooks": [getattr(h, "__qualname__", repr(h)) for h in hooks],
    }
