"""CPU stand-ins for the two Ascend kernels sglang's ModelSlim W8A8_DYNAMIC linears call.

Usage (``sitecustomize.py`` arranges it in every server process; tests call the functions)::

    install()          # registers torch.ops.npu.npu_dynamic_quant / npu_quant_matmul for CPU
    codes, scale = dynamic_quant(x)                       # what npu_dynamic_quant computes
    y = quant_matmul(codes, weight_t, weight_scale, pertoken_scale=scale, output_dtype=x.dtype)

sglang's ``NPUW8A8Int8DynamicLinearMethod.apply`` (``hardware_backend/npu/quantization/
linear_method_npu.py``) quantizes each token with ``torch.ops.npu.npu_dynamic_quant`` and
multiplies with ``torch.ops.npu.npu_quant_matmul``; torch_npu registers both on an Ascend
machine, nothing does on a CPU. These are registered under the same names and schemas with
``torch.library`` for the CPU, so sglang's own linear method, scheme and loader run unchanged:

- ``npu_dynamic_quant(x)``: per-token symmetric int8, as CANN documents it:
  ``scale = row_max(|x|) / 127``, ``y = round(x / scale)`` (float32 arithmetic,
  round-half-to-even), scale float32 of ``x``'s shape without its last dimension.
- ``npu_quant_matmul(x1, x2, scale, pertoken_scale=, bias=, output_dtype=)``: the int8 product
  accumulated exactly (integers), an int32 ``bias`` added to the accumulator, then converted to
  float32 and multiplied by the per-channel ``scale`` and the per-token ``pertoken_scale``; a
  float ``bias`` is added after; the result is cast to ``output_dtype``.

What differs on an NPU (docs/results.md): the NPU quantizes bfloat16/float16 activations (it
has no float32 input), its vector unit may form ``x * (127 / row_max)`` instead of dividing and
round ties differently, so a code can differ by one where ``x / scale`` sits on a tie; the
weight is cast to the FRACTAL_NZ layout (``npu_format_cast``, a no-op off NPU) and the product
runs on the cube unit, whose int32 accumulation is exact as here; the order of the two scale
multiplications can move the last float32 bit. Arguments these schemes never pass (``offset``,
``smooth_scales``, int4, an int8 output) raise instead of being guessed.
"""

from __future__ import annotations

import torch
from e2e_shim_hooks import after_import, say

LINEAR_METHOD_NPU = "sglang.srt.hardware_backend.npu.quantization.linear_method_npu"
NAMESPACE = "npu"
SCHEMAS = {
    "npu_dynamic_quant": "npu_dynamic_quant(Tensor x, *, Tensor? smooth_scales=None, "
    "Tensor? group_index=None, ScalarType? dst_type=None) -> (Tensor, Tensor)",
    "npu_quant_matmul": "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, "
    "Tensor? offset=None, Tensor? pertoken_scale=None, Tensor? bias=None, "
    "ScalarType? output_dtype=None) -> Tensor",
}
INT8_MAX = 127

_LIBRARY: list[torch.library.Library] = []  # kept alive: dropping it unregisters the ops


def _unsupported(op: str, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"the CPU stand-in for torch.ops.npu.{op} computes what sglang's W8A8_DYNAMIC linear "
        f"method asks of it; {what} is not implemented (e2e/site/e2e_shim_npu_ops.py)"
    )


def dynamic_quant(
    x: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8 codes of ``x`` and their float32 scales."""
    if smooth_scales is not None or group_index is not None:
        raise _unsupported("npu_dynamic_quant", "smooth_scales / group_index")
    if dst_type not in (None, torch.int8):
        raise _unsupported("npu_dynamic_quant", f"dst_type={dst_type}")
    values = x.to(torch.float32)
    scale = values.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: codes 0
    codes = torch.round(values / safe).clamp_(-INT8_MAX - 1, INT8_MAX).to(torch.int8)
    return codes, scale.squeeze(-1)


def quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x1 @ x2`` of int8 codes, exact, then scaled per channel and per token."""
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        raise _unsupported("npu_quant_matmul", f"x1 {x1.dtype} / x2 {x2.dtype} (int8 only)")
    if offset is not None:
        raise _unsupported("npu_quant_matmul", "offset")
    if output_dtype in (None, torch.int8):
        raise _unsupported("npu_quant_matmul", "an int8 output")
    if not scale.dtype.is_floating_point:
        raise _unsupported("npu_quant_matmul", f"a {scale.dtype} scale")
    rows = x1.reshape(-1, x1.shape[-1])
    # float64 holds every int8 x int8 sum of fewer than 2**38 terms exactly
    accumulator = (rows.to(torch.float64) @ x2.to(torch.float64)).to(torch.int64)
    if bias is not None and not bias.dtype.is_floating_point:
        accumulator = accumulator + bias.to(torch.int64)
    out = accumulator.to(torch.float32) * scale.to(torch.float32)
    if pertoken_scale is not None:
        out = out * pertoken_scale.to(torch.float32).reshape(-1, 1)
    if bias is not None and bias.dtype.is_floating_point:
        out = out + bias.to(torch.float32)
    return out.reshape(*x1.shape[:-1], x2.shape[-1]).to(output_dtype)


IMPLEMENTATIONS = {"npu_dynamic_quant": dynamic_quant, "npu_quant_matmul": quant_matmul}


def _announced(name: str, function):
    called: list[bool] = []

    def run(*args, **kwargs):
        if not called:
            called.append(True)
            say(f"torch.ops.{NAMESPACE}.{name} ran on the CPU stand-in")
        return function(*args, **kwargs)

    return run


def register() -> None:
    """Define ``torch.ops.npu.<op>`` with torch_npu's schemas and this file's CPU kernels."""
    if _LIBRARY:
        return
    library = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in SCHEMAS.items():
        library.define(schema)
        library.impl(name, _announced(name, IMPLEMENTATIONS[name]), "CPU")
    _LIBRARY.append(library)
    say(f"registered CPU stand-ins for torch.ops.{NAMESPACE}.{', '.join(SCHEMAS)}")


def install() -> None:
    """Register the ops once sglang's NPU linear methods import (never in other processes)."""
    after_import(LINEAR_METHOD_NPU, lambda module: register())
