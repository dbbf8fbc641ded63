"""CPU environment shims for sglang's server processes in ``make e2e`` (and nothing else).

The end-to-end harness (``e2e/run.py``) puts this folder first on
``PYTHONPATH`` of the servers it starts, so Python runs this file at start-up in the launcher
and in every process sglang spawns (scheduler, tokenizer, detokenizer). It is never on the
path of anything else, and never part of the plugin. Each shim covers what a CPU-only machine
lacks; none replaces sglang's own attention, linear, sampling or acceptance code (5 supplies two
Ascend kernels sglang calls, computing what they compute):

1. torchvision: PyPI's wheel is a CUDA build whose import fails beside CPU torch; only then
   its two operator schemas are defined (``sglang_mtp_dequant.tools.cpu_env``).
2. ``vllm._custom_ops``: off CUDA, ``RotaryEmbedding.__init__`` imports its rotary kernel,
   which the CPU forward never calls; a placeholder that raises if called is installed.
3. Speculative tree dispatch: on a platform sglang does not recognise,
   ``sglang/kernels/ops/speculative/spec_tree.py`` sends tree building to a CUDA kernel that
   is not there (``NameError``) and its greedy verification falls through to a SILENT NO-OP.
   Setting that module's ``_is_xpu`` routes both to sglang's own Triton implementations (its
   XPU branch), which Triton's interpreter runs on the CPU. The first call of each Triton
   implementation prints a line the harness requires in every speculative server's log, so
   a shim that did not take effect fails the run instead of passing silently.
4. MoE observation (no routing, no compute): on this platform sglang's FusedMoE layer runs
   its unquantized experts through ``sglang.srt.layers.moe.fused_moe_native.
   moe_forward_native`` (its own choice: ``UnquantizedFusedMoEMethod.forward_native``, the
   Triton runner being CUDA-only). Its first call for each MoE layer prints a line naming the
   layer (``model.layers.N.mlp.experts`` of the target, ``mtp.layers.0.mlp.experts`` of the
   MTP draft), which the harness requires of the MoE family, so a MoE run shows that the
   draft's routed experts ran. The call itself is passed through unchanged.
5. The Ascend kernels of sglang's ModelSlim W8A8_DYNAMIC linear method
   (``torch.ops.npu.npu_dynamic_quant`` / ``npu_quant_matmul``), registered for the CPU with
   ``torch.library`` (``e2e_shim_npu_ops.py``), so a ModelSlim folder can be the target.
6. Two NPU-platform conditions of sglang's ModelSlim path (``e2e_shim_modelslim.py``): float32
   accepted by ``ModelSlimConfig``, and ``_get_quantization_config`` run with the loader's
   ``_is_npu`` set, so sglang's own NPU packed-module mapping applies.
7. The Gated DeltaNet kernels' platform checks under the interpreter (``e2e_shim_gdn.py``).
8. Only for the feature branch's run (``E2E_DRAFT_NPU_CHECK=1``): the Qwen3.5 MTP module's
   ``is_npu`` answers True, as on the NPU step 01 launches on (``e2e_shim_npu_check.py``).
9. Only for the KV-token benchmark (``E2E_DEVICE_BYTES``): sglang's free-memory reading on the
   CPU is that of a device the process owns alone (``e2e_shim_device_memory.py``).

Each of 5-9 announces its first use (``e2e_shim_hooks.say``) and the harness requires the
lines of every server that needs it (``e2e/checks.py``).
"""

from __future__ import annotations

import functools
import sys

import e2e_shim_device_memory
import e2e_shim_gdn
import e2e_shim_modelslim
import e2e_shim_npu_check
import e2e_shim_npu_ops
from e2e_shim_hooks import after_import, say

SPEC_TREE = "sglang.kernels.ops.speculative.spec_tree"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
#: the Triton implementations the XPU branch calls, each announced on its first call
TRITON_TREE_FUNCTIONS = ("sgl_build_tree_kernel_triton", "verify_tree_greedy_triton")
MOE_NATIVE = "sglang.srt.layers.moe.fused_moe_native"
MOE_FUNCTION = "moe_forward_native"


def _announce_first_call(module, name: str) -> None:
    original = getattr(module, name)
    called = []

    @functools.wraps(original)
    def announced(*args, **kwargs):
        if not called:
            called.append(True)
            say(f"{module.__name__}.{name} ran")
        return original(*args, **kwargs)

    setattr(module, name, announced)


def _announce_first_call_per_layer(module, name: str) -> None:
    """``module.name(layer, ...)`` announced on its first call for each ``layer.layer_name``."""
    original = getattr(module, name)
    seen = set()

    @functools.wraps(original)
    def announced(layer, *args, **kwargs):
        layer_name = getattr(layer, "layer_name", "?")
        if layer_name not in seen:
            seen.add(layer_name)
            say(f"{module.__name__}.{name} ran for {layer_name}")
        return original(layer, *args, **kwargs)

    setattr(module, name, announced)


def _route_spec_tree(module) -> None:
    """The module holding sglang's XPU branch and its Triton tree functions: ``spec_tree``
    (sglang 0.5.23), or ``eagle_utils`` itself (0.5.17 to 0.5.22)."""
    if not hasattr(module, TRITON_TREE_FUNCTIONS[0]):
        return  # the branch is in the other module of this release
    module._is_xpu = True
    for name in TRITON_TREE_FUNCTIONS:
        _announce_first_call(module, name)
    say(f"{module.__name__} routed to sglang's Triton tree kernels (_is_xpu = True)")


def _observe_moe(module) -> None:
    _announce_first_call_per_layer(module, MOE_FUNCTION)


def _install() -> None:
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable, vllm_placeholder

    ensure_torchvision_importable()
    sys.modules.update(vllm_placeholder())
    after_import(SPEC_TREE, _route_spec_tree)
    after_import(EAGLE_UTILS, _route_spec_tree)
    after_import(MOE_NATIVE, _observe_moe)
    e2e_shim_npu_ops.install()
    e2e_shim_modelslim.install()
    e2e_shim_gdn.install()
    e2e_shim_npu_check.install()
    e2e_shim_device_memory.install()


_install()
