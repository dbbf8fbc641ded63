"""doctor and verify on the checkpoints users serve: GLM-5.1 and DeepSeek-V3.2 (DSA) W8A8
layouts, FA3 / C8 tensors in the MTP layer, QuaRot, compressed-tensors and ModelOpt drafts.

The GLM-5.1 / DeepSeek-V3.2 checkpoints are header-faithful scaled replicas of the published
inventory (``real_layouts.py``: real names, dtypes and shape patterns, sizes / 16, 4 experts);
compressed-tensors drafts are written by the library itself, ModelOpt NVFP4 by hand
(``foreign_checkpoints.py``). Everything sglang does here is its own code on the CPU: its
ServerArgs resolution, ModelConfig, quantization config, draft class and loader; the two CPU
stand-ins the DSA models need (``cpu_env.py``) are asserted to be said in the output.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.cpu_env import CUDA_CAPABILITY_NOTE
from support.checkpoints import edit_description
from support.foreign_checkpoints import compressed_tensors_checkpoint, modelopt_nvfp4_checkpoint
from support.paths import fixture_dir
from support.real_layouts import deepseek_v32_config, glm51_w8a8, write_checkpoint

ROPE_NOTE = "CPU stand-in: sglang's CPU rope supports deepseek_yarn scaling only"


@pytest.fixture
def doctor_json(capsys, tmp_path):
    def run(path: str) -> tuple[int, dict]:
        code = main(["doctor", path, "--json", "--log", str(tmp_path / "doctor.log")])
        return code, json.loads(capsys.readouterr().out)

    return run


@pytest.fixture(scope="module")
def glm51(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("glm51") / "ckpt")
    write_checkpoint(folder, glm51_w8a8(scale=16, experts=4), sparse=False)
    return folder


def test_glm51_doctor_names_the_class_sglang_builds_and_says_ok(doctor_json, glm51):
    code, report = doctor_json(glm51)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    # 5 static W8A8 attention projections + 4 experts x 3 + 3 shared-expert projections
    assert report["counts"] == {"dequantize": 20, "keep": 17, "pass": 0, "error": 0}
    assert report["draft_class"] == "GlmMoeDsaForCausalLMNextN"
    assert report["hooked_by"] == "DeepseekV3ForCausalLMNextN" and report["plugin_acts"]
    assert report["draft_quantization"] is None and report["built_quantized"] is None
    assert report["unfilled_parameters"] == {} and report["unchecked"] == []
    assert report["dry_run"].startswith("GlmMoeDsaForCausalLMNextN on the meta device")
    assert CUDA_CAPABILITY_NOTE in report["notes"]
    assert any(n.startswith(ROPE_NOTE) for n in report["notes"])
    (quarot,) = [n for n in report["notes"] if n.startswith("QuaRot")]
    assert "left to sglang: GlmMoeDsaForCausalLMNextN rotates the target's hidden states" in quarot
    rows = {t["name"]: t for t in report["tensors"]}
    q_a = rows["model.layers.78.self_attn.q_a_proj.weight"]
    assert q_a["scheme"] == "W8A8" and q_a["action"] == "dequantize"


def test_glm51_verify_is_exact_through_the_class_override(sglang_cpu, glm51):
    """GlmMoeDsaForCausalLMNextN overrides load_weights and calls super(): the stock loads
    switch the hook off (plugin.bypassed), the plugin load goes through it."""
    from sglang_mtp_dequant.tools.verify import render_verify, run_verify

    report = run_verify(glm51)
    assert report.class_name == "GlmMoeDsaForCausalLMNextN"
    assert report.verdict == "ok", render_verify(report)
    quantized = [r for r in report.rows if r.quantized]
    assert len(quantized) >= 6 and all(r.check == "exact" for r in quantized)


def test_deepseek_v32_doctor_gives_a_true_verdict(doctor_json, tmp_path):
    folder = str(tmp_path / "ds32")
    layout = glm51_w8a8(scale=16, experts=4, config=deepseek_v32_config(16, 4))
    write_checkpoint(folder, layout, sparse=False)
    code, report = doctor_json(folder)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    assert report["draft_class"] == "DeepseekV3ForCausalLMNextN"
    assert report["counts"]["dequantize"] == 20 and report["unfilled_parameters"] == {}
    assert CUDA_CAPABILITY_NOTE in report["notes"]
    assert not any(n.startswith(ROPE_NOTE) for n in report["notes"])  # yarn: sglang's own


# -- FA3 / C8 / QuaRot -----------------------------------------------------------------------------


def add_attention_quant(folder: str, attention: str, heads: int, c8: bool) -> list[str]:
    """FA3 (and C8) tensors as msmodelslim's saver writes them: f32 ``scale`` [n, 1], int8
    ``offset`` zeros, described FAQuant / C8."""
    from safetensors import safe_open

    def holds_attention(path: str) -> bool:
        with safe_open(path, "pt") as handle:
            return any(k.startswith(attention) for k in handle.keys())

    files = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors")]
    (path,) = [p for p in files if holds_attention(p)]
    tensors = load_file(path)
    added = {}
    for x in "qkv":
        added[f"{attention}.fa_{x}.scale"] = (torch.rand(heads, 1) + 0.5, "FAQuant")
        added[f"{attention}.fa_{x}.offset"] = (torch.zeros(heads, 1, dtype=torch.int8), "FAQuant")
    if c8:
        for proj in ("k_proj", "v_proj"):
            added[f"{attention}.{proj}.kv_cache_scale"] = (torch.rand(64) + 0.5, "C8")
            added[f"{attention}.{proj}.kv_cache_offset"] = (torch.zeros(64), "C8")
    os.chmod(path, 0o644)
    save_file({**tensors, **{k: v for k, (v, _) in added.items()}}, path, metadata={"format": "pt"})
    edit_description(folder, lambda desc: desc.update({k: d for k, (_, d) in added.items()}))
    index = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    if os.path.exists(index):
        os.chmod(index, 0o644)
        os.remove(index)
    return sorted(added)


def test_fa3_and_c8_tensors_are_passed_to_sglang_not_refused(
    doctor_json, copy_checkpoint, load_draft
):
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    added = add_attention_quant(folder, "mtp.layers.0.self_attn", heads=4, c8=True)
    code, report = doctor_json(folder)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    passed = sorted(t["name"] for t in report["tensors"] if t["action"] == "pass")
    assert passed == added and report["counts"]["dequantize"] == 7
    rows = {t["name"]: t for t in report["tensors"]}
    assert rows["mtp.layers.0.self_attn.fa_q.offset"]["reason"].startswith("FA3 attention-")
    assert rows["mtp.layers.0.self_attn.k_proj.kv_cache_scale"]["reason"].startswith("C8 ")
    assert set(added) <= set(report["skipped_names"])  # sglang's loader drops every one
    assert any("FA3/C8 attention-quantization tensor(s)" in n for n in report["notes"])
    load_draft(folder)  # the real hooked load: not refused, the guard passes


def test_fa3_in_a_glm51_mtp_layer(doctor_json, tmp_path):
    folder = str(tmp_path / "glm")
    write_checkpoint(folder, glm51_w8a8(scale=16, experts=4), sparse=False)
    added = add_attention_quant(folder, "model.layers.78.self_attn", heads=4, c8=False)
    code, report = doctor_json(folder)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    assert sorted(t["name"] for t in report["tensors"] if t["action"] == "pass") == added
    assert set(added) <= set(report["skipped_names"])


def test_quarot_on_a_class_without_a_rotation_step_is_said(doctor_json, copy_checkpoint):
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    save_file({"rot.weight": torch.eye(64)}, os.path.join(folder, "rot.safetensors"))
    code, report = doctor_json(folder)
    (quarot,) = [n for n in report["notes"] if n.startswith("QuaRot")]
    assert "the folder holds rot.safetensors (rot.weight)" in quarot
    assert "sglang 0.5.23's Qwen3_5ForCausalLMMTP has no step that applies it" in quarot


# -- other quantizers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preset, fmt, action",
    [
        ("W8A8", "compressed-tensors int-quantized", "dequantize"),
        ("FP8", "compressed-tensors float-quantized", "dequantize"),
        ("W4A16", "compressed-tensors pack-quantized", "dequantize"),
        ("NVFP4A16", "compressed-tensors nvfp4-pack-quantized", "dequantize"),
    ],
)
def test_compressed_tensors_drafts_are_named(doctor_json, tmp_path, preset, fmt, action):
    """sglang's ModelConfig takes compressed-tensors from config.json; Qwen3.5's own rule
    builds the draft unquantized on NPU with the draft quantization unset, so the plugin acts:
    every format is named and decoded by compressed-tensors itself, never by ModelSlim's rules."""
    folder = compressed_tensors_checkpoint(str(tmp_path / "ct"), preset)
    code, report = doctor_json(folder)
    assert report["draft_quantization"] == "compressed-tensors"
    assert report["built_quantized"] is None and report["plugin_acts"] is True
    projections = [t for t in report["tensors"] if "_proj" in t["name"] and t["format"]]
    assert len(projections) == 7 and {t["format"] for t in projections} == {fmt}
    assert {t["action"] for t in projections} == {action}
    for row in projections:
        assert fmt in row["reason"] and "expects" not in row["reason"]
        assert row["reason"].endswith("decoded by compressed-tensors")
    assert code == 0


def test_compressed_tensors_int8_decodes_as_the_library_does(tmp_path):
    """The plugin's decode of an int-quantized draft equals compressed-tensors' own
    dequantize, rounded once to bf16."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    from sglang_mtp_dequant.formats.plan import DequantPlan
    from support.checkpoints import open_checkpoint

    folder = compressed_tensors_checkpoint(str(tmp_path / "ct"), "W8A8")
    plan = DequantPlan.build(open_checkpoint(folder))
    (path,) = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors")]
    tensors = load_file(path)
    for name, entry in plan.to_dequantize.items():
        scale = tensors[name.replace(".weight", ".weight_scale")]
        want = dequantize(tensors[name], scale, None, dtype=torch.float32).bfloat16()
        assert torch.equal(entry.decoder.decompress(tensors[name], torch.bfloat16), want), name


def test_modelopt_nvfp4_draft_is_named_and_decoded_by_compressed_tensors(doctor_json, tmp_path):
    """Formerly "W8A8_DYNAMIC expects int8, found uint8", then refused by name; Qwen3.5's own
    rule builds a serialized NVFP4 draft unquantized (``_mtp_quant_config``), so the plugin
    acts, and compressed-tensors' ModelOpt converter and NVFP4 decompressor decode it."""
    folder = modelopt_nvfp4_checkpoint(str(tmp_path / "mo"))
    code, report = doctor_json(folder)
    assert code == 0 and report["draft_quantization"] == "modelopt_fp4"
    assert report["built_quantized"] is None and report["plugin_acts"] is True
    decoded = [t for t in report["tensors"] if t["format"] == "ModelOpt NVFP4"]
    assert len(decoded) == 7 and {t["action"] for t in decoded} == {"dequantize"}
    for row in decoded:
        assert row["reason"].startswith("ModelOpt NVFP4 uint8 codes with input_scale, ")
        assert "W8A8_DYNAMIC" not in row["reason"]
    assert any("declares modelopt (NVFP4) quantization" in n for n in report["notes"])


def test_doctor_reads_the_json_fields_as_absolute_paths(doctor_json):
    code, report = doctor_json(os.path.relpath(fixture_dir("q35_dense_w8a8_dynamic")))
    assert code == 0 and os.path.isabs(report["folder"])
    assert os.path.isabs(report["description_file"]) and os.path.isabs(report["log"])
