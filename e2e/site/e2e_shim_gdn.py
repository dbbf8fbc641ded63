"""Environment fixes that let sglang's own Gated DeltaNet Triton kernels run under the interpreter.

Usage (``sitecustomize.py`` arranges it)::

    install()

Off ``SGLANG_USE_CPU_ENGINE`` sglang serves a hybrid Qwen3.5's linear-attention layers with its
own Triton kernels (causal conv1d, gating, the FLA chunk and recurrent gated delta rule, the
gated RMSNorm, the mamba state scatter of EAGLE). Under ``TRITON_INTERPRET=1`` in float32 they
compute on the CPU once the checks and device lookups below stop stopping them; none changes
what a kernel computes (``FIXES`` says what each does and why). Where a check must go, the
function is recompiled from its own source with exactly that text changed (``recompile``), so
every other line of sglang runs as shipped; a source that does not hold the text raises.

Each fix logs its line the first time it acts; the harness requires the lines of the fixes a
hybrid server needs (``e2e/checks.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from types import ModuleType

from e2e_shim_hooks import after_import, announce_first_call, say

FLA = "sglang.kernels.ops.attention.fla"
CHUNK = f"{FLA}.chunk"
FLA_UTILS = f"{FLA}.utils"
FLA_OP = f"{FLA}.op"
LAYERNORM_GATED = f"{FLA}.layernorm_gated"
COMMON = "sglang.srt.utils.common"
AUTOTUNER = "triton.runtime.autotuner"
MAMBA_SCATTER = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"
SCATTER_FUNCTIONS = ("fused_mamba_state_scatter_with_mask", "fused_conv_window_scatter_with_mask")

#: fix -> what it does and why (the log line says the same)
FIXES = {
    "float32-chunk": (
        f"{CHUNK}.chunk_gated_delta_rule asserts its inputs are not float32 (a GPU speed "
        "guard; bfloat16 is wrong under the interpreter): recompiled without that assert"
    ),
    "fla-device-ctx": (
        f"{FLA_UTILS}.custom_device_ctx selects the tensor's device with torch.cpu.device, "
        "which does not exist: a CPU tensor gets a null context (a CPU has one device)"
    ),
    "device-context": (
        f"{COMMON}.device_context uses torch.device('cpu') only with SGLANG_USE_CPU_ENGINE and "
        "otherwise torch.cpu.device: a CPU device gets sglang's own CPU branch"
    ),
    "autotune-one-config": (
        f"{AUTOTUNER}.Autotuner benchmarks its configs on the active GPU driver, which the "
        "interpreter has not: an autotuned kernel keeps its first config"
    ),
    "fla-op-aliases": (
        f"{FLA_OP} binds exp/exp2/log/log2 to tl builtins, which the interpreter does not "
        "accept as module-level aliases: each becomes a @triton.jit function calling the builtin"
    ),
    "sm-count": (
        f"{LAYERNORM_GATED}._get_sm_count asks CUDA for its multiprocessor count: a CPU "
        "device answers 1 (the interpreter runs one program at a time; rows per block only)"
    ),
    "scatter-device-check": (
        f"{MAMBA_SCATTER}.{'/'.join(SCATTER_FUNCTIONS)} accept CUDA/XPU tensors only: "
        "recompiled with CPU tensors accepted too"
    ),
}


def announce_fix(owner, name: str, fix: str) -> None:
    """``owner.name``'s first call logs that ``fix`` acted."""
    announce_first_call(owner, name, f"gdn fix {fix}: {FIXES[fix]}")


def recompile(module: ModuleType, function: str, old: str, new: str) -> None:
    """Redefine ``module.function`` from its own source with ``old`` (which must occur exactly
    once in it) replaced by ``new``; decorators, globals and line numbers stay sglang's."""
    lines, first = inspect.getsourcelines(getattr(module, function))
    source = "".join(lines)
    if source.count(old) != 1:
        raise RuntimeError(
            f"e2e shim: {module.__name__}.{function} holds {source.count(old)} copies of "
            f"{old!r}, not 1: this sglang is not the one the GDN shim was made for"
        )
    source = source.replace(old, new + "\n" * old.count("\n"))
    code = compile("\n" * (first - 1) + source, module.__file__, "exec")
    exec(code, vars(module))  # noqa: S102 - sglang's own source with one check changed


CHUNK_ASSERT = """assert q.dtype != torch.float32, (
        "ChunkGatedDeltaRuleFunction does not support float32. Please use bfloat16."
    )"""


def _float32_chunk(module: ModuleType) -> None:
    recompile(module, "chunk_gated_delta_rule", CHUNK_ASSERT, "pass")
    announce_fix(module, "chunk_gated_delta_rule", "float32-chunk")


def _null_context_on_cpu(module: ModuleType) -> None:
    original = module.custom_device_ctx
    announced: list[bool] = []

    @functools.wraps(original)
    def custom_device_ctx(index):
        if hasattr(module.device_torch_lib, "device"):
            return original(index)
        if not announced:
            announced.append(True)
            say(f"gdn fix fla-device-ctx: {FIXES['fla-device-ctx']}")
        return contextlib.nullcontext()

    module.custom_device_ctx = custom_device_ctx


def _cpu_device_context(module: ModuleType) -> None:
    original = module.device_context
    announced: list[bool] = []
    import torch

    @contextlib.contextmanager
    def device_context(device):
        if device.type != "cpu":
            with original(device):
                yield
            return
        if not announced:
            announced.append(True)
            say(f"gdn fix device-context: {FIXES['device-context']}")
        with torch.device("cpu"):
            yield

    module.device_context = device_context


def _first_config_only(module: ModuleType) -> None:
    autotuner = module.Autotuner
    init, run = autotuner.__init__, autotuner.run
    announced: list[bool] = []

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._e2e_configs_dropped = len(self.configs) - 1
        self.configs = self.configs[:1]

    @functools.wraps(run)
    def run_first(self, *args, **kwargs):
        if getattr(self, "_e2e_configs_dropped", 0) and not announced:
            announced.append(True)
            say(f"gdn fix autotune-one-config: {FIXES['autotune-one-config']}")
        return run(self, *args, **kwargs)

    autotuner.__init__ = __init__
    autotuner.run = run_first


def _jit_aliases(module: ModuleType) -> None:
    """Applied when ``op.py`` imports (a jitted kernel cannot log its first call)."""
    if os.environ.get("FLA_USE_FAST_OPS", "0") == "1":
        return  # op.py's libdevice branch: not what the shim was made for, left to fail
    import e2e_shim_fla_ops

    for name in e2e_shim_fla_ops.ALIASES:
        setattr(module, name, getattr(e2e_shim_fla_ops, name))
    say(f"gdn fix fla-op-aliases: {FIXES['fla-op-aliases']}")


def _sm_count_on_cpu(module: ModuleType) -> None:
    original = module._get_sm_count
    announced: list[bool] = []

    def _get_sm_count(device):
        if device.type != "cpu":
            return original(device)
        if not announced:
            announced.append(True)
            say(f"gdn fix sm-count: {FIXES['sm-count']}")
        return 1

    module._get_sm_count = _get_sm_count


SCATTER_CHECK = "not (dst.is_cuda or dst.is_xpu)"
SCATTER_CHECK_WITH_CPU = "not (dst.is_cuda or dst.is_xpu or dst.is_cpu)"


def _scatter_on_cpu(module: ModuleType) -> None:
    for function in SCATTER_FUNCTIONS:
        recompile(module, function, SCATTER_CHECK, SCATTER_CHECK_WITH_CPU)
        announce_fix(module, function, "scatter-device-check")


def install() -> None:
    after_import(CHUNK, _float32_chunk)
    after_import(FLA_UTILS, _null_context_on_cpu)
    after_import(COMMON, _cpu_device_context)
    after_import(AUTOTUNER, _first_config_only)
    after_import(FLA_OP, _jit_aliases)
    after_import(LAYERNORM_GATED, _sm_count_on_cpu)
    after_import(MAMBA_SCATTER, _scatter_on_cpu)
