"""``sglang-mtp-dequant verify``: sglang's real draft, loaded stock, by reference and by the plugin.

Runs in the test process (sglang is imported once per session): ``run_verify`` does what the
console script does, ``load_plugins()`` included. What it reports is checked against the test
suite's own independent reference (``reference.py``) and the original float weights.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.verify import (
    ParamRow,
    VerifyReport,
    independent_dequantize,
    render_verify,
    run_verify,
)
from support.checkpoints import edit_description
from support.paths import DENSE_W8, fixture_dir, reference_file
from support.reference import DENSE_PROJECTIONS, dequantize_fp32, description, load_all

DEMO = "q35_dense_w8a8_dynamic"


@pytest.fixture(scope="module")
def demo_report(sglang_cpu):
    return run_verify(fixture_dir(DEMO), reference=reference_file(DEMO))


def test_projections_side_by_side(demo_report):
    assert demo_report.ok and demo_report.class_name == "Qwen3_5ForCausalLMMTP"
    assert demo_report.plugin_error is None and demo_report.stock_error is None
    assert demo_report.folder == fixture_dir(DEMO)
    rows = {r.parameter: r for r in demo_report.rows}
    original = load_file(reference_file(DEMO))
    for param, parts in DENSE_PROJECTIONS.items():
        row = rows[param]
        assert sorted(row.sources) == sorted(parts) and row.quantized
        assert row.stock_absmax == 128.0  # raw int8 codes
        assert row.plugin_absmax is not None and row.plugin_absmax < 0.1
        assert row.check == "exact" and row.max_error == 0.0
        assert row.stock_reference_error is not None and row.stock_reference_error > 127
        want = torch.cat([original[p].float() for p in parts])
        assert row.reference_absmax == float(want.abs().max())
        assert row.plugin_reference_error is not None and row.plugin_reference_error < 1e-3


def test_float_parameters_identical_in_every_load(demo_report):
    rows = {r.parameter: r for r in demo_report.rows}
    for param in ("fc.weight", "model.norm.weight", "model.layers.0.q_norm.weight"):
        row = rows[param]
        assert not row.quantized and row.check == "exact"
        assert row.stock_absmax == row.plugin_absmax
    assert "lm_head.weight" not in rows and "model.embed_tokens.weight" not in rows
    assert demo_report.checked == len(demo_report.rows) == 12


def test_rendered_report_says_which_load_is_which(demo_report):
    text = render_verify(demo_report)
    lines = text.splitlines()
    assert f"  resolved: {fixture_dir(DEMO)} (sglang" in text
    assert "  stock     = sglang's load_weights with the hook bypassed" in lines
    assert "  plugin    = load_weights as hooked by sglang.srt.plugins.load_plugins()" in lines
    header = next(line for line in lines if line.startswith("parameter "))
    assert "stock absmax  plugin absmax  check" in header
    assert "stock err vs ref  plugin err vs ref" in header
    qkv = next(line for line in lines if line.startswith("model.layers.0.qkv_proj"))
    assert "mtp.layers.0.self_attn.{" in qkv and " exact " in qkv
    assert lines[-1] == (
        "verdict: ok - 12 draft parameters equal the reference bit for bit (4 of them decoded "
        "from codes)"
    )
    assert "memory: " in text and "estimated on the meta device" in text


@pytest.mark.parametrize("name", DENSE_W8)
def test_independent_dequantizer_agrees_with_the_test_reference(name):
    """verify's own formula (no code shared with schemes/) against reference.py's."""
    folder = fixture_dir(name)
    tensors, desc = load_all(folder), description(folder)
    for parts in DENSE_PROJECTIONS.values():
        for part in parts:
            got = independent_dequantize(tensors, part, desc[part], desc.get("version"))
            assert torch.equal(got, dequantize_fp32(tensors, part, desc[part]))


def test_refused_checkpoint_is_an_error_with_both_outcomes(sglang_cpu, copy_checkpoint):
    """An int8 draft weight described as a scheme the plugin does not decode: stock copies its
    codes, the plugin refuses it by name."""
    folder = copy_checkpoint(DEMO)
    edit_description(
        folder, lambda desc: desc.update({"mtp.layers.0.mlp.up_proj.weight": "W4A4_MXFP4_SVD"})
    )
    report = run_verify(folder)
    assert not report.ok and report.stock_error is None
    assert "'mtp.layers.0.mlp.up_proj.weight'" in (report.plugin_error or "")
    gate_up = {r.parameter: r for r in report.rows}["model.layers.0.mlp.gate_up_proj.weight"]
    assert gate_up.stock_absmax == 128.0 and gate_up.plugin_absmax is None
    text = render_verify(report)
    assert "plugin load refused: DraftWeightError: sglang-mtp-dequant: draft tensor" in text
    assert text.splitlines()[-1].startswith("verdict: error")


def test_packed_int4_checkpoint_stock_stops_plugin_exact(sglang_cpu):
    """W4A8_DYNAMIC: stock sglang's loader stops on the packed shape; the plugin's draft equals
    the reference load (verify's own int4 unpacking) and the original within 0.006."""
    name = "q35_dense_w4a8_dynamic"
    report = run_verify(fixture_dir(name), reference=reference_file(name))
    assert report.ok and report.plugin_error is None
    assert report.stock_error is not None and "param_data.shape" in report.stock_error
    rows = {r.parameter: r for r in report.rows}
    for param in DENSE_PROJECTIONS:
        row = rows[param]
        assert row.quantized and row.check == "exact"
        assert row.plugin_reference_error is not None and row.plugin_reference_error < 0.006


def test_moe_checkpoint_every_expert_checked(sglang_cpu):
    report = run_verify(fixture_dir("q35moe_w8a8_dynamic"))
    assert report.ok, render_verify(report)
    rows = {r.parameter: r for r in report.rows}
    w13 = rows["model.layers.0.mlp.experts.w13_weight"]
    assert w13.quantized and w13.check == "exact" and len(w13.sources) == 2 * 4


def test_cli_verify_exit_code_and_output(sglang_cpu, capsys, tmp_path):
    name = "q35_dense_w8a8_static"
    log = tmp_path / "sglang.log"
    code = main(["verify", fixture_dir(name), "--log", str(log)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out.rstrip().splitlines()[-1].startswith("verdict: ok")
    assert "model.layers.0.mlp.down_proj.weight" in captured.out
    assert "Multi-thread loading shards" not in captured.out  # sglang's bar: in the log
    assert "UserWarning" not in captured.out
    assert "Multi-thread loading shards" in log.read_text()


def test_cli_verify_on_an_unhooked_architecture(capsys, tmp_path):
    """A Qwen3 checkpoint: sglang builds no draft class this plugin hooks; said by name."""
    log = str(tmp_path / "sglang.log")
    code = main(["verify", fixture_dir("qwen3_v0_w4a16_per_group"), "--log", log])
    out = capsys.readouterr().out
    assert code == 4 and "a draft class this plugin does not hook (not supported yet)" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: unsupported")


def test_nothing_checked_is_never_ok():
    """Rows that could not be compared (no independent rule, nothing the reference wrote)
    make no clean verdict: "unchecked" with its reason, never "ok"."""
    report = VerifyReport(requested="/ckpt")
    report.rows = [ParamRow("model.layers.0.mlp.experts.w13_weight", [], why="no rule")]
    assert report.checked == 0 and not report.ok
    assert render_verify(report).splitlines()[-1] == (
        "verdict: unchecked - no draft parameter could be checked"
    )


@pytest.mark.parametrize("case_id", ["glm4_moe", "deepseek_v3"])
def test_nextn_drafts_are_built_by_their_own_class_and_checked(draft_case, case_id):
    """A GLM-4.5 / DeepSeek-V3-shaped checkpoint (``model.layers.<n>.*``): verify builds the
    NextN class sglang's ModelConfig maps the architecture to, and every parameter fed by
    codes equals the reference load bit for bit (MLA's concatenated q_a/kv_a included)."""
    from support.draft_cases import CASES

    case = CASES[case_id]
    _, load = draft_case(case)
    report = run_verify(load.folder)
    assert report.class_name == case.class_path.rsplit(".", 1)[1], report.class_name
    assert report.ok, render_verify(report)
    rows = {r.parameter: r for r in report.rows}
    quantized = [r for r in rows.values() if r.quantized]
    assert len(quantized) >= 6 and all(r.check == "exact" for r in quantized)
    fused_a = [r for r in quantized if r.parameter.endswith("fused_qkv_a_proj_with_mqa.weight")]
    if case_id == "deepseek_v3":
        (row,) = fused_a
        assert sorted(s.rsplit(".", 2)[1] for s in row.sources) == [
            "kv_a_proj_with_mqa",
            "q_a_proj",
        ]
        assert report.stock_error is not None and "KeyError" in report.stock_error
    else:
        assert all(r.stock_absmax is not None and r.stock_absmax >= 100 for r in quantized)
