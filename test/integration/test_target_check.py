"""doctor and verify on the target's linear layers (``tools/target_check.py``), for the user's
launch: sglang's own target class built on the meta device from the checkpoint's config and
description, its quant config from sglang's ``_get_quantization_config`` under the platform the
flags name. Checkpoints: msmodelslim's Qwen3.6-recipe export of the bundled hybrid (its Gated
DeltaNet ``in_proj_qkv`` / ``in_proj_z`` W8A8_DYNAMIC), its Qwen3.5-recipe export (every GDN
projection FLOAT) and a copy of the first whose GDN shards are described W8A16."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_every_draft import cli_json  # noqa: F401 - the CLI run in this process, as JSON

from support.paths import E2E

Q36, Q35 = os.path.join(E2E, "hybrid_qwen36_recipe"), os.path.join(E2E, "hybrid_w8a8")
SUPPLIED = "the plugin supplies in_proj_qkvz = in_proj_qkv + in_proj_z"


def target_notes(report: dict) -> list[str]:
    return [n for n in report["notes"] if n.startswith(("target ", "target layers"))]


def test_doctor_names_the_gdn_layers_stock_loads_as_codes_and_the_mapping_supplied(cli_json):  # noqa: F811
    code, report = cli_json("doctor", Q36)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    (note,) = target_notes(report)
    assert note.startswith("target Qwen3_5ForCausalLM: stock sglang builds 3 linear layer(s)")
    for i in range(3):
        assert f"model.layers.{i}.linear_attn.in_proj_qkv (W8A8_DYNAMIC)" in note
    assert SUPPLIED in note and "3 of them get their ModelSlim scheme" in note


def test_doctor_says_nothing_of_a_target_whose_layers_have_their_method(cli_json):  # noqa: F811
    code, report = cli_json("doctor", Q35)
    assert code == 0 and report["verdict"] == "ok"
    assert target_notes(report) == []


def described_as(tmp_path, scheme: str) -> str:
    """A copy of the Qwen3.6-recipe export with its GDN shards described ``scheme``."""
    folder = tmp_path / f"{scheme.lower()}_gdn"
    shutil.copytree(Q36, folder)
    path = folder / "quant_model_description.json"
    described = json.loads(path.read_text())
    path.write_text(
        json.dumps(
            {
                k: scheme if ".in_proj_qkv." in k or ".in_proj_z." in k else v
                for k, v in described.items()
            }
        )
    )
    return str(folder)


def test_doctor_reports_a_target_layer_the_plugin_cannot_decode_as_refused(cli_json, tmp_path):  # noqa: F811
    code, report = cli_json("doctor", described_as(tmp_path, "W8A8SC"))
    assert code == 1 and report["verdict"] == "error"
    (problem,) = [p for p in report["problems"] if p.startswith("target ")]
    assert "3 linear layer(s) no ModelSlim method takes and the plugin does not decode" in problem
    assert "model.layers.2.linear_attn.in_proj_z (W8A8SC)" in problem
    assert "refuses the start-up" in problem and "FLOAT" in problem


def test_doctor_reports_a_target_layer_the_plugin_decodes(cli_json, tmp_path):  # noqa: F811
    """W8A16 shards: no ModelSlim method, but the plugin decodes them as they stream (refused
    before this change)."""
    code, report = cli_json("doctor", described_as(tmp_path, "W8A16"))
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    (note,) = target_notes(report)
    assert "model.layers.0.linear_attn.in_proj_qkv (W8A16)" in note
    assert "the plugin decodes 3 of them as they stream" in note


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_off_npu_the_target_is_not_checked_and_said_so(cli_json, device):  # noqa: F811
    code, report = cli_json("doctor", Q36, "--device", device)
    assert report["verdict"] == "ok"
    assert target_notes(report) == [
        f"target layers not checked: --device {device}: sglang runs ModelSlim's quantized "
        "linear methods only on Ascend NPU"
    ]


def test_verify_reports_the_same_target_layers(cli_json):  # noqa: F811
    code, report = cli_json("verify", Q36)
    assert code == 0 and report["verdict"] == "ok", report.get("reason")
    (note,) = target_notes(report)
    assert SUPPLIED in note and "3 of them" in note


VL, VL_MOE = os.path.join(E2E, "vl_hybrid"), os.path.join(E2E, "vl_moe")
TOWER_QKV = "model.visual.blocks.0.attn.qkv_proj: model.visual.blocks.0.attn.qkv (W8A8_DYNAMIC)"


@pytest.mark.parametrize("folder", [VL, VL_MOE], ids=["dense-hybrid", "moe"])
def test_doctor_names_the_vision_tower_stock_loads_as_codes_and_the_plugin_decodes(
    cli_json,  # noqa: F811
    folder,
):
    """msmodelslim's Qwen3.6 recipe quantizes ``*visual.blocks*``; sglang 0.5.23 builds the
    tower with ``quant_config=None``: the doctor names its layers by the prefix sglang built
    them with, says what stock does to images, and the target's cell of a launch form
    (``TargetCheck.outcome``) says stock runs images on raw codes and the plugin serves them.
    On main the tower was found nowhere (the check read only layers sglang asked a config
    about). The MoE export's FLOAT experts stop a stock build (sglang #34211): the check builds
    them as the plugin does."""
    from sglang_mtp_dequant.tools.launch import parse_launch
    from sglang_mtp_dequant.tools.target_check import check_target

    code, report = cli_json("doctor", folder)
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    (note,) = target_notes(report)
    assert TOWER_QKV in note and "model.visual.blocks.0.mlp.linear_fc1" in note
    assert "every image and video request would run on raw codes" in note
    assert note.endswith("the plugin decodes 3 of them as they stream")
    outcome = check_target(folder, parse_launch(folder, ["--device", "npu"])).outcome()
    assert outcome is not None and outcome.plugin_serves
    assert outcome.stock.startswith(f"3 target layer(s) load raw codes ({TOWER_QKV})")
    assert "every image and video request would run on raw codes" in outcome.stock
    assert outcome.plugin == (
        "3 target layer(s) served right (3 decoded as they stream): images answered right"
    )


def test_doctor_refuses_a_vision_tower_the_plugin_cannot_decode(cli_json, tmp_path):  # noqa: F811
    folder = tmp_path / "w8a8sc_tower"
    shutil.copytree(VL, folder)
    path = folder / "quant_model_description.json"
    described = json.loads(path.read_text())
    described.update(
        {k: "W8A8SC" for k in described if k.startswith("model.visual.blocks.0.attn.qkv.")}
    )
    path.write_text(json.dumps(described))
    code, report = cli_json("doctor", str(folder))
    assert code == 1 and report["verdict"] == "error"
    (problem,) = [p for p in report["problems"] if p.startswith("target ")]
    assert "model.visual.blocks.0.attn.qkv_proj: model.visual.blocks.0.attn.qkv (W8A8SC)" in problem
    assert "'*visual.blocks*'" in problem and "#36426" in problem


def test_verify_loads_each_vision_linear_stock_and_plugin_against_the_independent_decode(cli_json):  # noqa: F811
    """verify's rows for the target's tower: sglang's own ``load_weights`` put the raw codes
    there stock (absmax 127 or 128) and, with the plugin, the independent decode bit for bit."""
    code, report = cli_json("verify", VL)
    assert code == 0 and report["verdict"] == "ok", report.get("reason")
    rows = {r["parameter"]: r for r in report["parameters"] if r["parameter"].startswith("target ")}
    assert sorted(rows) == [
        f"target visual.blocks.0.{layer}.weight"
        for layer in ("attn.proj", "attn.qkv_proj", "mlp.linear_fc1")
    ]
    for row in rows.values():
        assert row["check"] == "exact" and row["quantized"]
        assert row["stock_absmax"] in (127.0, 128.0) and row["plugin_absmax"] < 2
    assert "12 draft and 3 target parameters equal the reference bit for bit" in report["reason"]
