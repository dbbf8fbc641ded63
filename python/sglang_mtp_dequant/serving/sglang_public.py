"""The public sglang the package imports outside the ledger: every module, the names taken
from it and the package modules that import them.

Usage::

    from .sglang_public import PUBLIC_IMPORTS
    for entry in PUBLIC_IMPORTS: print(entry.module, entry.names, entry.used_in)

Why beside the ledger (``sglang_private.py``): an sglang upgrade reviews both, the private
names for renames and these for changed signatures; ``test/test_packaging.py`` derives the
package's sglang imports from its source and fails on one missing here or one listed that no
module imports. The hook targets (the draft classes' ``load_weights``) are in ``drafts.py``.
Importing this module imports nothing of sglang.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublicImport:
    """One sglang module the package imports: ``names`` taken from it (none: the module
    itself is imported), ``used_in`` the importing modules (paths under the package)."""

    module: str
    names: tuple[str, ...]
    used_in: tuple[str, ...]
    why: str


PUBLIC_IMPORTS: tuple[PublicImport, ...] = (
    PublicImport(
        module="sglang",
        names=(),
        used_in=("tools/activation.py",),
        why="where sglang is installed, for the activation report",
    ),
    PublicImport(
        module="sglang.srt.plugins",
        names=("GENERAL_PLUGINS_GROUP", "load_plugins", "load_plugins_by_group"),
        used_in=("serving/ray_setup.py", "tools/activation.py", "tools/verify/run.py"),
        why="sglang's plugin loader: load the plugin in Ray actors and the CLI, ask which "
        "plugins would load",
    ),
    PublicImport(
        module="sglang.srt.plugins.hook_registry",
        names=("HookRegistry", "HookType"),
        used_in=("serving/plugin.py", "serving/ray_setup.py"),
        why="the documented plugin API the hooks are registered with",
    ),
    PublicImport(
        module="sglang.srt.layers.moe.fused_moe_triton",
        names=("FusedMoE",),
        used_in=("serving/float_layers.py",),
        why="which layer ModelSlimConfig.get_quant_method is asked about is a routed-expert "
        "layer, and its global expert count",
    ),
    PublicImport(
        module="sglang.srt.layers.layernorm",
        names=("RMSNorm",),
        used_in=("tools/target_check.py",),
        why="restored after the target check: ModelSlimConfig patches it for the process when "
        "a description lists a norm.bias",
    ),
    PublicImport(
        module="sglang.srt.layers.linear",
        names=("LinearBase",),
        used_in=("serving/plain_parts.py", "serving/target_layers.py"),
        why="the base of every linear layer whose quantization method sglang chose; its "
        "constructor's prefix, recorded while sglang builds a model (target_layers."
        "recorded_prefixes), names each layer as its description entries are looked up",
    ),
    PublicImport(
        module="sglang.srt.layers.quantization.unquant",
        names=("UnquantizedLinearMethod",),
        used_in=("serving/target_layers.py",),
        why="the method a linear layer gets when no quantization scheme takes it",
    ),
    PublicImport(
        module="sglang.srt.environ",
        names=("envs",),
        used_in=("tools/activation.py",),
        why="SGLANG_PLUGINS as sglang itself reads it",
    ),
    PublicImport(
        module="sglang.srt.eplb.expert_location",
        names=("get_global_expert_location_metadata",),
        used_in=("serving/ownership.py",),
        why="the expert placement metadata (EPLB), read before trusting a layer's expert map",
    ),
    PublicImport(
        module="sglang.srt.model_loader.weight_utils",
        names=("default_weight_loader", "download_weights_from_hf"),
        used_in=("serving/guard/writes.py", "serving/sources.py"),
        why="the loader of parameters without their own, and hub downloads as sglang does them",
    ),
    PublicImport(
        module="sglang.srt.model_loader.loader",
        names=("DefaultModelLoader",),
        used_in=("serving/sources.py", "tools/cpu_sglang.py"),
        why="sglang's weight file resolution (offline) and the CPU tools' weight iterators",
    ),
    PublicImport(
        module="sglang.srt.model_loader.loader",
        names=(),
        used_in=("tools/resolve.py",),
        why="whether sglang's loader imports here, before resolving through it",
    ),
    PublicImport(
        module="sglang.srt.configs.load_config",
        names=("LoadConfig",),
        used_in=("serving/sources.py", "tools/cpu_sglang.py", "tools/target_check.py"),
        why="the load config DefaultModelLoader is built with",
    ),
    PublicImport(
        module="sglang.srt.configs.model_config",
        names=("ModelConfig",),
        used_in=("tools/cpu_sglang.py", "tools/target_check.py"),
        why="the draft's (and the target's) model config, for building it on the CPU",
    ),
    PublicImport(
        module="sglang.srt.model_loader.utils",
        names=("set_default_torch_dtype",),
        used_in=("tools/cpu_sglang.py", "tools/target_check.py"),
        why="the dtype context sglang builds a model under",
    ),
    PublicImport(
        module="sglang.srt.distributed",
        names=("parallel_state",),
        used_in=("tools/cpu_sglang.py",),
        why="the CPU tools' single-process parallel world",
    ),
    PublicImport(
        module="sglang.srt.server_args",
        names=("ServerArgs",),
        used_in=("tools/cpu_sglang.py", "tools/launch.py"),
        why="sglang's launch flag parser (the CLI's launch flags) and the ServerArgs the CPU "
        "tools publish",
    ),
)
