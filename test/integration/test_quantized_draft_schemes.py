"""A draft sglang builds WITH ModelSlim (launch forms F2 ``--quantization modelslim`` and F4
``--speculative-draft-model-quantization modelslim``) from an export of a scheme sglang 0.5.23's
``ModelSlimConfig.get_linear_scheme`` has no linear method for: it warns and builds the layer
unquantized, so the layer's codes go into a float weight (W8A16, WFP8AFP8_DYNAMIC) or stop its
loader with a shape assertion (W4A8_DYNAMIC's packed int4). The plugin decodes them as it decodes
a quantized draft's other plain linear parts (``plain_parts.plain_linears``,
``load.LoadSetting``).

sglang's real ``Qwen3_5ForCausalLMMTP`` built and loaded by its own ``DefaultModelLoader``
(``support/sglang_load.py``); the checkpoints are the real msmodelslim 26.1.0 exports bundled in
``test/fixtures/modelslim``. Expected values: ``tools/verify/independent.py``'s whole-tensor
fp32 formulas on the checkpoint's own tensors, rounded once to bf16, in sglang's stacking order.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.tools.verify.independent import independent_dequantize
from support.paths import MODELSLIM
from support.sglang_load import load_model_in_subprocess, plugin_lines

pytestmark = pytest.mark.slow

SCHEMES = {
    "q35_dense_w8a16_asym": "W8A16",
    "q35_dense_wfp8afp8_dynamic": "WFP8AFP8_DYNAMIC",
    "q35_dense_w4a8_dynamic": "W4A8_DYNAMIC",
}
#: the draft's linear layers sglang builds -> the checkpoint projections stacked into each
LAYERS = {
    "model.layers.0.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "model.layers.0.o_proj": ("self_attn.o_proj",),
    "model.layers.0.mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "model.layers.0.mlp.down_proj": ("mlp.down_proj",),
}
FORMS = {
    "F2": {"quantization": "modelslim"},
    "F4": {"quantization": None, "speculative_draft_model_quantization": "modelslim"},
}


def expected(folder: str, scheme: str) -> dict[str, torch.Tensor]:
    """Each layer's weight from the independent decode of its projections, stacked."""
    tensors: dict[str, torch.Tensor] = {}
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    with open(os.path.join(folder, "quant_model_description.json")) as handle:
        version = json.load(handle).get("version")
    out = {}
    for layer, parts in LAYERS.items():
        decoded = []
        for part in parts:
            name = f"mtp.layers.0.{part}.weight"
            weight = independent_dequantize(tensors, name, scheme, version)
            assert weight is not None, name
            decoded.append(weight.to(torch.bfloat16))
        out[layer] = torch.cat(decoded)
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("fixture", sorted(SCHEMES))
def test_the_plugin_decodes_the_layers_sglang_builds_unquantized(fixture, form, tmp_path):
    """With the plugin each of the draft's linear layers (built unquantized: no ModelSlim
    method for the scheme) holds the independent decode of its projections, bit for bit, and
    the plugin's line says it decoded them; the draft is the one sglang builds quantized."""
    folder = os.path.join(MODELSLIM, fixture)
    report, state = load_model_in_subprocess(
        folder, tmp_path, plugin=True, draft=True, **FORMS[form]
    )
    assert "refused" not in report, report.get("message")
    assert report["class"] == "Qwen3_5ForCausalLMMTP"
    for layer, want in expected(folder, SCHEMES[fixture]).items():
        assert report["layers"][layer]["method"] == "UnquantizedLinearMethod", layer
        assert torch.equal(state[f"{layer}.weight"], want), layer
    (line,) = [m for m in plugin_lines(report) if "draft from" in m]
    assert "is built quantized (modelslim)" in line
    assert f"({SCHEMES[fixture]} x7) by the plugin's ModelSlim schemes to bfloat16" in line


@pytest.mark.parametrize("fixture", sorted(SCHEMES))
def test_stock_sglang_loads_codes_or_stops_its_loader(fixture, tmp_path):
    """The baseline (plugin off), F2: W8A16 and WFP8AFP8 codes copied into the float weights;
    W4A8_DYNAMIC's packed int4 stops sglang's loader at a shape check."""
    folder = os.path.join(MODELSLIM, fixture)
    report, state = load_model_in_subprocess(folder, tmp_path, plugin=False, draft=True)
    if fixture == "q35_dense_w4a8_dynamic":
        assert report.get("refused") == "AssertionError", report
        return
    tensors = load_file(os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors"))
    codes = tensors["mtp.layers.0.self_attn.o_proj.weight"]
    assert not codes.is_floating_point() or codes.dtype == torch.float8_e4m3fn
    assert torch.equal(state["model.layers.0.o_proj.weight"], codes.to(torch.bfloat16))
