"""sglang's EAGLE worker sharing the target's embedding and head with a draft, on the CPU.

Usage::

    share_as_sglang(draft, target)          # sglang's own EagleDraftWorker.init_lm_head
    target = TargetSide(embed, head)        # a target's side of it, for drafts without one

What the scheduler runs right after sizing the KV pool (``alloc_memory_pool`` ->
``init_lm_head`` -> the draft's ``set_embed_and_head`` / ``set_lm_head_from_target``), run here
on a worker object that holds only what that method reads (an EAGLE launch, no hot-token map).
Most classes' ``set_embed_and_head`` end in ``torch.cuda.synchronize()``, which CPU torch cannot
run: it is a no-op while the method runs here (``torch.cuda.empty_cache()`` is one already).
Used by ``test_draft_vocab.py`` and ``benchmarks/vocab_mechanism.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch


class TargetSide(torch.nn.Module):
    """What sglang's EAGLE worker reads of a target to share it: ``get_embed_and_head()`` and
    ``lm_head`` (for draft classes whose target is not built where this is used)."""

    def __init__(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(embed, requires_grad=False)
        self.lm_head = torch.nn.Module()
        self.lm_head.weight = torch.nn.Parameter(head, requires_grad=False)

    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embed, self.lm_head.weight


def share_as_sglang(draft: torch.nn.Module, target: torch.nn.Module, model_path: str) -> None:
    """sglang's own ``EagleDraftWorker.init_lm_head`` binding ``target``'s embedding and head
    into ``draft`` (``model_path``: where a pipeline-parallel stage would read the embedding)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    worker = object.__new__(EagleDraftWorker)
    config = SimpleNamespace(model_path=model_path, revision=None)
    runner = SimpleNamespace(model=target, model_config=config, load_config=LoadConfig())
    worker.target_worker = SimpleNamespace(model_runner=runner)
    worker.draft_runner = SimpleNamespace(model=draft)
    worker.hot_token_id = None
    worker.speculative_algorithm = SpeculativeAlgorithm.EAGLE
    with mock.patch.object(torch.cuda, "synchronize", lambda *args, **kwargs: None):
        worker.init_lm_head()


def pp_last_stage(rank: int, port: int, folder: str, out: str) -> None:
    """``_pp_stage``, its traceback written to ``out`` if it fails."""
    import traceback

    try:
        _pp_stage(rank, port, folder, out)
    except BaseException:
        with open(out, "w") as handle:
            handle.write(traceback.format_exc())
        raise


def _pp_stage(rank: int, port: int, folder: str, out: str) -> None:
    """Rank ``rank`` of a pipeline-parallel world of 2 on gloo (a spawned process, sglang's
    scheduler's set-up: ``load_plugins()``, its ServerArgs published with ``--pp-size 2`` and
    EAGLE, its own process groups). The last stage builds ``folder``'s draft as sglang's EAGLE
    worker does (inside ``draft_pp_context``) and loads it through sglang's stream, with the
    plugin's switch on and off; writes ``out`` (JSON): per switch, the parameters without storage
    and whether the embedding holds the checkpoint's, and the plugin's log lines."""
    import inspect
    import json
    import logging
    import os

    os.environ["SGLANG_ENABLE_PP_SPEC"] = "1"
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("sglang_mtp_dequant").addHandler(handler)
    logging.getLogger("sglang_mtp_dequant").setLevel(logging.INFO)
    from safetensors.torch import load_file
    from sglang.srt.distributed import parallel_state
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    from sglang_mtp_dequant.serving import sglang_private
    from sglang_mtp_dequant.tools.cpu_env import cuda_capability_answered
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        join_attention_dp,
        sglang_weights,
    )

    load_plugins()
    args = ServerArgs(
        model_path=folder, device="cpu", pp_size=2, speculative_algorithm="EAGLE",
        mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True,
    )  # fmt: skip
    with cuda_capability_answered():
        sglang_private.publish_server_args(args, role="scheduler", world_rank=rank)
    parallel_state.init_distributed_environment(
        world_size=2, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )  # fmt: skip
    widths = inspect.signature(parallel_state.initialize_model_parallel).parameters
    if "pipeline_model_parallel_size" in widths:  # sglang through 0.5.20 takes the widths
        parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2, backend="gloo")
    else:  # from 0.5.21 it reads the published ones
        parallel_state.initialize_model_parallel(backend="gloo")
    join_attention_dp()
    found: dict[str, object] = {}
    if rank == 1:
        from sglang.srt.speculative.spec_utils import draft_pp_context

        stored = load_file(os.path.join(folder, "model.safetensors"))
        embedding = stored["model.embed_tokens.weight"]
        for share in ("on", "off"):
            os.environ["SGLANG_MTP_DEQUANT_SHARE_VOCAB"] = share
            config = draft_model_config(folder)
            with draft_pp_context():
                model = build_draft(config)
                type(model).load_weights(model, sglang_weights(config, model))
            found[share] = {
                "meta": sorted(n for n, p in model.named_parameters() if p.device.type == "meta"),
                "embedding_loaded": bool(torch.equal(model.model.embed_tokens.weight, embedding)),
            }
    found["said"] = said
    with open(out, "w") as handle:
        json.dump(found, handle)
    torch.distributed.barrier()  # rank 0 holds the store: it leaves only after rank 1 is done
    os._exit(0)  # a gloo group's destructor may wait for the peer that already left
