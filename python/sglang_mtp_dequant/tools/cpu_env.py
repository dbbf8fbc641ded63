"""Environment shims a CPU-only process needs before sglang's model modules import and build.

Usage::

    ensure_torchvision_importable()          # before transformers / sglang are imported
    with placeholder_vllm_rotary(), cuda_capability_answered(), generic_rope_on_cpu():
        model = build(...)                   # and npu_quantization_rule() to build as on NPU
    stand_ins_used()                         # the notes the doctor prints

Each shim acts only where the real thing cannot run here, touches no attention, matmul,
sampling or weight loading, and records a note when first needed (``stand_ins_used``). The CLI,
the tests and ``e2e/site/`` use these; the serving plugin never does.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

#: stand-in name -> the note the doctor prints, for each stand-in some sglang call needed
_USED: dict[str, str] = {}

CUDA_CAPABILITY_NOTE = (
    "CPU stand-in: sglang's server-args adjustment for DSA models asks "
    "torch.cuda.get_device_capability(), which has no answer off CUDA (on NPU it is not asked); "
    "the CPU tools answered (0, 0). Only the KV-cache dtype and attention backends depend on "
    "it, never the draft's weights, shapes or quantization"
)
GENERIC_ROPE_NOTE = (
    "CPU stand-in: sglang's CPU rope supports deepseek_yarn scaling only (the DSA indexer's "
    "rope here has {scaling}); it was built with sglang's generic rope instead. A rope holds no "
    "weights and runs only in forward, which the CPU tools never call"
)


def stand_ins_used() -> dict[str, str]:
    """The stand-ins some sglang call needed since ``forget_stand_ins``, with their notes."""
    return dict(_USED)


def forget_stand_ins() -> None:
    """Start a new record (the doctor does, per checkpoint)."""
    _USED.clear()


def ensure_torchvision_importable() -> None:
    """Make ``import torchvision`` work beside CPU torch where PyPI's CUDA build fails with
    ``operator torchvision::nms does not exist``: its two operator schemas are defined then."""
    try:
        import torchvision  # noqa: F401

        return
    except ImportError:
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


def vllm_placeholder() -> dict[str, types.ModuleType]:
    """``{"vllm": ..., "vllm._custom_ops": ...}`` whose ``rotary_embedding`` raises if called."""

    def rotary_embedding(*_args: object, **_kwargs: object) -> NoReturn:
        raise RuntimeError("vllm rotary kernel placeholder: forward is not supported on CPU")

    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")
    setattr(ops, "rotary_embedding", rotary_embedding)  # noqa: B010 - a module built here
    setattr(vllm, "_custom_ops", ops)  # noqa: B010
    return {"vllm": vllm, "vllm._custom_ops": ops}


@contextlib.contextmanager
def placeholder_vllm_rotary() -> Iterator[None]:
    """A placeholder for the GPU rotary kernel ``RotaryEmbedding`` imports (raises if called)."""
    if "vllm._custom_ops" in sys.modules:
        yield
        return
    sys.modules.update(vllm_placeholder())
    try:
        yield
    finally:
        sys.modules.pop("vllm._custom_ops", None)
        sys.modules.pop("vllm", None)


@contextlib.contextmanager
def cuda_capability_answered(
    capability: tuple[int, int] = (0, 0), note: str = CUDA_CAPABILITY_NOTE
) -> Iterator[None]:
    """Answer ``torch.cuda.get_device_capability()`` with ``capability`` off CUDA, recording
    ``note`` (sglang's DSA server-args resolution asks it; no weight or shape depends on it)."""
    if torch.cuda.is_available():
        yield
        return
    real = torch.cuda.get_device_capability

    def get_device_capability(device: object = None) -> tuple[int, int]:
        _USED[note] = note
        return capability

    torch.cuda.get_device_capability = get_device_capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


@contextlib.contextmanager
def generic_rope_on_cpu() -> Iterator[None]:
    """Build the ropes sglang's CPU branch cannot (``deepseek_yarn`` scaling only) with its
    generic ``get_rope``: a rope holds no weights."""
    from ..serving import sglang_private

    real = sglang_private.cpu_rope_builder()
    generic = sglang_private.generic_rope_builder()

    def cpu_rope(head_size: int, rotary_dim: int, max_position: int, base: int,
                 is_neox_style: bool = True, rope_scaling: dict[str, Any] | None = None,
                 dtype: torch.dtype | None = None, partial_rotary_factor: float = 1.0,
                 device: str | None = None) -> Any:  # fmt: skip
        scaling = (rope_scaling or {}).get("rope_type")
        if scaling == "deepseek_yarn":
            return real(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling,
                        dtype, partial_rotary_factor, device)  # fmt: skip
        _USED["generic-rope"] = GENERIC_ROPE_NOTE.format(
            scaling=f"{scaling!r} scaling" if scaling else "no rope_scaling"
        )
        return generic(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling,
                       dtype, partial_rotary_factor)  # fmt: skip

    sglang_private.set_cpu_rope_builder(cpu_rope)
    try:
        yield
    finally:
        sglang_private.set_cpu_rope_builder(real)


def _packed_module_mappings() -> list[tuple[dict, dict]]:
    """Every ``packed_modules_mapping`` dict of sglang's model classes, with a copy of it (the
    loader's NPU branch updates the class's own dict in place)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.srt.models.") or module is None:
            continue
        for value in list(vars(module).values()):
            # the class's own __dict__: attribute access on transformers' placeholders raises
            if isinstance(value, type) and value.__module__ == name:
                mapping = value.__dict__.get("packed_modules_mapping")
                if isinstance(mapping, dict):
                    found[id(mapping)] = (mapping, dict(mapping))
    return list(found.values())


@contextlib.contextmanager
def npu_quantization_rule() -> Iterator[None]:
    """While a draft is built, sglang's NPU clauses answer as on NPU: the draft classes'
    quantization rule, the loader's packed-module mapping, DeepSeek's NextN layer naming."""
    import importlib

    from ..serving import sglang_private

    saved = []
    for path in sglang_private.NPU_RULE_MODULES:
        try:
            module = importlib.import_module(path)
        except Exception:  # noqa: BLE001 - a family that cannot import here is not being built
            continue
        saved.append((module, sglang_private.draft_module_is_npu(module)))
        sglang_private.set_draft_module_is_npu(module, lambda: True)
    loader_was_npu = sglang_private.loader_is_npu()
    sglang_private.set_loader_is_npu(True)
    nextn_was_npu = sglang_private.nextn_module_is_npu()
    sglang_private.set_nextn_module_is_npu(True)
    mappings = _packed_module_mappings()
    stand_in = not hasattr(torch.Tensor, "npu")
    if stand_in:  # QuaRot's rot.weight, moved to the NPU as DeepSeek's NextN reads it
        setattr(torch.Tensor, "npu", _tensor_stays)  # noqa: B010
    try:
        yield
    finally:
        if stand_in:
            delattr(torch.Tensor, "npu")
        for mapping, before in mappings:
            mapping.clear()
            mapping.update(before)
        sglang_private.set_nextn_module_is_npu(nextn_was_npu)
        sglang_private.set_loader_is_npu(loader_was_npu)
        for module, function in saved:
            sglang_private.set_draft_module_is_npu(module, function)


def _tensor_stays(tensor: torch.Tensor, *_args: object, **_kwargs: object) -> torch.Tensor:
    _USED["npu-tensor"] = (
        "CPU stand-in: while the draft was built as on NPU, Tensor.npu() (torch_npu's, absent "
        "here) kept the tensor on the CPU (DeepSeek's NextN moves QuaRot's rot.weight with it)"
    )
    return tensor


NPU_KERNEL_NOTE = (
    "CPU stand-in: while the draft was built as on NPU, sglang's quantized layers looked up the "
    "NPU kernel(s) {kernels} (torch_npu's, absent here); each was answered by a placeholder that "
    "raises if called. Kernels run only in forward, which the CPU tools never call: the layers, "
    "parameters, shapes and dtypes are sglang's own"
)


class _NpuKernels:
    """``torch.ops.npu`` while a draft is built on a CPU (``npu_kernels_looked_up``)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.looked_up: list[str] = []

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._real, name)
        except AttributeError:
            pass
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in self.looked_up:
            self.looked_up.append(name)
        _USED["npu-kernels"] = NPU_KERNEL_NOTE.format(kernels=", ".join(self.looked_up))

        def kernel(*_args: object, **_kwargs: object) -> NoReturn:
            raise RuntimeError(f"torch.ops.npu.{name} placeholder: NPU kernels do not run here")

        return kernel


@contextlib.contextmanager
def npu_kernels_looked_up() -> Iterator[None]:
    """While a draft is built as on NPU, answer ``torch.ops.npu.<kernel>`` lookups (sglang's NPU
    quantization methods fetch kernels when constructed, call them only in ``forward``) with a
    placeholder that raises if called; torch_npu's own kernels where installed."""
    real = getattr(torch.ops, "npu")  # noqa: B009 - an op namespace mypy does not know
    setattr(torch.ops, "npu", _NpuKernels(real))  # noqa: B010
    try:
        yield
    finally:
        setattr(torch.ops, "npu", real)  # noqa: B010
