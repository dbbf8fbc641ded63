"""``sglang-mtp-dequant verify``: sglang's real draft, loaded stock and with the plugin.

Runs in the test process (sglang is imported once per session): ``run_verify`` does what the
console script does, ``load_plugins()`` included. The figures it reports are checked against
the test suite's own independent reference (``reference.py``) and the original float weights.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from conftest import DENSE_W8, fixture_dir, reference_file
from reference import DENSE_PROJECTIONS, dequantize_fp32, description, load_all
from sglang_mtp_dequant.cli import main
from sglang_mtp_dequant.verify import independent_dequantize, render_verify, run_verify


@pytest.fixture(scope="module")
def demo_report(sglang_cpu):
    name = "q35_dense_w8a8_dynamic"
    return run_verify(fixture_dir(name), reference=reference_file(name), progress=False)


def test_projections_side_by_side(demo_report):
    assert demo_report.ok and demo_report.class_name == "Qwen3_5ForCausalLMMTP"
    assert demo_report.plugin_error is None and demo_report.stock_error is None
    rows = {r.parameter: r for r in demo_report.rows}
    original = load_file(reference_file("q35_dense_w8a8_dynamic"))
    for param, parts in DENSE_PROJECTIONS.items():
        row = rows[param]
        assert row.sources == parts
        assert row.stock_absmax == 128.0  # raw int8 codes
        assert row.plugin_absmax is not None and row.plugin_absmax < 0.1
        assert row.exact is True and row.matches_dequant is True
        assert row.stock_reference_error is not None and row.stock_reference_error > 127
        want = torch.cat([original[p].float() for p in parts])
        assert row.reference_absmax == float(want.abs().max())
        assert row.plugin_reference_error is not None and row.plugin_reference_error < 1e-3


def test_float_parameters_identical_in_both_loads(demo_report):
    rows = {r.parameter: r for r in demo_report.rows}
    for param in ("fc.weight", "model.norm.weight", "model.layers.0.q_norm.weight"):
        row = rows[param]
        assert row.stock_absmax == row.plugin_absmax and row.dequant_error == 0.0
        assert row.stock_reference_error == 0.0 and row.plugin_reference_error == 0.0
    assert "lm_head.weight" not in rows and "model.embed_tokens.weight" not in rows


def test_rendered_report_says_which_load_is_which(demo_report):
    text = render_verify(demo_report)
    assert (
        "stock  = sglang's load_weights with the hook bypassed (load_weights.__wrapped__)" in text
    )
    assert "plugin = load_weights as hooked by sglang.srt.plugins.load_plugins()" in text
    header = next(line for line in text.splitlines() if line.startswith("parameter "))
    assert "stock absmax  plugin absmax  dequant err" in header
    assert "stock err vs ref  plugin err vs ref" in header
    qkv = next(line for line in text.splitlines() if line.startswith("model.layers.0.qkv_proj"))
    assert "mtp.layers.0.self_attn.{q_proj,k_proj,v_proj}.weight" in qkv and "(exact)" in qkv
    assert text.splitlines()[-1].startswith("verdict: ok - 12 draft parameters match")
    assert "memory: " in text and "estimated on the meta device" in text


@pytest.mark.parametrize("name", DENSE_W8)
def test_independent_dequantizer_agrees_with_the_test_reference(name):
    """verify's own formula (no code shared with schemes/) against reference.py's."""
    folder = fixture_dir(name)
    tensors, desc = load_all(folder), description(folder)
    for parts in DENSE_PROJECTIONS.values():
        for part in parts:
            got = independent_dequantize(tensors, part, desc[part])
            assert torch.equal(got, dequantize_fp32(tensors, part, desc[part]))


def test_refused_checkpoint_is_an_error_with_both_outcomes(sglang_cpu, copy_checkpoint):
    """An int8 draft weight described as a scheme the plugin does not decode: stock copies its
    codes, the plugin refuses it by name."""
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    path = os.path.join(folder, "quant_model_description.json")
    with open(path) as handle:
        desc = json.load(handle)
    desc["mtp.layers.0.mlp.up_proj.weight"] = "W8A8_MXFP8"
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump(desc, handle)
    report = run_verify(folder, progress=False)
    assert not report.ok and report.stock_error is None
    assert "'mtp.layers.0.mlp.up_proj.weight'" in (report.plugin_error or "")
    gate_up = {r.parameter: r for r in report.rows}["model.layers.0.mlp.gate_up_proj.weight"]
    assert gate_up.stock_absmax == 128.0 and gate_up.plugin_absmax is None
    text = render_verify(report)
    assert "plugin load refused: sglang-mtp-dequant: draft tensor" in text
    assert text.splitlines()[-1].startswith("verdict: error")


def test_packed_int4_checkpoint_stock_stops_plugin_exact(sglang_cpu):
    """W4A8_DYNAMIC: stock sglang's loader stops on the packed shape; the plugin's draft equals
    verify's own int4 unpacking and dequantization, and the original within 0.006."""
    name = "q35_dense_w4a8_dynamic"
    report = run_verify(fixture_dir(name), reference=reference_file(name), progress=False)
    assert report.ok and report.plugin_error is None
    assert report.stock_error is not None and "param_data.shape" in report.stock_error
    rows = {r.parameter: r for r in report.rows}
    for param in DENSE_PROJECTIONS:
        row = rows[param]
        assert row.quantized and row.exact is True
        assert row.plugin_reference_error is not None and row.plugin_reference_error < 0.006


def test_cli_verify_exit_code_and_output(sglang_cpu, capsys):
    name = "q35_dense_w8a8_static"
    code = main(["verify", fixture_dir(name), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().splitlines()[-1].startswith("verdict: ok")
    assert "model.layers.0.mlp.down_proj.weight" in out


def test_cli_verify_on_an_unhooked_architecture(capsys):
    code = main(["verify", fixture_dir("qwen3_v0_w4a16_per_group"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "architecture 'Qwen3ForCausalLM' has no draft class" in err
