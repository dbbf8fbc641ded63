"""One rank of a tensor/expert-parallel draft load in its own process: the tests' and the
benchmarks' one rank worker.

Usage::

    # a test (test_tensor_parallel.py): two spawned children of one run
    layouts = (Layout("dense_tp2", folder, ep_size=1, port=p1), Layout("moe_ep2", moe, 2, p2))
    ctx = multiprocessing.get_context("spawn")
    ctx.Process(target=run_rank, args=(RankJob(rank, 2, layouts, out),)).start()

    # a benchmark (bench_dequant.py): one command per rank
    PYTHONPATH=test python -m support.rank_worker --folder F --rank 0 --world 2 --ep 2 \
        --port P --out DIR

Each writes, per layout, into its ``out_dir``:

- ``rank<r>.process.json``: did plugins load before, is the hook registered and applied;
- ``<tag>.rank<r>.json``: the ranks sglang computed, the plugin's log lines, the wall time of
  the hooked ``load_weights``, the load's record (``load.last_draft_load().stats``), a
  digest of every expert this rank's FusedMoE holds (by global expert id, from the layer's
  own mapping) and, with ``stock``, each parameter's absmax loaded without the hook;
- ``<tag>.rank<r>.safetensors``: this rank's draft parameters (``save_params``);
- ``rank<r>.error``: only on failure, the traceback.

Each process is what one of sglang's scheduler processes is for the draft: a fresh interpreter
(spawn, the start method sglang forces) that activates plugins with sglang's own
``load_plugins()``, publishes its ServerArgs with its world rank, joins sglang's own gloo
process groups, builds the real draft class from sglang's draft ``ModelConfig`` and loads the
whole checkpoint through sglang's own ``DefaultModelLoader`` stream; sglang's weight loaders
keep this rank's shard. No forward pass, no GPU.

It never returns into multiprocessing's teardown: it ends with ``os._exit`` (a gloo group's
destructor can wait for a peer that already left), and a watchdog ends it if the rendezvous
or the load ever stalls, so the parent's wait always ends.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass

HOOK_TARGET = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"


@dataclass(frozen=True)
class Layout:
    """One load: a checkpoint, the parallel layout to load it under, its rendezvous port.

    Each load publishes its own ServerArgs (the plugin finds the checkpoint folder in the
    published context, as in a real scheduler) and joins fresh process groups.
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
    #: also load without the hook, for each parameter's stock absmax
    stock: bool = True
    #: write this rank's loaded parameters
    save_params: bool = True


class _Records(logging.Handler):
    """Keeps the plugin's own log lines, the per-load evidence that the hook ran."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_rank(job: RankJob) -> None:
    """Entry point of the process; always ends it with ``os._exit``."""
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


def report_path(out_dir: str, tag: str, rank: int) -> str:
    return os.path.join(out_dir, f"{tag}.rank{rank}.json")


def _run_layouts(job: RankJob) -> None:
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()  # CPU-only environment shim (tools/cpu_env.py)

    # exactly what run_scheduler_process does first in every scheduler sglang spawns
    import sglang.srt.plugins as sglang_plugins

    loaded_before = sglang_plugins._plugins_loaded
    sglang_plugins.load_plugins()
    process = {"pid": os.getpid(), "plugins_loaded_before": loaded_before, "hook": _hook_evidence()}
    with open(os.path.join(job.out_dir, f"rank{job.rank}.process.json"), "w") as handle:
        json.dump(process, handle)
    from sglang.srt.distributed import parallel_state

    from support.cpu_sglang import join_parallel_world

    for layout in job.layouts:
        join_parallel_world(
            layout.folder,
            world_size=job.world_size,
            rank=job.rank,
            port=layout.port,
            ep_size=layout.ep_size,
        )
        try:
            report = _load(job, layout)
        finally:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
        with open(report_path(job.out_dir, layout.tag, job.rank), "w") as handle:
            json.dump(report, handle)


def _load(job: RankJob, layout: Layout) -> dict:
    """Build the real draft, load it through the hook (and stock), report what this rank holds."""
    import torch
    from safetensors.torch import save_file
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel

    from sglang_mtp_dequant.serving.load import last_draft_load
    from sglang_mtp_dequant.serving.plugin import bypassed
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
        config = draft_model_config(layout.folder)
        assert config.dtype == torch.bfloat16
        draft = build_draft(config)
        started = time.perf_counter()
        draft.load_weights(sglang_weights(config, draft))  # through the hook
        load_seconds = time.perf_counter() - started
        load = last_draft_load()
        assert load is not None, "the hook recorded no draft load"
        stock_absmax = None
        if job.stock:
            stock = build_draft(config)
            with bypassed():  # sglang alone
                stock.load_weights(sglang_weights(config, stock))
            stock_absmax = {
                n: float(p.detach().float().abs().max()) for n, p in stock.named_parameters()
            }
    finally:
        plugin_logger.removeHandler(records)
    if job.save_params:
        params = {n: p.detach().contiguous() for n, p in draft.named_parameters()}
        save_file(params, os.path.join(job.out_dir, f"{layout.tag}.rank{job.rank}.safetensors"))
    stats = load.stats
    return {
        "rank": job.rank,
        "world": job.world_size,
        "ranks": ranks,
        "plugin_log": records.lines,
        "load_weights_s": load_seconds,
        "torch_threads": torch.get_num_threads(),
        "stats": {
            "dequantized": stats.dequantized,
            "decoded_codes": stats.decoded_codes,
            "left_to_other_ranks": stats.left_to_other_ranks,
            "quantized_bytes": stats.quantized_bytes,
            "decode_s": stats.seconds,
        },
        "digests": _expert_digests(draft),
        "stock_absmax": stock_absmax,
    }


def _expert_digests(model) -> dict[str, dict[int, str]]:
    """parameter -> {global expert id: digest of its bits} for every expert this rank keeps."""
    import torch

    from sglang_mtp_dequant.serving.sglang_private import expert_map

    digests: dict[str, dict[int, str]] = {}
    for name, module in model.named_modules():
        mapping = expert_map(module)
        if mapping is None or not hasattr(module, "w13_weight"):
            continue
        for param_name in ("w13_weight", "w2_weight"):
            param = getattr(module, param_name).detach()
            kept = {}
            for expert in range(module.num_experts):
                local = mapping(expert)
                if local == -1:
                    continue
                raw = param[local].contiguous().view(torch.uint8).numpy().tobytes()
                kept[expert] = hashlib.blake2b(raw, digest_size=16).hexdigest()
            digests[f"{name}.{param_name}"] = kept
    return digests


def _hook_evidence() -> dict:
    """Whether this process's ``load_plugins()`` put this package's hook on the draft class."""
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.context import registered_targets
    from sglang_mtp_dequant.serving.sglang_private import patched_targets, unwrapped

    hooks = [h for _, h, _ in HookRegistry._hooks.get(HOOK_TARGET, [])]
    method = Qwen3_5ForCausalLMMTP.load_weights
    return {
        "registered": HOOK_TARGET in registered_targets(),
        "applied": HOOK_TARGET in patched_targets(),
        "wrapped": unwrapped(method) is not method,
        "hooks": [getattr(h, "__qualname__", repr(h)) for h in hooks],
    }


def main() -> None:
    """One rank, one layout, from the command line (the benchmarks' way to start ranks)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--ep", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True, help="folder for the reports")
    parser.add_argument("--tag", default="load")
    parser.add_argument("--watchdog", type=float, default=540.0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    layout = Layout(args.tag, args.folder, args.ep, args.port)
    run_rank(
        RankJob(
            args.rank,
            args.world,
            (layout,),
            args.out,
            args.watchdog,
            stock=False,
            save_params=False,
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")  # sglang's per-shard progress bar
    main()
