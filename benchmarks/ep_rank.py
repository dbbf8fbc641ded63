"""One rank of a draft load under expert parallelism, in its own process (for ``bench_dequant.py``).

Usage (the parent starts one process per rank, all with the same port)::

    python benchmarks/ep_rank.py --folder CKPT --rank 0 --world 2 --ep 2 --port 29513 --out r0.json
    python benchmarks/ep_rank.py --folder CKPT --rank 1 --world 2 --ep 2 --port 29513 --out r1.json
    python benchmarks/ep_rank.py --folder CKPT --rank 0 --world 1 --ep 1 --port 29514 --out ws1.json

Each process is what one of sglang's scheduler processes is for the draft (the same steps as
``test/tp_worker.py``): sglang's ``load_plugins()`` hooks the draft class, the rank publishes its
ServerArgs (``tp_size=world``, ``ep_size=ep``) and joins sglang's own gloo process groups
(``init_distributed_environment`` / ``initialize_model_parallel``), builds sglang's real
``Qwen3_5ForCausalLMMTP`` from the checkpoint's config and loads it through sglang's
``DefaultModelLoader`` stream and the plugin's hook. Nothing is mocked or instrumented: the
hook's record of the load (``context.last_draft_load()``) holds the stream's ``stats`` (codes
decoded, expert tensors passed on undecoded), which are written out.

The JSON written to ``--out``: the ranks sglang computed, the load's wall time, the stream's
statistics, and a digest of every expert this rank's FusedMoE holds (by global expert id, from
the layer's own mapping), so the parent can check each rank's experts against the
world-size-1 load bit for bit.

The process ends with ``os._exit`` (a gloo group's destructor can wait for a peer that
already left) and a watchdog ends it if the rendezvous or the load stalls.
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
import warnings


def run(args: argparse.Namespace) -> dict:
    import torch

    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        ensure_torchvision_importable,
        join_parallel_world,
    )

    ensure_torchvision_importable()  # CPU-only environment shim (see cpu_sglang.py)
    import sglang.srt.plugins as sglang_plugins

    sglang_plugins.load_plugins()  # what run_scheduler_process does first

    from sglang.srt.runtime_context import get_parallel

    from sglang_mtp_dequant.serving import context

    join_parallel_world(
        args.folder, world_size=args.world, rank=args.rank, port=args.port, ep_size=args.ep
    )
    par = get_parallel()

    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights

    config = draft_model_config(args.folder)
    model = build_draft(config)
    started = time.perf_counter()
    type(model).load_weights(model, sglang_weights(config, model))
    load_s = time.perf_counter() - started
    load = context.last_draft_load()
    assert load is not None, "the hook recorded no draft load"
    stats = load.stats

    digests: dict[str, dict[int, str]] = {}
    for name, module in model.named_modules():
        mapping = getattr(module, "_map_global_expert_id_to_local_expert_id", None)
        if not callable(mapping) or not hasattr(module, "w13_weight"):
            continue
        for param_name in ("w13_weight", "w2_weight"):
            param = getattr(module, param_name).detach()
            kept = {}
            for expert in range(module.num_experts):
                local = mapping(expert)
                if local == -1:
                    continue
                raw = param[local].contiguous().view(torch.int16).numpy().tobytes()
                kept[expert] = hashlib.blake2b(raw, digest_size=16).hexdigest()
            digests[f"{name}.{param_name}"] = kept
    return {
        "rank": args.rank,
        "world": args.world,
        "ranks": {"moe_ep_rank": par.moe_ep_rank, "moe_ep_size": par.moe_ep_size},
        "load_weights_s": load_s,
        "torch_threads": torch.get_num_threads(),
        "stats": {
            "dequantized": stats.dequantized,
            "decoded_codes": stats.decoded_codes,
            "left_to_other_ranks": stats.left_to_other_ranks,
            "quantized_bytes": stats.quantized_bytes,
            "decode_s": stats.seconds,
        },
        "digests": digests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--ep", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--watchdog", type=float, default=540.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    code = 0
    try:
        result = run(args)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle)
    except BaseException:  # report, then exit nonzero: the parent reads stderr
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")  # sglang's per-shard progress bar
    main()
