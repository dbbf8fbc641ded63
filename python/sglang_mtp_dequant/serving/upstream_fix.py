"""Whether a draft class's ``load_weights`` is sglang's own fix (``upstream/series/``, PR 1).

Usage::

    from .upstream_fix import calls_sglang_decode
    if calls_sglang_decode(load_weights, sys.modules[load_weights.__module__]): ...

Detected by what the code does, not by a version or a name: PR 1's ``load_weights`` calls
sglang's neutral decode helper, through a global of its module, only where that module's NPU
check is true. A module that merely imports the helper, a look-alike of the same name, or a
run where the check is false (PR 1 then leaves the draft as stock) does not count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .sglang_private import draft_module_is_npu

#: the decode PR 1 adds to sglang: (module, function)
UPSTREAM_HELPER = (
    "sglang.srt.layers.quantization.modelslim.unquantized_draft",
    "dequantize_draft_weights",
)


def calls_sglang_decode(load_weights: Callable[..., Any], module: ModuleType) -> bool:
    """Whether ``load_weights`` (of ``module``) calls sglang's decode helper, that very
    object, already imported, and ``module``'s NPU check, which gates the call, is true."""
    helper = getattr(sys.modules.get(UPSTREAM_HELPER[0]), UPSTREAM_HELPER[1], None)
    code = getattr(load_weights, "__code__", None)
    if helper is None or code is None:
        return False
    if not any(getattr(module, name, None) is helper for name in code.co_names):
        return False
    try:
        on_npu = draft_module_is_npu(module)
    except AttributeError:
        return False
    return callable(on_npu) and bool(on_npu())
