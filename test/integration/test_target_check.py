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


def test_doctor_reports_a_target_layer_no_method_takes_as_refused(cli_json, tmp_path):  # noqa: F811
    folder = tmp_path / "w8a16_gdn"
    shutil.copytree(Q36, folder)
    path = folder / "quant_model_description.json"
    described = json.loads(path.read_text())
    path.write_text(
        json.dumps(
            {
                k: "W8A16" if ".in_proj_qkv." in k or ".in_proj_z." in k else v
                for k, v in described.items()
            }
        )
    )
    code, report = cli_json("doctor", str(folder))
    assert code == 1 and report["verdict"] == "error"
    (problem,) = [p for p in report["problems"] if p.startswith("target ")]
    assert "3 linear layer(s) no ModelSlim method takes" in problem
    assert "model.layers.2.linear_attn.in_proj_z (W8A16)" in problem
    assert "refuses the start-up" in problem and "FLOAT" in problem


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
