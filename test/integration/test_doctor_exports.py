"""The doctor on every export users hold, in every launch form (issue 48): one test per cell.

Each cell is ``sglang-mtp-dequant doctor <folder> --device npu --speculative-algorithm EAGLE
<the form's flags>`` as a user types it (sglang 0.5.23's own parser, resolution and draft class
built on the meta device, the NPU's answers stood in as ``tools/cpu_env.py`` says). What each
cell must say is what sglang does, read in its code and seen in the doctor's dry run of its own
loader: the stock column (plugin off) and the plugin column. The exports:

- the bundled e2e Qwen3.5 exports (dense, hybrid Gated DeltaNet, MoE, the Qwen3.6 recipe's
  hybrid, the MoE export whose experts are FLOAT);
- msmodelslim's GLM-5 and DeepSeek-V3 NextN exports (``test/fixtures/modelslim``), with the
  NextN layer quantized as bundled and FLOAT as the shipped GLM recipe writes it
  (``*_nextn_float``, written by ``_gen/nextn_float.py``);
- the dense exports of schemes sglang's ModelSlim has no linear scheme for (W8A16, WFP8AFP8,
  W4A8_DYNAMIC): under F2 / F4 sglang builds those layers unquantized and the plugin decodes
  their codes (``serving/plain_parts.py``), as it does under F1 / F3;
- the bundled Qwen3.5/3.6 VL exports (``e2e/vl_*``), whose vision tower sglang builds
  unquantized over W8A8_DYNAMIC codes in every form.
"""

from __future__ import annotations

import functools
import json
import os
import re

import pytest

from sglang_mtp_dequant.tools.doctor import diagnose, render_text
from sglang_mtp_dequant.tools.forms import FORMS
from sglang_mtp_dequant.tools.launch import parse_launch
from support.paths import E2E, MODELSLIM

NPU = ("--device", "npu", "--speculative-algorithm", "EAGLE")
GARBAGE, RIGHT, STOPS = "serves garbage", "serves right", "does not start"
FLOAT_STOP = (
    "does not start (ValueError: Unsupported ModelSlim MoE schemes for layer "
    "model.layers.2.mlp.experts: W13='FLOAT', W2='FLOAT')"
)
KEY_ERROR = (
    "does not start (its loader: KeyError: "
    "'model.decoder.mlp.shared_experts.gate_up_proj.weight_offset')"
)
WAY_OUT = "F1 (no quantization flag) or F3 (--speculative-draft-model-quantization unquant)"


def cells(f1: tuple[str, bool], f2: tuple[str, bool]) -> dict[str, tuple[str, bool]]:
    """F1 and F3 build the draft alike (unquantized), F2 and F4 alike (quantized)."""
    return {"F1": f1, "F2": f2, "F3": f1, "F4": f2}


#: export -> form -> (the stock column starts with, the plugin serves it right)
EXPORTS = {
    "e2e/w8a8": cells((GARBAGE, True), (RIGHT, True)),
    "e2e/hybrid_w8a8": cells((GARBAGE, True), (RIGHT, True)),
    # its target's Gated DeltaNet in_proj_qkvz: stock loads their codes in every form
    "e2e/hybrid_qwen36_recipe": cells((GARBAGE, True), ("serves garbage (at the target)", True)),
    # F2 / F4: the plain nn.Linear shared expert gate takes its codes as weights in stock
    "e2e/moe_w8a8": cells((GARBAGE, True), ("serves garbage (1 float parameter(s)", True)),
    # its target's routed experts are FLOAT: stock stops there in every form
    "e2e/moe_float_experts": cells(*[(f"{STOPS} (at the target)", True)] * 2),
    "modelslim/glm5_w8a8_mtp": cells((KEY_ERROR, True), (f"{STOPS} (its loader: Assert", False)),
    "modelslim/glm5_w8a8_nextn_float": cells((RIGHT, True), (FLOAT_STOP, True)),
    "modelslim/deepseek_v3_w8a8_dynamic_mix_mtp": cells(
        (KEY_ERROR, True), ("serves garbage (1 float parameter(s)", True)
    ),
    "modelslim/deepseek_v3_w8a8_dynamic_mix_nextn_float": cells((RIGHT, True), (FLOAT_STOP, True)),
    # F2 / F4: sglang's ModelSlim has no linear scheme for these and builds the layers unquantized
    "modelslim/q35_dense_w8a16_asym": cells((GARBAGE, True), (GARBAGE, True)),
    "modelslim/q35_dense_wfp8afp8_dynamic": cells((GARBAGE, True), (GARBAGE, True)),
    "modelslim/q35_dense_w4a8_dynamic": cells(
        (f"{STOPS} (its loader: AssertionError", True), (f"{STOPS} (its loader: Assert", True)
    ),
    # the vision tower: unquantized over codes in every form (the target's cell says images)
    "e2e/vl_hybrid": cells((GARBAGE, True), ("serves garbage (at the target)", True)),
    "e2e/vl_moe": cells(*[(f"{STOPS} (at the target)", True)] * 2),
}


def folder_of(export: str) -> str:
    kind, name = export.split("/")
    return os.path.join(E2E if kind == "e2e" else MODELSLIM, name)


@functools.cache
def doctor(export: str, key: str):
    """The doctor's answer for ``export`` launched in form ``key`` (cached per test session)."""
    folder = folder_of(export)
    return diagnose(folder, launch=parse_launch(folder, [*NPU, *FORMS[key].flags]))


@pytest.mark.parametrize("key", sorted(FORMS))
@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_every_export_in_every_form(export, key):
    stock, serves = EXPORTS[export][key]
    report = doctor(export, key)
    assert report.form == f"{key} ({FORMS[key].label})"
    assert report.stock_outcome.startswith(stock), report.stock_outcome
    assert report.stock_serves is (stock == RIGHT)
    assert (report.verdict == "ok") is serves, report.problems + report.unchecked
    if report.verdict != "ok" and FORMS[key].draft_built:  # a quantized draft that cannot serve
        assert all(WAY_OUT in problem for problem in report.problems), report.problems
    assert report.unchecked == [], report.unchecked  # every cell answered, none left open


@pytest.mark.parametrize("export", ["modelslim/glm5_w8a8_nextn_float"])
def test_the_nextn_layer_is_the_drafts_not_the_targets(export):
    """Issue 48: the NextN layer (model.layers.2, the layer after the target's last) described
    FLOAT was called the target's, and stock "does not start" in every form while the top line
    said "nothing to fix". The flagless launch serves, stock and with the plugin."""
    report = doctor(export, "F1")
    assert report.target_stop == "" and report.target == ""
    assert report.stock.endswith("as the float it is: nothing to fix")
    assert report.verdict == "ok"


@pytest.mark.parametrize("export", ["glm5_w8a8_nextn_float", "deepseek_v3_w8a8_dynamic_mix_mtp"])
def test_a_quantized_nextn_draft_is_built_as_on_npu(export):
    """On NPU DeepSeek's NextN class names its layer ``model.layers.<n>`` (the description's
    name), which the doctor stands in: F2 is built (as the plugin builds it, where stock
    stops), its class the one sglang builds for the architecture, and the QuaRot note is the
    flagless launch's. Before, F2 was 'not built here', 'unchecked', and named DeepSeek's class
    for GLM-5."""
    report, flagless = doctor(f"modelslim/{export}", "F2"), doctor(f"modelslim/{export}", "F1")
    assert report.built_quantized == "modelslim" and report.draft_class == flagless.draft_class
    assert [n for n in report.notes if "QuaRot" in n] == [
        n for n in flagless.notes if "QuaRot" in n
    ]
    assert any("Tensor.npu()" in n for n in report.notes) == ("glm5" in export)  # rot.weight


def test_the_cli_answer_on_the_glm_nextn_float_export_reads_once(capsys, tmp_path):
    """The text answer of F2 on the GLM-5 NextN-FLOAT export: the top verdict agrees with its
    own form's line, no line is over 600 characters, sglang's error is quoted once, and the
    JSON answer parses and holds every form."""
    from sglang_mtp_dequant.tools.cli import main

    folder = folder_of("modelslim/glm5_w8a8_nextn_float")
    flags = [*NPU, *FORMS["F2"].flags, "--log", str(tmp_path / "sglang.log")]
    assert main(["doctor", folder, *flags]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 600
    error = "ValueError: Unsupported ModelSlim MoE schemes for layer model.layers.2.mlp.experts"
    assert out.count(error) == 1, out
    forms = {line.split()[0]: line for line in lines if re.match(r"    F[1-4] ", line)}
    assert (
        "with the plugin: serves right" in forms["F2"]
        and "does not start (as above)" in (forms["F2"])
    )
    assert "does not start (as above)" in forms["F4"]
    assert lines[-1] == "verdict: ok - " + (
        "the plugin builds model.layers.2.mlp.experts (described FLOAT) unquantized and loads "
        "their floats as stored; the other layers are sglang's quantized layers; every "
        "parameter is filled, the plugin only checks the load"
    )
    assert main(["doctor", folder, *flags, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [f["key"] for f in answer["forms"]] == ["F1", "F2", "F3", "F4"]
    assert answer["startup_error"].startswith(error) and answer["plugin_outcome"] == RIGHT


def test_each_form_line_shows_the_target_and_the_memory_stock_holds_besides():
    """The form table's target cell (``TargetCheck.outcome``) and the draft's memory per rank:
    with the plugin its own parameters, stock those and its vocab-sized copies."""
    folder = folder_of("e2e/hybrid_qwen36_recipe")
    report = diagnose(folder, launch=parse_launch(folder, list(NPU)), forms=True)
    for answer in report.forms:
        assert answer.target == (
            "stock 3 target layer(s) load raw codes, with the plugin 3 target layer(s) served right"
        )
        assert answer.vocab_bytes and answer.draft_bytes
        line = answer.line({})
        assert f"({answer.draft_bytes:,} B) with the plugin" in line
    text = render_text(report)
    assert max(len(line) for line in text.splitlines()) <= 600


@pytest.mark.parametrize("export", ["e2e/vl_hybrid", "e2e/vl_moe"])
def test_every_form_says_the_vision_towers_images(export):
    """Issue 49: each form's target cell says stock's tower loads raw codes and the plugin's
    images are answered right (it decodes the tower's three layers as they stream); the MoE
    export's FLOAT experts stop stock first."""
    folder = folder_of(export)
    report = diagnose(folder, launch=parse_launch(folder, list(NPU)), forms=True)
    assert [a.key for a in report.forms] == ["F1", "F2", "F3", "F4"]
    for answer in report.forms:
        assert answer.target.endswith(
            "stock 3 target layer(s) load raw codes, with the plugin 3 target layer(s) served "
            "right (3 decoded as they stream): images answered right"
        ), answer.target
        assert ("FLOAT experts" in answer.target) == ("moe" in export)


def test_the_results_table_is_made_of_the_cells_asserted_here():
    """docs/results.md's table (``benchmarks/doctor_exports.py``) lists exactly these exports."""
    import doctor_exports

    listed = {os.path.abspath(folder) for folder, _ in doctor_exports.EXPORTS}
    assert listed == {os.path.abspath(folder_of(e)) for e in EXPORTS}
