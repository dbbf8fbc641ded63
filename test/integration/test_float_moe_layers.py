"""MoE layers a ModelSlim description marks FLOAT, in a draft sglang builds quantized
(``serving/float_layers.py``), on sglang 0.5.23's real ``Qwen3_5ForCausalLMMTP`` built and
loaded by its own ``DefaultModelLoader`` under ``ModelSlimConfig``, as under
``--quantization modelslim --speculative-draft-model-quantization modelslim`` (forms F2 / F4).

The checkpoint: ``test/fixtures/e2e/moe_float_experts`` (its RECIPE.md): the MTP layer's
routed experts, shared expert and ``fc`` FLOAT, its attention W8A8_DYNAMIC. Each load runs in
a fresh interpreter (the plugin's hooks are process-wide) with the servers' ``site/`` shims,
which give the CPU what an Ascend machine gives sglang's ModelSlim path: sglang's own NPU
packed-module mapping applied by ``_get_quantization_config``, float32 accepted by
``ModelSlimConfig``, and the two Ascend kernels of the W8A8_DYNAMIC linear method on their CPU
stand-ins (checked in ``test/e2e/test_e2e_shims.py``; nothing here runs them: only the build
and the load are tested). The plugin is registered with sglang's own ``HookRegistry``, or not
(stock sglang, the baseline: it stops at ``get_moe_scheme``). Expected float values are read
from the checkpoint's safetensors here, independently of sglang's loaders.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from support.paths import E2E, ROOT
from support.sglang_load import run_load_script

FLOAT_EXPERTS = os.path.join(E2E, "moe_float_experts")
W8A8 = os.path.join(E2E, "moe_w8a8")
SHARD = "quant_model_weights-00001-of-00001.safetensors"
EXPERTS = "mtp.layers.0.mlp.experts"
STOCK_ERROR = (
    "Unsupported ModelSlim MoE schemes for layer mtp.layers.0.mlp.experts: W13='FLOAT', W2='FLOAT'"
)

BUILD = """
    import json, logging, sys, torch
    from sglang_mtp_dequant.tools import cpu_sglang
    from sglang_mtp_dequant.serving import plugin, sglang_private
    from sglang_mtp_dequant.tools.cpu_env import generic_rope_on_cpu, placeholder_vllm_rotary

    FOLDER, PLUGIN = {folder!r}, {plugin!r}
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.name.startswith("sglang_mtp_dequant"):
                records.append([record.levelname, record.getMessage()])
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.INFO)
    cpu_sglang.prepare_cpu_process(
        FOLDER, quantization="modelslim", dtype="float32",
        speculative_draft_model_quantization="modelslim",
    )
    if PLUGIN:
        from sglang.srt.plugins.hook_registry import HookRegistry
        plugin.register()
        HookRegistry.apply_hooks()
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    args = sglang_private.published_server_args()
    config = ModelConfig.from_server_args(args, model_path=FOLDER, is_draft_model=True)
    loader = DefaultModelLoader(LoadConfig(load_format="auto"))
    try:
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            model = loader.load_model(model_config=config, device_config=DeviceConfig("cpu"))
    except Exception as exc:
        print(json.dumps({{"refused": type(exc).__name__, "message": str(exc),
                          "records": records}}))
        sys.exit(0)
    layers = {{}}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        layers[name] = {{
            "method": type(method).__name__,
            "scheme": type(getattr(module, "scheme", None)).__name__,
            "params": {{
                n: [str(p.dtype), list(p.shape)]
                for n, p in module.named_parameters(recurse=False)
            }},
        }}
    torch.save(dict(model.state_dict()), {state!r})
    print(json.dumps({{"draft": type(model).__name__, "quantization": config.quantization,
                      "layers": layers, "records": records}}))
"""


def build_draft(folder: str, plugin: bool, tmp_path) -> tuple[dict, dict]:
    """(report, state dict) of the draft sglang builds and loads from ``folder`` (F2/F4)."""
    state = str(tmp_path / f"state-{plugin}.pt")
    return run_load_script(BUILD.format(folder=folder, plugin=plugin, state=state), state)


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, torch.Tensor]:
    return load_file(os.path.join(FLOAT_EXPERTS, SHARD))


def test_stock_sglang_stops_at_the_float_mtp_experts(tmp_path):
    """The baseline (plugin off): sglang 0.5.23's own start-up error, sglang #34211."""
    report, _ = build_draft(FLOAT_EXPERTS, plugin=False, tmp_path=tmp_path)
    assert report.get("refused") == "ValueError", report
    assert report["message"] == STOCK_ERROR


def test_float_experts_built_unquantized_loaded_float_quantized_layers_kept(tmp_path, checkpoint):
    """With the plugin: the FLOAT routed experts get sglang's unquantized MoE method and exactly
    the checkpoint's float values; the FLOAT shared expert and fc are unquantized (sglang's own
    rule) and exact; the W8A8_DYNAMIC attention keeps ModelSlim's quantized method and codes."""
    report, state = build_draft(FLOAT_EXPERTS, plugin=True, tmp_path=tmp_path)
    assert "refused" not in report, report["message"] if "refused" in report else ""
    assert report["quantization"] == "modelslim"
    layers = report["layers"]
    assert layers["model.layers.0.mlp.experts"]["method"] == "UnquantizedFusedMoEMethod"
    for name in ("shared_expert.gate_up_proj", "shared_expert.down_proj"):
        assert layers[f"model.layers.0.mlp.{name}"]["method"] == "UnquantizedLinearMethod"
    for name in ("qkv_proj", "o_proj"):
        layer = layers[f"model.layers.0.{name}"]
        assert (layer["method"], layer["scheme"]) == ("ModelSlimLinearMethod", "ModelSlimW8A8Int8")
        assert layer["params"]["weight"][0] == "torch.int8"

    def exact(got: torch.Tensor, *names: str) -> None:
        want = torch.cat([checkpoint[n].to(got.dtype) for n in names])
        assert got.dtype == torch.float32
        assert torch.equal(got, want), names

    for e in range(8):
        base = f"{EXPERTS}.{e}"
        exact(
            state["model.layers.0.mlp.experts.w13_weight"][e],
            f"{base}.gate_proj.weight",
            f"{base}.up_proj.weight",
        )
        exact(state["model.layers.0.mlp.experts.w2_weight"][e], f"{base}.down_proj.weight")
    shared = "mtp.layers.0.mlp.shared_expert"
    exact(
        state["model.layers.0.mlp.shared_expert.gate_up_proj.weight"],
        f"{shared}.gate_proj.weight",
        f"{shared}.up_proj.weight",
    )
    exact(state["model.layers.0.mlp.shared_expert.down_proj.weight"], f"{shared}.down_proj.weight")
    exact(state["fc.weight"], "mtp.fc.weight")
    codes = [checkpoint[f"mtp.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    qkv = state["model.layers.0.qkv_proj.weight"]
    qkv = qkv if qkv.shape[0] == sum(c.shape[0] for c in codes) else qkv.t()
    assert torch.equal(qkv, torch.cat(codes))  # the int8 codes, as ModelSlim's method holds them
    said = [m for _, m in report["records"] if "FLOAT" in m and EXPERTS in m]
    assert len(said) == 1 and "unquantized MoE method" in said[0]
    assert not [r for r in report["records"] if r[0] == "WARNING"], report["records"]


def test_part_float_experts_refused_naming_the_layer_and_the_launch(tmp_path):
    """Experts 0-2 FLOAT, expert 3 W8A8_DYNAMIC: no ModelSlim method builds both right; the
    start-up stops before any weight is read, naming the layer and the form that serves it."""
    folder = str(tmp_path / "part_float")
    shutil.copytree(FLOAT_EXPERTS, folder)
    path = os.path.join(folder, "quant_model_description.json")
    with open(path, encoding="utf-8") as handle:
        description = json.load(handle)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        description[f"{EXPERTS}.3.{proj}.weight"] = "W8A8_DYNAMIC"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(description, handle)
    report, _ = build_draft(folder, plugin=True, tmp_path=tmp_path)
    assert report.get("refused") == "MixedPrecisionLayerError", report
    message = report["message"]
    assert f"MoE layer {EXPERTS}:" in message
    assert f"{EXPERTS}.3.gate_proj.weight" in message  # the quantized example named
    assert "--speculative-draft-model-quantization unquant" in message


def test_quantized_experts_left_exactly_to_sglang(tmp_path):
    """A description whose MTP experts are quantized (``moe_w8a8``): the draft sglang builds
    with the plugin has every layer's method and parameter dtypes and shapes of stock's, and the
    hook says nothing."""
    stock, _ = build_draft(W8A8, plugin=False, tmp_path=tmp_path)
    hooked, _ = build_draft(W8A8, plugin=True, tmp_path=tmp_path)
    assert "refused" not in stock and "refused" not in hooked
    assert hooked["layers"] == stock["layers"]
    assert hooked["layers"]["model.layers.0.mlp.experts"]["method"] == "ModelSlimFusedMoEMethod"
    assert not [m for _, m in hooked["records"] if "FLOAT" in m]
    assert not [r for r in hooked["records"] if r[0] == "WARNING"], hooked["records"]


# -- a NextN draft: GLM-5's layer the shipped recipe leaves FLOAT -------------------------------

NEXTN_FLOAT = os.path.join(ROOT, "test", "fixtures", "modelslim", "glm5_w8a8_nextn_float")
NEXTN = "model.layers.2"


def test_a_float_nextn_layer_built_as_model_decoder_is_found_under_its_checkpoint_name(tmp_path):
    """GLM-5's NextN draft built under ModelSlim (F2 / F4) off the NPU's one-folder naming: sglang
    builds its layer as ``model.decoder`` and its loader maps the checkpoint's
    ``model.layers.2`` there. Stock looks the experts up under ``model.decoder`` and stops; the
    hook reads them under the checkpoint's name, all FLOAT, and builds them unquantized, every
    value loaded exactly as stored (the export: ``_gen/nextn_float.py``)."""
    stock, _ = build_draft(NEXTN_FLOAT, plugin=False, tmp_path=tmp_path)
    assert stock.get("refused") == "ValueError", stock
    assert stock["message"].startswith(
        "Missing ModelSlim MoE quantization description for layer model.decoder.mlp.experts"
    )
    report, state = build_draft(NEXTN_FLOAT, plugin=True, tmp_path=tmp_path)
    assert report.get("draft") == "GlmMoeDsaForCausalLMNextN", report
    assert report["layers"]["model.decoder.mlp.experts"]["method"] == "UnquantizedFusedMoEMethod"
    said = [m for level, m in report["records"] if level == "INFO" and "FLOAT" in m]
    assert said == [
        f"sglang-mtp-dequant: quant_model_description.json marks every expert of {NEXTN}."
        "mlp.experts FLOAT (12 projections); built with sglang's unquantized MoE method and "
        "loaded as stored (sglang 0.5.23's ModelSlim has no FLOAT MoE scheme)"
    ]
    stored = load_file(os.path.join(NEXTN_FLOAT, SHARD))
    for e in range(4):
        base = f"{NEXTN}.mlp.experts.{e}"
        w13 = state["model.decoder.mlp.experts.w13_weight"][e]
        want = torch.cat([stored[f"{base}.{p}_proj.weight"] for p in ("gate", "up")])
        assert torch.equal(w13, want.to(w13.dtype)), base
        w2 = state["model.decoder.mlp.experts.w2_weight"][e]
        assert torch.equal(w2, stored[f"{base}.down_proj.weight"].to(w2.dtype)), base
