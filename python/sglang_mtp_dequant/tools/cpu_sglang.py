"""Build sglang's real draft classes on a CPU-only machine (for `verify` and `dryrun`).

Usage::

    prepare_cpu_process(folder)                          # context, gloo world of one, shims
    config = draft_model_config(folder)                  # sglang's ModelConfig of the draft
    draft = build_draft(config)                          # its class, dtype, quant config
    draft.load_weights(sglang_weights(config, draft))    # DefaultModelLoader's own stream

Nothing here changes how sglang loads weights: it is the set-up a CPU-only process needs and
sglang's own functions, reached through the ledger (``serving/sglang_private.py``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from ..serving import context, sglang_private
from .cpu_env import (
    cuda_capability_answered,
    ensure_torchvision_importable,
    generic_rope_on_cpu,
    placeholder_vllm_rotary,
)

ModelConfig = Any


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's choice)."""
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
    join_attention_dp()
    _DIST_READY = True


def join_attention_dp() -> None:
    """sglang's attention-DP placement for the published server arguments, as its runner sets it."""
    sglang_private.set_attention_dp_placement(
        sglang_private.published_server_args(), hidden_size=1, dtype=torch.bfloat16
    )


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


def draft_model_config(path: str, revision: str | None = None) -> ModelConfig:
    """sglang's ``ModelConfig`` of the draft for ``path``, as its draft worker builds it."""
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_server_args(
        sglang_private.published_server_args(),
        model_path=path,
        model_revision=revision,
        is_draft_model=True,
    )


def build_draft(
    model_config: ModelConfig,
    device: str | torch.device = "cpu",
    adjust_quant_config: Callable[[Any], None] | None = None,
) -> torch.nn.Module:
    """sglang's own draft class for ``model_config``, built as ``DefaultModelLoader`` does."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    load_config = LoadConfig(load_format="auto")
    quantize, initialize = sglang_private.quantization_config, sglang_private.initialize_model
    if context.is_bypassed():  # a build as stock sglang's: its own functions, never a hook
        quantize = sglang_own(sglang_private.QUANTIZATION_CONFIG_TARGET)
        initialize = sglang_own(sglang_private.INITIALIZE_MODEL_TARGET)
    quant_config = quantize(model_config, load_config)
    if adjust_quant_config is not None and quant_config is not None:
        adjust_quant_config(quant_config)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            return initialize(model_config, load_config, quant_config)


def sglang_own(target: str) -> Callable[..., Any]:
    """sglang's function at ``target``, unwrapped of any hook ``HookRegistry`` put on it."""
    import importlib

    module, _, name = target.rpartition(".")
    return cast(
        Callable[..., Any], sglang_private.unwrapped(getattr(importlib.import_module(module), name))
    )


def sglang_weights(
    model_config: ModelConfig, model: torch.nn.Module, download_dir: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weight stream sglang's ``DefaultModelLoader`` gives ``model.load_weights``."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format="auto", download_dir=download_dir))
    return sglang_private.all_weights(loader, model_config, model)


def prepare_cpu_process(model_path: str, draft_path: str | None = None, **server_args: Any) -> None:
    """Everything a CPU process needs before it can build sglang's draft for ``model_path``."""
    ensure_torchvision_importable()
    publish_context(model_path, draft_path, **server_args)
    init_world_size_one()
