"""Build sglang's real draft classes on a CPU-only machine (for `verify`, the demo and tests).

Usage::

    prepare_cpu_process(folder)                          # context, gloo world of one, shims
    config = draft_model_config(folder)                  # sglang's ModelConfig of the draft
    draft = build_draft(config)                          # its class, dtype, quant config
    draft.load_weights(sglang_weights(config, draft))    # DefaultModelLoader's own stream

Nothing here changes how sglang loads weights: it is the set-up a CPU-only process needs
before sglang's model modules import and build at all (the environment shims it applies are
``cpu_env.py``'s), and sglang's own functions to build a draft and its weight stream, reached
through the ledger of sglang's private names (``serving/sglang_private.py``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import torch

from ..serving import sglang_private
from .cpu_env import (
    cuda_capability_answered,
    ensure_torchvision_importable,
    generic_rope_on_cpu,
    placeholder_vllm_rotary,
)

#: sglang's ``ModelConfig`` of a draft (sglang's objects are typed as Any here)
ModelConfig = Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_DIST_READY = False


def init_world_size_one() -> None:
    """sglang's own parallel state at world size 1 on gloo (idempotent per process)."""
    global _DIST_READY
    if _DIST_READY:
        return
    from sglang.srt.distributed import parallel_state

    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    parallel_state.initialize_model_parallel(backend="gloo")
    _DIST_READY = True


def publish_context(model_path: str, draft_path: str | None = None, **server_args: Any) -> None:
    """Publish a ServerArgs for ``model_path`` the way sglang's scheduler does."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=model_path,
        device="cpu",
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
        **server_args,
    )
    if draft_path is not None:
        args.speculative_draft_model_path = draft_path
    with cuda_capability_answered():  # sglang's DSA adjustment asks for a CUDA device
        sglang_private.publish_server_args(args, role="test", world_rank=0)


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


def new_draft(
    path: str, revision: str | None = None, **server_args: Any
) -> tuple[ModelConfig, torch.nn.Module]:
    """``(model_config, draft)``: sglang's context published for ``path`` (with
    ``server_args``), the draft's ``ModelConfig``, and its class built on the CPU."""
    publish_context(path, **server_args)
    config = draft_model_config(path, revision)
    return config, build_draft(config)


def draft_model_config(path: str, revision: str | None = None) -> ModelConfig:
    """sglang's ``ModelConfig`` of the draft for ``path``, as its draft worker builds it
    (``is_draft_model=True`` maps the architecture to the MTP/NextN class)."""
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_server_args(
        sglang_private.published_server_args(),
        model_path=path,
        model_revision=revision,
        is_draft_model=True,
    )


def build_draft(model_config: ModelConfig, device: str | torch.device = "cpu") -> torch.nn.Module:
    """sglang's own draft class for ``model_config``, built the way ``DefaultModelLoader`` does
    (its quantization config, its dtype), on ``device`` (``"meta"``: shapes only)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    load_config = LoadConfig(load_format="auto")
    quant_config = sglang_private.quantization_config(model_config, load_config)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            return sglang_private.initialize_model(model_config, load_config, quant_config)


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


def sglang_weights(
    model_config: ModelConfig, model: torch.nn.Module, download_dir: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weight stream sglang's ``DefaultModelLoader`` gives ``model.load_weights``: it
    resolves the checkpoint (folder, hub id, ``download_dir``) when first advanced."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    return sglang_private.all_weights(loader, model_config, model)


def path_weights(
    path: str, revision: str | None = None, download_dir: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``DefaultModelLoader``'s stream for a checkpoint path with no ``ModelConfig`` (a draft
    class built from a hand-made config): the same resolution and iterator, lazily."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    yield from sglang_private.weights_iterator(loader, path, revision)


def prepare_cpu_process(model_path: str, draft_path: str | None = None, **server_args: Any) -> None:
    """Everything a CPU process needs before it can build sglang's draft for ``model_path``."""
    ensure_torchvision_importable()
    publish_context(model_path, draft_path, **server_args)
    init_world_size_one()


def build_draft_class(
    class_path: str,
    config: Any,
    dtype: torch.dtype = torch.bfloat16,
    quant_config: Any = None,
) -> torch.nn.Module:
    """Build any sglang draft class, named by dotted path, on CPU for a hand-made ``config``.

    Example::

        prepare_cpu_process(model_path)
        draft = build_draft_class(
            "sglang.srt.models.deepseek_nextn.DeepseekV3ForCausalLMNextN", DeepseekV3Config(...)
        )

    For tests of classes whose tiny configs are built in code rather than read from a
    checkpoint's config.json (``build_draft`` is the path from a folder).
    """
    import pkgutil

    from sglang.srt.model_loader.utils import set_default_torch_dtype

    cls = pkgutil.resolve_name(class_path)
    with set_default_torch_dtype(dtype), placeholder_vllm_rotary(), generic_rope_on_cpu():
        return cls(config, quant_config=quant_config)
