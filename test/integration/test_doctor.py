"""``sglang-mtp-dequant doctor`` on the real msmodelslim fixtures and on broken copies of them.

The doctor must say what the plugin will do: every claim is checked against the real load
(sglang's draft class, the real hook): "ok" checkpoints load, "error" ones are refused with
the tensor the doctor named, and its "stock sglang" claims match sglang's unwrapped loader.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.context import sglang_version
from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.doctor import diagnose
from sglang_mtp_dequant.tools.doctor.analysis import STOCK_LOUD, STOCK_SILENT, STOCK_UNKNOWN
from support.checkpoints import dropping, edit_description, edit_tensors
from support.paths import DENSE_W8, fixture_dir

Q35 = (*DENSE_W8, "q35moe_w8a8_dynamic", "q35_dense_float_mtp", "q35_dense_w4a8_dynamic")


UNDECODED = "W4A4_MXFP4_SVD"  # a type msmodelslim writes and this plugin does not decode


def undecoded_scheme_copy(copy_checkpoint) -> str:
    """The W8A8_DYNAMIC fixture with its int8 MTP weights described as a scheme we do not
    decode (stock sglang would copy their codes)."""
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    names = int8_draft_weights(folder)
    edit_description(folder, lambda desc: desc.update(dict.fromkeys(names, UNDECODED)))
    return folder


@pytest.fixture
def sglang_log(tmp_path) -> str:
    """Where the CLI sends sglang's own output (never the system temp dir in tests)."""
    return str(tmp_path / "sglang.log")


@pytest.fixture
def doctor_json(capsys, sglang_log):
    def run(path: str) -> tuple[int, dict]:
        code = main(["doctor", path, "--json", "--log", sglang_log])
        return code, json.loads(capsys.readouterr().out)

    return run


def int8_draft_weights(folder: str) -> list[str]:
    names = []
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        for name, tensor in load_file(path).items():
            if name.startswith("mtp.") and tensor.dtype == torch.int8 and name.endswith(".weight"):
                names.append(name)
    return sorted(names)


@pytest.mark.parametrize("name", (*DENSE_W8, "q35moe_w8a8_dynamic", "q35_dense_w4a8_dynamic"))
def test_one_dequantize_per_int8_draft_weight_and_ok(doctor_json, name):
    folder = fixture_dir(name)
    code, report = doctor_json(folder)
    assert code == 0 and report["verdict"] == "ok"
    planned = sorted(t["name"] for t in report["tensors"] if t["action"] == "dequantize")
    assert planned == int8_draft_weights(folder)
    assert len(planned) == (15 if name.startswith("q35moe") else 7)
    assert {t["action"] for t in report["tensors"]} == {"dequantize", "keep"}
    for row in report["tensors"]:
        assert set(row) >= {"name", "dtype", "shape", "scheme", "action", "reason"}
        if row["action"] == "dequantize":
            assert row["dtype"] == "int8" and row["scheme"] == row["description"]
            packed = name == "q35_dense_w4a8_dynamic"  # two int4 codes per byte
            assert row["stock"] == (STOCK_LOUD if packed else STOCK_SILENT)
    assert report["draft_class"] == "Qwen3_5ForCausalLMMTP" and report["hooked"] is True
    if name != "q35_dense_w4a8_dynamic":
        assert "copies the codes of" in report["stock_sglang"]
    assert report["schema_version"] == 4 and report["unfilled_parameters"] == {}
    assert report["folder"] == folder and "DefaultModelLoader" in report["resolved_by"]
    assert (
        report["dry_run"] == "Qwen3_5ForCausalLMMTP on the meta device, through the plugin's stream"
    )


def test_float_mtp_checkpoint_is_ok_with_nothing_to_do(doctor_json):
    code, report = doctor_json(fixture_dir("q35_dense_float_mtp"))
    assert code == 0 and report["verdict"] == "ok"
    assert report["counts"] == {"dequantize": 0, "keep": 15, "pass": 0, "error": 0}
    assert report["stock_sglang"].endswith("as the float it is: nothing to fix")


def test_undecoded_scheme_is_an_error_naming_each_tensor(doctor_json, copy_checkpoint):
    folder = undecoded_scheme_copy(copy_checkpoint)
    code, report = doctor_json(folder)
    assert code == 1 and report["verdict"] == "error"
    errors = [t for t in report["tensors"] if t["action"] == "error"]
    assert sorted(t["name"] for t in errors) == int8_draft_weights(folder)
    for row in errors:
        assert f"draft tensor {row['name']!r}" in row["reason"]
        assert f"{UNDECODED}, a scheme this plugin does not decode" in row["reason"]
        assert row["stock"] == STOCK_UNKNOWN


def missing_scale_copy(copy_checkpoint) -> str:
    """The W8A8_DYNAMIC fixture without ``mtp.layers.0.mlp.up_proj.weight_scale``."""
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    edit_tensors(folder, dropping("mtp.layers.0.mlp.up_proj.weight_scale"))
    index = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    os.chmod(index, 0o644)
    os.remove(index)  # the index would otherwise (rightly) name the missing tensor's shard
    return folder


def test_missing_scale_is_an_error_naming_the_tensor(doctor_json, copy_checkpoint):
    folder = missing_scale_copy(copy_checkpoint)
    code, report = doctor_json(folder)
    assert code == 1 and report["verdict"] == "error"
    (error,) = [t for t in report["tensors"] if t["action"] == "error"]
    assert error["name"] == "mtp.layers.0.mlp.up_proj.weight"
    assert "has no mtp.layers.0.mlp.up_proj.weight_scale" in error["reason"]
    assert error["companions"] == ["mtp.layers.0.mlp.up_proj.weight_offset"]


def test_quantized_types_stored_as_float_are_noted_and_left_to_the_guard(
    doctor_json, copy_checkpoint, load_draft
):
    """Headers cannot tell dequantized-upstream weights from codes stored as floats: the doctor
    keeps them and says so; the real load then stops on the guard (test_guard.py)."""
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    name = "mtp.layers.0.mlp.down_proj.weight"
    edit_tensors(folder, lambda t: t.update({name: t[name].to(torch.bfloat16)}))
    code, report = doctor_json(folder)
    assert code == 0 and report["counts"] == {"dequantize": 6, "keep": 9, "pass": 0, "error": 0}
    (row,) = [t for t in report["tensors"] if t["name"] == name]
    assert row["action"] == "keep" and row["reason"].startswith("described as W8A8_DYNAMIC but")
    assert report["notes"] == [
        "1 tensor(s) are described as quantized but stored as float (e.g. "
        f"{name}): passed to sglang as they are; the misload guard checks their values when "
        "sglang loads them (codes stored as floats are refused)"
    ]
    with pytest.raises(DraftWeightError, match="model.layers.0.mlp.down_proj.weight"):
        load_draft(folder)


def test_checkpoint_without_draft_tensors_is_an_error(doctor_json):
    code, report = doctor_json(fixture_dir("qwen3_v0_w4a16_per_channel"))
    assert code == 1 and report["tensors"] == []
    assert report["architecture"] == "Qwen3ForCausalLM" and report["hooked"] is False
    assert any("holds no draft (MTP) tensors" in p for p in report["problems"])


def test_not_a_folder_is_an_error(doctor_json, tmp_path):
    code, report = doctor_json(str(tmp_path / "nope"))
    assert code == 1 and report["verdict"] == "error" and report["error_kind"] == "missing-path"
    (problem,) = report["problems"]
    assert problem.startswith(f"{tmp_path / 'nope'}: does not exist. What to do:")


def test_corrupt_shard_is_an_error_naming_the_file(doctor_json, copy_checkpoint):
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    (path,) = glob.glob(os.path.join(folder, "*.safetensors"))
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.truncate(1000)
    code, report = doctor_json(folder)
    assert code == 1
    (problem,) = report["problems"]
    assert problem.startswith(f"sglang-mtp-dequant: {path}: is not a readable safetensors file")


def test_human_output_is_a_table_with_the_verdict_last(capsys, sglang_log):
    folder = fixture_dir("q35_dense_w8a8_static")
    code = main(["doctor", folder, "--log", sglang_log])
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert code == 0
    assert (
        out[1] == f"  resolved: {folder} (sglang {sglang_version()} DefaultModelLoader (offline))"
    )
    assert captured.err.strip() == f"(sglang's own output: {sglang_log})"
    assert out[-1] == "verdict: ok - the plugin loads this draft as correct float weights"
    header = next(line for line in out if line.startswith("name "))
    assert header.split() == [
        "name", "dtype", "shape", "type", "scheme", "companions", "action", "reason"
    ]  # fmt: skip
    row = next(line for line in out if line.startswith("mtp.layers.0.mlp.down_proj.weight "))
    assert row.split()[:7] == [
        "mtp.layers.0.mlp.down_proj.weight", "int8", "64x128", "W8A8", "W8A8",
        "deq_scale,input_offset,input_scale,quant_bias", "dequantize",
    ]  # fmt: skip


def test_human_output_groups_refusals_with_what_to_do(capsys, sglang_log, copy_checkpoint):
    assert main(["doctor", undecoded_scheme_copy(copy_checkpoint), "--log", sglang_log]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("verdict: error")
    refused = [line for line in out if line.strip().startswith("refused (7):")]
    assert len(refused) == 1
    assert any(line.strip().startswith("what to do: serve the draft quantized") for line in out)


def test_console_script_exit_code(copy_checkpoint, sglang_log):
    """The installed entry point, as `make demo` runs it: an error verdict exits 1 (the ok
    path's 0 and the JSON are checked in-process above); sglang's own output went to the log,
    so stdout is the JSON alone."""
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    folder = undecoded_scheme_copy(copy_checkpoint)
    bad = subprocess.run([script, "doctor", folder, "--json", "--log", sglang_log],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 1 and json.loads(bad.stdout)["verdict"] == "error"
    with open(sglang_log) as handle:
        assert "UserWarning" in handle.read()  # sglang's import-time warnings, not in stdout


BROKEN = {"undecoded-scheme": undecoded_scheme_copy, "missing-scale": missing_scale_copy}


@pytest.mark.parametrize("name", (*Q35, *BROKEN))
def test_doctor_verdict_matches_the_real_load(load_draft, copy_checkpoint, name):
    """ok <=> sglang's draft loads through the hook; error <=> refused naming a doctor error.
    Both halves run: the fixtures are ok, the broken copies of one are errors."""
    folder = BROKEN[name](copy_checkpoint) if name in BROKEN else fixture_dir(name)
    report = diagnose(folder)
    assert report.verdict == ("error" if name in BROKEN else "ok"), report.problems
    if report.verdict == "ok":
        load_draft(folder)
        return
    with pytest.raises(DraftWeightError) as caught:
        load_draft(folder)
    named = {t.name for t in report.tensors if t.action == "error"}
    assert caught.value.tensor in named


def test_stock_claims_match_stock_sglang(load_draft):
    """ "silent misload": stock holds codes (test_dense_schemes); "fails the shape check":
    stock sglang's own loader stops."""
    report = diagnose(fixture_dir("q35_dense_w4a8_dynamic"))
    packed = [t for t in report.tensors if t.dtype == "int8"]
    assert len(packed) == 7 and all(t.stock == STOCK_LOUD for t in packed)
    with pytest.raises(AssertionError, match="param_data.shape"):
        load_draft(fixture_dir("q35_dense_w4a8_dynamic"), plugin=False)
