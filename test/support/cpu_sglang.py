"""The tests' and benchmarks' ways to build and load sglang's drafts on a CPU-only machine.

Usage::

    config, draft = new_draft(folder)                    # context published, class built
    draft.load_weights(path_weights(folder))             # DefaultModelLoader's stream

Beside the package's ``tools/cpu_sglang.py`` (what ``verify`` and ``dryrun`` use): a TP/EP
rank's world, sglang's whole ``load_model``, a stream with no ``ModelConfig``, and any draft
class built from a hand-made config.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from sglang_mtp_dequant.serving import sglang_private
from sglang_mtp_dequant.tools.cpu_env import (
    cuda_capability_answered,
    generic_rope_on_cpu,
    placeholder_vllm_rotary,
)
from sglang_mtp_dequant.tools.cpu_sglang import (
    ModelConfig,
    build_draft,
    draft_model_config,
    join_attention_dp,
    publish_context,
)


def join_parallel_world(
    model_path: str, *, world_size: int, rank: int, port: int, ep_size: int = 1
) -> None:
    """This process as rank ``rank`` of a TP (and EP) world on gloo, as one of sglang's
    scheduler processes: its ServerArgs published with its rank, sglang's own process groups
    joined (``init_distributed_environment`` / ``initialize_model_parallel``)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path=model_path,
        device="cpu",
        tp_size=world_size,
        ep_size=ep_size,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
    )
    # sglang reads ranks from two places that must agree: the published SpawnRanks (read by
    # VocabParallelEmbedding and FusedMoE) and the torch process group (read by the linear
    # layers); run_scheduler_process publishes world_rank == the torch rank as well
    with cuda_capability_answered():
        sglang_private.publish_server_args(server_args, role="scheduler", world_rank=rank)
    parallel_state.set_custom_all_reduce(False)  # a CUDA-only feature
    parallel_state.init_distributed_environment(
        world_size=world_size,
        rank=rank,
        local_rank=rank,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    parallel_state.initialize_model_parallel(backend="gloo")
    join_attention_dp()


def new_draft(
    path: str, revision: str | None = None, **server_args: Any
) -> tuple[ModelConfig, torch.nn.Module]:
    """``(model_config, draft)``: sglang's context published for ``path`` (with
    ``server_args``), the draft's ``ModelConfig``, and its class built on the CPU."""
    publish_context(path, **server_args)
    config = draft_model_config(path, revision)
    return config, build_draft(config)


def load_model(model_config: ModelConfig, download_dir: str | None = None) -> torch.nn.Module:
    """sglang's own ``DefaultModelLoader.load_model`` of ``model_config`` on the CPU: its
    quantization config, its build, its file resolution and weight stream, the class's
    ``load_weights`` (hooked or not) and its post-processing, as a draft worker loads it."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    with placeholder_vllm_rotary(), generic_rope_on_cpu():
        return loader.load_model(model_config=model_config, device_config=DeviceConfig("cpu"))


def path_weights(
    path: str, revision: str | None = None, download_dir: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``DefaultModelLoader``'s stream for a checkpoint path with no ``ModelConfig`` (a draft
    class built from a hand-made config): the same resolution and iterator, lazily."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    yield from sglang_private.weights_iterator(loader, path, revision)


def build_draft_class(
    class_path: str,
    config: Any,
    dtype: torch.dtype = torch.bfloat16,
    quant_config: Any = None,
) -> torch.nn.Module:
    """Any sglang draft class, named by dotted path, built on CPU for a hand-made ``config``
    (``build_draft`` is the path from a checkpoint folder's config.json)::

        draft = build_draft_class(
            "sglang.srt.models.deepseek_nextn.DeepseekV3ForCausalLMNextN", DeepseekV3Config(...)
        )
    """
    import pkgutil

    from sglang.srt.model_loader.utils import set_default_torch_dtype

    cls = pkgutil.resolve_name(class_path)
    with set_default_torch_dtype(dtype), placeholder_vllm_rotary(), generic_rope_on_cpu():
        return cls(config, quant_config=quant_config)
