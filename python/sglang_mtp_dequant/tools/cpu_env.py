"""Environment shims a CPU-only process needs before sglang's model modules import and build.

Usage::

    ensure_torchvision_importable()          # before transformers / sglang are imported
    with placeholder_vllm_rotary():          # around building a model on CPU
        model = build(...)

Each shim acts only where the real thing cannot run, and neither touches attention, matmul,
sampling or weight loading:

- PyPI's torchvision wheel is a CUDA build; beside CPU torch its import fails with
  ``operator torchvision::nms does not exist``. Only then, the half-imported modules are
  dropped and the two operator schemas it needs are defined, so transformers (imported by
  sglang) can import torchvision. Never done when torchvision imports cleanly (a second
  definition of the schemas would abort the process).
- Off CUDA, ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding``, a
  GPU kernel used only in ``forward`` on CUDA. A placeholder module is put in ``sys.modules``
  while the model is built and removed afterwards; it raises if anything ever calls it.

The CLI (``verify``, the doctor's dry run), the tests and the end-to-end servers'
``sitecustomize`` (``benchmarks/e2e/site/``) use these; the serving plugin never does.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

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


def vllm_placeholder() -> dict[str, types.ModuleType]:
    """``{"vllm": ..., "vllm._custom_ops": ...}`` whose ``rotary_embedding`` raises if called."""

    def rotary_embedding(*_args, **_kwargs):
        raise RuntimeError("vllm rotary kernel placeholder: forward is not supported on CPU")

    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding
    vllm._custom_ops = ops
    return {"vllm": vllm, "vllm._custom_ops": ops}


@contextlib.contextmanager
def placeholder_vllm_rotary() -> Iterator[None]:
    """Satisfy the CUDA-only rotary kernel import during model construction only."""
    if "vllm._custom_ops" in sys.modules:
        yield
        return
    sys.modules.update(vllm_placeholder())
    try:
        yield
    finally:
        sys.modules.pop("vllm._custom_ops", None)
        sys.modules.pop("vllm", None)
