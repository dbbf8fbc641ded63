"""Two NPU-platform conditions of sglang's ModelSlim path, given to the CPU servers.

Usage (``sitecustomize.py`` arranges it)::

    install()

A ModelSlim folder served with ``--quantization modelslim`` (the user's launch) stops, or
silently loads wrong, off an Ascend machine for two reasons that are about the platform, not
about the checkpoint; sglang's own code runs in both cases:

1. ``ModelSlimConfig.get_supported_act_dtypes()`` lists int8, float16 and bfloat16, and the
   loader refuses any other model dtype (``model_loader/loader.py``). The servers run float32
   (sglang's bfloat16 attention is wrong under Triton's interpreter), so float32 is added to
   the answer. The ModelSlim W8A8_DYNAMIC scheme builds its scales in the model dtype and the
   CPU stand-in kernels take float32 (``e2e_shim_npu_ops.py``).
2. ``_get_quantization_config`` adds the nested packed-module mapping
   ``{"model": {"qkv_proj": [...], "gate_up_proj": [...], ...}}`` that
   ``ModelSlimConfig.get_quant_method`` reads (``modelslim.py``) only ``if _is_npu``. Without
   it the fused ``qkv_proj`` / ``gate_up_proj`` find no scheme, get the unquantized method and
   load the raw int8 codes as weights. For a ModelSlim load the function is run with the
   loader module's ``_is_npu`` set for the duration of the call, so sglang's own NPU branch adds
   its own mapping (the branch's other effect, skipping the CUDA capability check, asks nothing
   of a CPU); every other load runs as it does here.

Each announces its first use; the harness requires both lines of every server given
``--quantization modelslim`` (for the target or the draft).
"""

from __future__ import annotations

import functools

import torch
from e2e_shim_hooks import after_import, say

MODELSLIM = "sglang.srt.layers.quantization.modelslim.modelslim"
LOADER = "sglang.srt.model_loader.loader"
FLOAT32_LINE = "ModelSlimConfig accepts float32 for the CPU run"
MAPPING_LINE = "sglang's NPU packed-module mapping applied by _get_quantization_config"


def _accept_float32(module) -> None:
    config_class = module.ModelSlimConfig
    original = config_class.get_supported_act_dtypes.__func__
    announced: list[bool] = []

    @functools.wraps(original)
    def get_supported_act_dtypes(cls):
        dtypes = list(original(cls))
        if torch.float32 not in dtypes:
            dtypes.append(torch.float32)
        if not announced:
            announced.append(True)
            say(f"{FLOAT32_LINE} (sglang lists {[str(d) for d in original(cls)]})")
        return dtypes

    config_class.get_supported_act_dtypes = classmethod(get_supported_act_dtypes)


def _npu_packed_mapping(module) -> None:
    original = module._get_quantization_config
    announced: list[bool] = []

    @functools.wraps(original)
    def _get_quantization_config(model_config, load_config):
        if model_config.quantization != "modelslim":
            return original(model_config, load_config)  # every other load exactly as here
        was_npu = module._is_npu
        module._is_npu = True
        try:
            config = original(model_config, load_config)
        finally:
            module._is_npu = was_npu
        if not announced:
            announced.append(True)
            nested = sorted(getattr(config, "packed_modules_mapping", {}).get("model", {}))
            say(f"{MAPPING_LINE} (model: {nested})")
        return config

    module._get_quantization_config = _get_quantization_config


def install() -> None:
    after_import(MODELSLIM, _accept_float32)
    after_import(LOADER, _npu_packed_mapping)
