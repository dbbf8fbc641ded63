"""Build sglang's real draft classes on a CPU-only machine (for `verify`, the demo and tests).

Usage::

    with cpu_sglang_context(checkpoint_folder) as ctx:
        draft = ctx.build_draft()                       # Qwen3_5ForCausalLMMTP, bf16, CPU
        draft.load_weights(ctx.weights())               # sglang's own safetensors iterator

Nothing here changes how sglang loads weights: it is the set-up a CPU-only process needs
before sglang's model modules import and build at all. Two environment shims are applied,
each only where the real thing cannot run:

- PyPI's torchvision wheel is a CUDA build; beside CPU torch its import fails with
  ``operator torchvision::nms does not exist``. Only then, the half-imported modules are
  dropped and the two operator schemas it needs are defined, so transformers (imported by
  sglang) can import torchvision. Never done when torchvision imports cleanly.
- Off CUDA, ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding``, a
  GPU kernel used only in ``forward``. A placeholder module is put in ``sys.modules`` while
  the model is built and removed afterwards; loading weights never calls it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch


def ensure_torchvision_importable() -> None:
    """Make ``import torchvision`` work beside CPU torch (see the module docstring)."""
    try:
        import torchvision  # noqa: F401

        return
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 - kept alive below
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP_ALIVE.append(lib)
    import torchvision  # noqa: F401,F811


_KEEP_ALIVE: list[object] = []


@contextlib.contextmanager
def _placeholder_vllm_rotary() -> Iterator[None]:
    """Satisfy the CUDA-only rotary kernel import during model construction only."""
    if "vllm._custom_ops" in sys.modules:
        yield
        return

    def rotary_embedding(*_args, **_kwargs):
        raise RuntimeError("vllm rotary kernel placeholder: forward is not supported on CPU")

    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding
    vllm._custom_ops = ops
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = vllm, ops
    try:
        yield
    finally:
        sys.modules.pop("vllm._custom_ops", None)
        sys.modules.pop("vllm", None)


def _free_port() -> int:
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
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
    )
    parallel_state.initialize_model_parallel(backend="gloo")
    _DIST_READY = True


def publish_context(model_path: str, draft_path: str | None = None, **server_args) -> None:
    """Publish a ServerArgs for ``model_path`` the way sglang's scheduler does."""
    from sglang.srt.runtime_context import SpawnRanks, publish
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
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))


def weight_files(folder: str) -> list[str]:
    """The files sglang's DefaultModelLoader streams for a ModelSlim folder, in its order."""
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def safetensors_stream(files: list[str]):
    """sglang's own weight iterator (the one DefaultModelLoader uses)."""
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    return safetensors_weights_iterator(files)


def text_config_of(folder: str):
    """sglang's config object for a Qwen3.5 checkpoint folder (VL wrapper or text-only)."""
    from sglang.srt.configs import qwen3_5

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        raw = json.load(handle)
    if "text_config" in raw:
        cls = (
            qwen3_5.Qwen3_5MoeConfig
            if raw.get("model_type") == "qwen3_5_moe"
            else qwen3_5.Qwen3_5Config
        )
        return cls(**raw)
    cls = (
        qwen3_5.Qwen3_5MoeTextConfig
        if raw.get("model_type") == "qwen3_5_moe_text"
        else qwen3_5.Qwen3_5TextConfig
    )
    return cls(**raw)


@dataclass
class CpuDraftBuilder:
    """Builds sglang's Qwen3.5 MTP draft for one checkpoint folder."""

    folder: str
    dtype: torch.dtype = torch.bfloat16

    def build_draft(self, quant_config=None) -> torch.nn.Module:
        from sglang.srt.model_loader.utils import set_default_torch_dtype
        from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

        config = text_config_of(self.folder)
        with set_default_torch_dtype(self.dtype), _placeholder_vllm_rotary():
            return Qwen3_5ForCausalLMMTP(config, quant_config=quant_config)

    def weights(self):
        return safetensors_stream(weight_files(self.folder))


def prepare_cpu_process(model_path: str, draft_path: str | None = None) -> None:
    """Everything a CPU process needs before it can build sglang's draft for ``model_path``."""
    ensure_torchvision_importable()
    publish_context(model_path, draft_path)
    init_world_size_one()


def build_draft_class(
    class_path: str, config, dtype: torch.dtype = torch.bfloat16, quant_config=None
) -> torch.nn.Module:
    """Build any sglang draft class, named by dotted path, on CPU for ``config``.

    Example::

        prepare_cpu_process(model_path)
        draft = build_draft_class(
            "sglang.srt.models.deepseek_nextn.DeepseekV3ForCausalLMNextN", DeepseekV3Config(...)
        )

    The same set-up as ``CpuDraftBuilder.build_draft`` (default dtype, the rotary-kernel
    placeholder), for the draft classes other than Qwen3.5's: Qwen3-Next, Qwen3-MoE, GLM-4.5
    (and -Lite) and DeepSeek-V3 NextN, Qwen4-Exp. Their constructors need only ``config``
    and the parallel state ``prepare_cpu_process`` publishes.
    """
    import pkgutil

    from sglang.srt.model_loader.utils import set_default_torch_dtype

    cls = pkgutil.resolve_name(class_path)
    with set_default_torch_dtype(dtype), _placeholder_vllm_rotary():
        return cls(config, quant_config=quant_config)
