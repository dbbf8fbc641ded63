"""Whether a draft class's ``load_weights`` is sglang's own fix (``upstream/series/``, PR 1), by
what the code does: it calls, through a global of its module, a function that decodes a one-weight
W8A8_DYNAMIC probe stream, and the module's NPU check, which gates that call, is true.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import torch

from .sglang_private import draft_module_is_npu

#: one W8A8_DYNAMIC module, in stream order: its weight is (q - offset) * scale = [[1, -1]]
_PROBE = [("mtp.p.weight", torch.tensor([[3, -1]], dtype=torch.int8))]
_PROBE += [("mtp.p.weight_scale", torch.tensor([[0.5]])), ("mtp.p.weight_offset", torch.ones(1, 1))]


def calls_sglang_decode(load_weights: Callable[..., object], module: ModuleType) -> bool:
    """Whether ``load_weights`` (of ``module``) calls such a decode, on NPU."""
    try:
        on_npu = draft_module_is_npu(module)
    except AttributeError:
        return False
    names = getattr(getattr(load_weights, "__code__", None), "co_names", ())
    on = callable(on_npu) and bool(on_npu())
    return on and any(_decodes(getattr(module, name, None)) for name in names)


def _decodes(function: object) -> bool:
    """Whether ``function`` yields the probe's weight decoded, as PR 1's ``(weights,
    description, folder, dtype)`` generator does (functions of other signatures raise)."""
    if not inspect.isfunction(function):
        return False
    description = dict.fromkeys(dict(_PROBE), "W8A8_DYNAMIC")
    try:  # the first item only: a real load's INFO line comes after the last
        name, value = next(function(iter(_PROBE), description, "", torch.float32))
    except Exception:  # noqa: BLE001 - any function of the module may be asked
        return False
    return name == "mtp.p.weight" and value.tolist() == [[1.0, -1.0]]
