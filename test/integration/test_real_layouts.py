"""GLM-5 and DeepSeek-V3 MTP layers as msmodelslim 26.1.0 writes them, through sglang's own classes.

The fixtures (``fixtures/modelslim/<name>/``, each with its RECIPE.md) are the real msmodelslim
CLI's output on tiny models, the draft being the MTP layer ``model.layers.<num_hidden_layers>``:

- ``glm5_w8a8_mtp``: the shipped ``glm_5_w8a8.yaml`` unchanged: QuaRot (``rot.safetensors``),
  static W8A8 MLA attention with a non-zero input offset, the DSA indexer's ``wq_b`` static W8A8
  (``wk``, ``weights_proj``, ``k_norm`` float), W8A8_DYNAMIC experts, float32 norms;
- ``deepseek_v3_w8a8_dynamic_mix_mtp``: W8A8_DYNAMIC "mix MTP": ``eh_proj`` quantized,
  ``kv_b_proj`` and ``shared_head.head`` float;
- ``deepseek_v31_w4a4_mxfp4_mtp``: the shipped DeepSeek-V3.1 "w4a4c8" recipe minus its FA3 step:
  W4A4_MXFP4 experts, W8A8_MXFP8 attention.

Each draft is built by sglang 0.5.23 on the CPU and loaded from the fixture folder through the
stream of sglang's ``DefaultModelLoader``. With the plugin every parameter must equal bf16 of the
fp32 formula (``support.reference``: ``dequantize_fp32``, ``dequantize_mx_f32``) bit for bit, and
float parameters the checkpoint's tensor in the parameter's dtype. Stock sglang (the hook
bypassed) is shown doing what it really does.

A CPU-only accommodation, in ``_sglang_config``: sglang's CPU rotary embedding
(``layers/rotary_embedding/factory.py`` ``get_rope_cpu``) asserts ``rope_scaling is not None``
and supports only ``deepseek_yarn``, which GLM-5's default rope is not. The class is built from a
config whose rope is a yarn of factor 1 instead; no parameter depends on it. The draft worker's own
route, sglang's ``ModelConfig`` from the folder, is tested as it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from support.paths import fixture_dir, reference_file
from support.reference import dequantize_fp32, dequantize_mx_f32, description, load_all

MODELS = "sglang.srt.models"
#: the target model published in sglang's context: any model sglang resolves on the CPU
TARGET = fixture_dir("q35_dense_w8a8_dynamic")
GLM5, DSV3, MX = "glm5_w8a8_mtp", "deepseek_v3_w8a8_dynamic_mix_mtp", "deepseek_v31_w4a4_mxfp4_mtp"
DRAFT = "model.layers.2."  # num_hidden_layers is 2 in every fixture


@dataclass(frozen=True)
class Layout:
    class_path: str
    draft_types: dict[str, int]  # description type -> number of draft weights of that type


NEXTN = f"{MODELS}.deepseek_nextn.DeepseekV3ForCausalLMNextN"
LAYOUTS = {
    GLM5: Layout(
        f"{MODELS}.glm4_moe.GlmMoeDsaForCausalLMNextN",
        {"FLOAT": 15, "W8A8": 5, "W8A8_DYNAMIC": 15},
    ),
    DSV3: Layout(NEXTN, {"FLOAT": 11, "W8A8_DYNAMIC": 20}),
    MX: Layout(NEXTN, {"FLOAT": 12, "W4A4_MXFP4": 15, "W8A8_MXFP8": 4}),
}
#: the draft parameters sglang's NextN loader does not read from the checkpoint: its EAGLE worker
#: sets them from the target (``set_embed_and_head``) right after the load
SHARED = {"model.embed_tokens.weight", "lm_head.weight"}
#: GLM-5's float draft tensors QuaRot leaves as the source holds them (the others are rotated, or
#: norms fused into the next linear and written as ones)
GLM5_UNROTATED = {
    f"{DRAFT}{k}"
    for k in ("mlp.gate.e_score_correction_bias", "self_attn.indexer.k_norm.bias",
              "self_attn.indexer.k_norm.weight")
}  # fmt: skip


def _sglang_config(folder: str):
    """The draft's config as sglang reads config.json, with the CPU rope accommodation."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    config = get_config(folder, trust_remote_code=False)
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") == "default" and getattr(config, "index_topk", None) is not None:
        config.rope_parameters = {
            "rope_type": "yarn", "rope_theta": rope["rope_theta"], "factor": 1.0,
            "original_max_position_embeddings": config.max_position_embeddings,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        }  # fmt: skip
    return config


def _build_and_load(name: str, *, plugin: bool, nan: bool = False) -> dict[str, torch.Tensor]:
    """sglang's draft class for the fixture, built on the CPU and loaded through its (hooked)
    load_weights from DefaultModelLoader's stream of the folder; ``plugin=False`` is stock sglang
    (the hook bypassed: GLM-5's own load_weights reaches the hook through super())."""
    from sglang_mtp_dequant.serving.plugin import bypassed
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from support.cpu_sglang import build_draft_class, path_weights

    folder = fixture_dir(name)
    publish_context(TARGET, draft_path=folder)  # the hook plans from the draft path
    model = build_draft_class(LAYOUTS[name].class_path, _sglang_config(folder))
    if nan:
        with torch.no_grad():
            for param in model.parameters():
                if param.is_floating_point():
                    param.fill_(float("nan"))
    if plugin:
        model.load_weights(path_weights(folder))
    else:
        with bypassed():
            model.load_weights(path_weights(folder))
    return {n: p.detach() for n, p in model.named_parameters()}


def _checkpoint(name: str) -> tuple[dict[str, torch.Tensor], dict]:
    folder = fixture_dir(name)
    return load_all(folder), description(folder)


def _draft_code_weights(name: str) -> list[str]:
    """The draft's weights the description calls quantized (what the plugin decodes)."""
    _, desc = _checkpoint(name)
    return [k for k in desc if k.startswith(DRAFT) and k.endswith(".weight") and desc[k] != "FLOAT"]


def _sources(param: str) -> list[str]:
    """Checkpoint tensors stacked into a DeepSeek-NextN parameter (TP=1), routed experts aside."""
    p = DRAFT.rstrip(".")
    if param == "model.embed_tokens.weight":
        return [f"{p}.embed_tokens.weight"]
    if param == "lm_head.weight":
        return [f"{p}.shared_head.head.weight"]
    if not param.startswith("model.decoder."):
        return [f"{p}.{param[len('model.') :]}"]  # enorm, hnorm, eh_proj, shared_head.norm
    rest = param[len("model.decoder.") :]
    if rest.endswith("fused_qkv_a_proj_with_mqa.weight"):
        return [f"{p}.self_attn.q_a_proj.weight", f"{p}.self_attn.kv_a_proj_with_mqa.weight"]
    if rest.endswith("gate_up_proj.weight"):
        stem = rest[: -len("gate_up_proj.weight")]
        return [f"{p}.{stem}gate_proj.weight", f"{p}.{stem}up_proj.weight"]
    return [f"{p}.{rest}"]


def _expected(tensors: dict, desc: dict, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A FLOAT tensor as the checkpoint holds it, in the parameter's dtype; a quantized weight as
    bf16 of the fp32 ``(q - offset) * scale`` (static W8A8: ``q * deq_scale / input_scale``)."""
    if desc[name] == "FLOAT":
        return tensors[name].to(dtype)
    if desc[name] in ("W4A4_MXFP4", "W8A8_MXFP8"):
        scale = tensors[name[: -len(".weight")] + ".weight_scale"]
        return dequantize_mx_f32(tensors[name], scale).to(torch.bfloat16)
    return dequantize_fp32(tensors, name, desc[name]).to(torch.bfloat16)


def _expected_params(name: str, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    tensors, desc = _checkpoint(name)
    experts = sorted({int(m.group(1)) for k in tensors if (m := re.search(r"experts\.(\d+)\.", k))})
    want = {}
    for param, value in params.items():
        if param.endswith(("experts.w13_weight", "experts.w2_weight")):
            parts = ("gate", "up") if param.endswith("w13_weight") else ("down",)
            stacked = []
            for e in experts:
                names = [f"{DRAFT}mlp.experts.{e}.{p}_proj.weight" for p in parts]
                stacked.append(torch.cat([_expected(tensors, desc, n, value.dtype) for n in names]))
            want[param] = torch.stack(stacked)
        else:
            parts = [_expected(tensors, desc, n, value.dtype) for n in _sources(param)]
            want[param] = torch.cat(parts)
    return want


def _assert_exact(name: str, params: dict[str, torch.Tensor]) -> None:
    want = _expected_params(name, params)
    for param, value in params.items():
        if param not in SHARED:
            assert torch.equal(value, want[param]), param


# -- the fixtures are what msmodelslim wrote -----------------------------------------------------


def _check_companions(name: str, kind: str, q: torch.Tensor, draft: dict) -> None:
    base = name[: -len(".weight")]
    if kind in ("W8A8", "W8A8_DYNAMIC"):
        assert q.dtype == torch.int8, name
    if kind == "W8A8":
        companions = {f"{base}.{c}" for c in ("quant_bias", "input_scale", "input_offset")}
        assert companions | {f"{base}.deq_scale"} <= set(draft), name
        assert f"{base}.weight_scale" not in draft, name
        assert draft[f"{base}.deq_scale"].dtype == torch.float32, "a bf16 model: not the int64 form"
        assert draft[f"{base}.quant_bias"].dtype == torch.int32
        assert draft[f"{base}.input_offset"].item() != 0, "per-tensor asymmetric activations"
    if kind == "W8A8_DYNAMIC":
        assert draft[f"{base}.weight_scale"].shape == (q.shape[0], 1), name
        assert not draft[f"{base}.weight_offset"].any(), name
    if kind == "W4A4_MXFP4":  # two fp4 codes a byte, one uint8 exponent per 32 inputs
        assert q.dtype == torch.uint8, name
        assert draft[f"{base}.weight_scale"].shape == (q.shape[0], q.shape[1] * 2 // 32), name
    if kind == "W8A8_MXFP8":
        assert q.dtype == torch.float8_e4m3fn, name
        assert draft[f"{base}.weight_scale"].dtype == torch.uint8, name


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_fixture_holds_the_exporters_layout(name):
    """File names, index, description entries and global keys of the ascendv1 saver; the draft's
    weights by type, each with its scheme's companions."""
    folder = fixture_dir(name)
    tensors, desc = _checkpoint(name)
    with open(os.path.join(folder, "config.json")) as handle:
        assert json.load(handle)["num_hidden_layers"] == 2
    assert {"version", "model_quant_type", "metadata", "group_size", "optional"} <= set(desc)
    assert desc["version"] == "1.0.0"
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    with open(os.path.join(folder, "quant_model_weights.safetensors.index.json")) as handle:
        index = json.load(handle)["weight_map"]
    assert set(index) == set(tensors) and set(index.values()) == set(files)
    assert [k for k in tensors if k not in desc] == (["rot.weight"] if name == GLM5 else [])
    draft = {k: v for k, v in tensors.items() if k.startswith(DRAFT)}
    types: dict[str, int] = {}
    for k, v in draft.items():
        if k.endswith(".weight"):
            types[desc[k]] = types.get(desc[k], 0) + 1
            _check_companions(k, desc[k], v, draft)
    assert types == LAYOUTS[name].draft_types
    for float_part in ("self_attn.kv_b_proj", "shared_head.head", "embed_tokens", "mlp.gate"):
        assert desc[f"{DRAFT}{float_part}.weight"] == "FLOAT", float_part
    assert desc[f"{DRAFT}eh_proj.weight"] == ("W8A8_DYNAMIC" if name == DSV3 else "FLOAT")


def test_glm5_fixture_holds_the_dsa_indexer_rot_and_float32_norms():
    folder = fixture_dir(GLM5)
    tensors, desc = _checkpoint(GLM5)
    assert desc["is_rot_used"] is True and desc["model_quant_type"] == "W8A8"
    with open(os.path.join(folder, "quant_model_weights.safetensors.index.json")) as handle:
        assert json.load(handle)["weight_map"]["rot.weight"] == "rot.safetensors"
    with safe_open(os.path.join(folder, "rot.safetensors"), "pt") as f:
        assert list(f.keys()) == ["rot.weight"]
        assert f.get_slice("rot.weight").get_shape() == [64, 64]  # hidden x hidden
    attn = f"{DRAFT}self_attn."
    for w in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "indexer.wq_b"):
        assert desc[f"{attn}{w}.weight"] == "W8A8", w
    for w in ("indexer.wk", "indexer.weights_proj", "indexer.k_norm"):
        assert desc[f"{attn}{w}.weight"] == "FLOAT", w
    for norm in ("input_layernorm", "post_attention_layernorm", "self_attn.q_a_layernorm",
                 "self_attn.kv_a_layernorm", "self_attn.indexer.k_norm"):  # fmt: skip
        assert tensors[f"{DRAFT}{norm}.weight"].dtype == torch.float32, norm
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        assert tensors[f"{DRAFT}{norm}.weight"].dtype == torch.bfloat16, norm


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_original_float_reference_matches_the_float_draft_tensors(name):
    """The reference holds the source's MTP tensors. The export's FLOAT tensors carry those values
    (in a wider dtype at most) except where msmodelslim changed them: GLM-5's QuaRot rotates the
    linears and embeddings and fuses the norms into ones; DeepSeek's router bias is stored in the
    model dtype (the source's float32 rounded to bf16, as the remote code's MoEGate holds it)."""
    tensors, desc = _checkpoint(name)
    reference = load_file(reference_file(name))
    floats = {k for k in reference if desc.get(k) == "FLOAT"}
    changed = {k for k in floats if not torch.equal(tensors[k].float(), reference[k].float())}
    if name == GLM5:
        assert floats - changed == GLM5_UNROTATED
    else:
        assert changed == {f"{DRAFT}mlp.gate.e_score_correction_bias"}
        assert tensors[f"{DRAFT}mlp.gate.e_score_correction_bias"].dtype == torch.bfloat16


# -- with the plugin: exact ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [GLM5, DSV3, MX])
def test_plugin_loads_every_draft_parameter_exactly(sglang_cpu, caplog, name):
    """Every parameter of sglang's draft class (NaN-filled first, so nothing unwritten hides)
    equals bf16 of the fp32 formula of its checkpoint tensors, or the checkpoint's float tensor;
    only the embedding and head, which the worker takes from the target, are not loaded."""
    caplog.set_level(logging.INFO)
    params = _build_and_load(name, plugin=True, nan=True)
    assert {n for n, p in params.items() if p.isnan().any()} == SHARED
    _assert_exact(name, params)
    codes = _draft_code_weights(name)
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(lines) == 1 and f"dequantized {len(codes)} tensors" in lines[0], lines


# -- stock sglang --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, companion", [(GLM5, "weight_offset"), (DSV3, "weight_offset"), (MX, "weight_scale")]
)
def test_stock_sglang_stops_on_a_shared_expert_companion(sglang_cpu, name, companion):
    """Stock sglang does not load these drafts at all: DeepseekV3ForCausalLMNextN.load_weights
    (GLM-5's reaches it through super()) looks the fused shared expert's companion up in its
    params_dict and raises KeyError; the routed experts' companions before it were only logged as
    "not found in params_dict"."""
    missing = f"'model.decoder.mlp.shared_experts.gate_up_proj.{companion}'"
    with pytest.raises(KeyError, match=missing):
        _build_and_load(name, plugin=False)


# -- sglang's ModelConfig route (what a draft worker and the CLI do) ------------------------------


def test_glm5_draft_through_sglang_model_config(load_draft):
    """GLM-5 (DSA: index_topk set) builds from the folder as a draft worker builds it, past
    sglang's CUDA-only start-up step for DSA models (handled by the CPU tools, tools/cpu_env.py),
    as the class sglang really builds, and loads exactly."""
    model = load_draft(fixture_dir(GLM5))
    assert type(model).__name__ == "GlmMoeDsaForCausalLMNextN"
    _assert_exact(GLM5, {n: p.detach() for n, p in model.named_parameters()})


def test_deepseek_v3_draft_through_sglang_model_config(load_draft):
    """DeepSeek-V3 (no index_topk) builds from the folder as a draft worker builds it, and loads
    exactly."""
    model = load_draft(fixture_dir(DSV3))
    assert type(model).__name__ == "DeepseekV3ForCausalLMNextN"
    _assert_exact(DSV3, {n: p.detach() for n, p in model.named_parameters()})


# -- the CLI's verify on them --------------------------------------------------------------------


def test_verify_is_exact_on_the_deepseek_v3_fixture(sglang_cpu):
    from sglang_mtp_dequant.tools.verify import run_verify

    report = run_verify(fixture_dir(DSV3), reference=reference_file(DSV3))
    assert report.ok and report.class_name == "DeepseekV3ForCausalLMNextN"
    assert report.stock_error.startswith("KeyError"), report.stock_error


def test_verify_is_exact_on_the_glm5_fixture(sglang_cpu):
    """GlmMoeDsaForCausalLMNextN overrides load_weights and calls super(): verify still runs the
    hooked load and stock sglang's, and compares with the original float reference."""
    from sglang_mtp_dequant.tools.verify import run_verify

    report = run_verify(fixture_dir(GLM5), reference=reference_file(GLM5))
    assert report.ok and report.class_name == "GlmMoeDsaForCausalLMNextN"
    assert report.stock_error.startswith("KeyError"), report.stock_error


# -- the CLI's doctor on them --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, class_name, stock_stops_with",
    [
        (GLM5, "GlmMoeDsaForCausalLMNextN",
         "KeyError: 'model.decoder.mlp.shared_experts.gate_up_proj.weight_offset'"),
        (DSV3, "DeepseekV3ForCausalLMNextN",
         "KeyError: 'model.decoder.mlp.shared_experts.gate_up_proj.weight_offset'"),
        (MX, "DeepseekV3ForCausalLMNextN", "RuntimeError: The size of tensor a"),
    ],
)  # fmt: skip
def test_doctor_names_the_class_and_what_stock_sglang_really_does(
    sglang_cpu, name, class_name, stock_stops_with
):
    """doctor says ok with the class sglang builds and every code tensor dequantized, and its
    stock line is what stock sglang's own loader raised in the dry run (the same KeyError as
    ``test_stock_sglang_stops_on_a_shared_expert_companion``), not the per-tensor guess that
    stock copies codes "with no error"."""
    from sglang_mtp_dequant.tools.doctor import diagnose

    report = diagnose(fixture_dir(name))
    codes = _draft_code_weights(name)
    assert report.verdict == "ok", report.problems + report.unchecked
    assert report.draft_class == class_name
    assert sum(row.action == "dequantize" for row in report.tensors) == len(codes)
    assert f"its loader stops: {stock_stops_with}" in report.stock, report.stock


def test_doctor_keeps_the_silent_misload_line_where_stock_loads(sglang_cpu):
    """Where stock sglang's loader runs through (the Qwen3.5 MTP layout), the stock line stays
    the silent misload it is."""
    from sglang_mtp_dequant.tools.doctor import diagnose

    report = diagnose(fixture_dir("q35_dense_w8a8_dynamic"))
    assert "with no error: the draft proposes garbage" in report.stock, report.stock
