"""The console script's answers to each way a new user can get it wrong, and its plumbing.

Input errors are answered before sglang (or torch) is imported: each scenario runs in a fresh
interpreter that reports whether either was imported, and how long the answer took. The rest
(verdicts, exit codes, --json, logs, the plugin's activation) runs in this process on the real
fixtures, sglang 0.5.23's real classes and loader, and sglang's own plugin loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.verdicts import EXIT_CODES, MEANINGS
from support.paths import fixture_dir, reference_file

PROBE = """
import json, sys, time
started = time.perf_counter()
from sglang_mtp_dequant.tools.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "sglang": "sglang" in sys.modules, "torch": "torch" in sys.modules,
                  "seconds": time.perf_counter() - started}))
"""


def run_fresh(*args: str, env: dict | None = None) -> tuple[dict, str, float]:
    """The CLI in a new interpreter: (what it imported and returned, its stdout, the seconds
    from importing the CLI to its answer; the interpreter's own start-up is not counted, so a
    loaded test machine does not make the figure flaky)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    *text, probe = out.stdout.rstrip().splitlines()
    found = json.loads(probe)
    return found, "\n".join(text), found["seconds"]


def assert_instant(probe: dict, seconds: float) -> None:
    assert probe["code"] == EXIT_CODES["error"] == 1
    assert not probe["sglang"] and not probe["torch"], probe
    assert seconds < 2.0, f"took {seconds:.2f} s"


@pytest.mark.parametrize("command", ["doctor", "verify"])
def test_a_path_that_does_not_exist(tmp_path, command):
    probe, out, seconds = run_fresh(command, str(tmp_path / "nope"))
    assert_instant(probe, seconds)
    assert f"problem: {tmp_path / 'nope'}: does not exist. What to do: pass the checkpoint" in out
    assert out.splitlines()[-1] == "verdict: error - does not exist"


def test_a_file_instead_of_a_folder():
    file = os.path.join(fixture_dir("q35_dense_w8a8_dynamic"), "config.json")
    probe, out, seconds = run_fresh("doctor", file)
    assert_instant(probe, seconds)
    assert f"{file}: is a file, not a checkpoint folder" in out
    assert f"pass the folder that holds it ({os.path.dirname(file)})" in out


def test_a_folder_without_config(tmp_path):
    probe, out, seconds = run_fresh("doctor", str(tmp_path))
    assert_instant(probe, seconds)
    assert f"{tmp_path}: holds no config.json" in out


def test_a_hub_cache_entry_instead_of_its_snapshot(tmp_path):
    (tmp_path / "snapshots").mkdir()
    probe, out, seconds = run_fresh("doctor", str(tmp_path))
    assert_instant(probe, seconds)
    assert "this is a Hugging Face cache entry: pass its snapshots/<commit> folder" in out


def test_a_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    probe, out, seconds = run_fresh("doctor", str(tmp_path), "--json")
    assert_instant(probe, seconds)
    report = json.loads(out)
    assert report["error_kind"] == "no-weights" and report["verdict"] == "error"
    assert report["path"] == str(tmp_path) and "draft_dtype" not in report
    assert report["problems"] == [
        f"{tmp_path}: holds no *.safetensors weight file (only pytorch_model.bin). What to do: "
        "pass the folder with the checkpoint's weights; ModelSlim exports and this plugin use "
        "safetensors files"
    ]


def test_a_hub_id_in_no_cache(tmp_path):
    probe, out, seconds = run_fresh(
        "doctor", "acme/not-here", "--download-dir", str(tmp_path),
        env={"HF_HUB_CACHE": str(tmp_path / "hub")},
    )  # fmt: skip
    assert_instant(probe, seconds)
    assert "acme/not-here: is neither a folder nor a hub model in a local cache" in out
    assert f"models--acme--not-here in {tmp_path}, {tmp_path / 'hub'}" in out


def test_a_download_dir_that_is_not_a_folder(tmp_path):
    probe, out, seconds = run_fresh(
        "doctor", "acme/x", "--download-dir", str(tmp_path / "no-such-dir")
    )
    assert_instant(probe, seconds)
    assert f"{tmp_path / 'no-such-dir'}: (--download-dir) is not a folder" in out


def test_a_missing_reference_is_refused_before_loading(tmp_path):
    probe, out, seconds = run_fresh(
        "verify", fixture_dir("q35_dense_w8a8_dynamic"), "--reference", str(tmp_path / "x.st")
    )
    assert_instant(probe, seconds)
    assert f"{tmp_path / 'x.st'}: (--reference) does not exist" in out


def test_a_reference_that_is_no_safetensors_file(tmp_path):
    bad = tmp_path / "ref.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    probe, out, seconds = run_fresh(
        "verify", fixture_dir("q35_dense_w8a8_dynamic"), "--reference", str(bad), "--json"
    )
    assert_instant(probe, seconds)
    report = json.loads(out)
    assert report["error_kind"] == "bad-reference" and report["schema_version"] == 1
    assert "(--reference) is not a readable safetensors file" in report["reason"]


def test_a_reference_without_the_drafts_tensors_is_refused_before_loading(
    sglang_cpu, tmp_path, monkeypatch
):
    """Readable, but none of its names is a decoded draft tensor: said before any load."""
    import torch

    from sglang_mtp_dequant.tools.verify import run as verify_run

    other = tmp_path / "other.safetensors"
    save_file({"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}, str(other))
    loads = []
    monkeypatch.setattr(verify_run, "_load", lambda *a, **k: loads.append(a))
    report = verify_run.run_verify(fixture_dir("q35_dense_w8a8_dynamic"), reference=str(other))
    assert loads == [] and report.verdict == "error" and report.rows == []
    assert f"{other} (--reference) holds none of the 7 draft tensors the plugin decodes" in (
        report.reason
    )


def test_version_and_help_list_verdicts_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("sglang-mtp-dequant 0.1.0 (sglang 0.5.23)")
    for command in ([], ["doctor"], ["verify"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = capsys.readouterr().out
        for verdict, code in EXIT_CODES.items():
            assert f"  {code}  {verdict:<12} {MEANINGS[verdict]}" in text


def test_one_log_file_per_run_named_in_the_output(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    logs = []
    for _ in range(2):
        assert main(["doctor", fixture_dir("q35_dense_float_mtp"), "--json"]) == 0
        captured = capsys.readouterr()
        report = json.loads(captured.out)
        assert captured.err.strip() == f"(sglang's own output: {report['log']})"
        logs.append(report["log"])
    assert logs[0] != logs[1] and all(os.path.isfile(p) and os.path.isabs(p) for p in logs)
    assert {os.path.dirname(p) for p in logs} == {str(tmp_path)}


def test_verbose_shows_the_plugins_own_info_line(sglang_cpu, capfd):
    """verify -v: sglang's output and the plugin's INFO line (the one the README tells users
    to look for in the server log) reach the terminal."""
    code = main(["verify", fixture_dir("q35_dense_w8a8_dynamic"), "-v"])
    err = capfd.readouterr().err
    assert code == 0
    assert "sglang-mtp-dequant: Qwen3_5ForCausalLMMTP draft from" in err
    assert "dequantized 7 tensors (W8A8_DYNAMIC x7) to bfloat16" in err


def test_the_plugins_info_line_is_in_the_log_without_verbose(sglang_cpu, capsys, tmp_path):
    log = tmp_path / "run.log"
    assert main(["verify", fixture_dir("q35_dense_w8a8_dynamic"), "--log", str(log)]) == 0
    capsys.readouterr()
    assert "dequantized 7 tensors (W8A8_DYNAMIC x7) to bfloat16" in log.read_text()


def test_verify_json_has_a_schema_version(sglang_cpu, capsys, tmp_path):
    name = "q35_dense_w8a8_dynamic"
    code = main(["verify", fixture_dir(name), "--json", "--log", str(tmp_path / "l"),
                 "--reference", reference_file(name)])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["schema_version"] == 1 and report["verdict"] == "ok"
    assert report["folder"] == fixture_dir(name) and report["reference"] == reference_file(name)
    assert report["draft_class"] == "Qwen3_5ForCausalLMMTP" and len(report["parameters"]) == 12
    assert {p["check"] for p in report["parameters"]} == {"exact"}


# -- the plugin in the user's sglang ---------------------------------------------------------


@pytest.fixture
def doctor_json(capsys, tmp_path):
    def run(path: str, *extra: str) -> tuple[int, dict]:
        code = main(["doctor", path, "--json", "--log", str(tmp_path / "log"), *extra])
        return code, json.loads(capsys.readouterr().out)

    return run


@pytest.mark.parametrize("value", ["none", "other_plugin", " other , x "])
def test_sglang_plugins_excluding_the_plugin_is_inactive(doctor_json, monkeypatch, value):
    monkeypatch.setenv("SGLANG_PLUGINS", value)
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"))
    assert code == EXIT_CODES["inactive"] == 5 and report["verdict"] == "inactive"
    assert report["plugin_active"] is False
    assert f"SGLANG_PLUGINS={value!r} does not name mtp_dequant" in report["reason"]


@pytest.mark.parametrize("value", ["", "mtp_dequant", "other,mtp_dequant"])
def test_sglang_plugins_naming_the_plugin_or_empty_is_active(doctor_json, monkeypatch, value):
    """sglang's rule: an empty value filters nothing."""
    monkeypatch.setenv("SGLANG_PLUGINS", value)
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"))
    assert code == 0 and report["plugin_active"] is True


def test_a_float_draft_with_the_plugin_excluded_is_ok_with_a_note(doctor_json, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "none")
    code, report = doctor_json(fixture_dir("q35_dense_float_mtp"))
    assert code == 0 and report["plugin_active"] is False
    assert any(n.startswith("sglang here would not load the plugin") for n in report["notes"])


def test_a_missing_entry_point_is_inactive(doctor_json, monkeypatch):
    """The package importable (e.g. on PYTHONPATH) but not installed where sglang looks."""
    from sglang_mtp_dequant.tools import activation

    monkeypatch.setattr(activation, "_entry_points", lambda group: [])
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"))
    assert (
        code == 5
        and "no entry point 'mtp_dequant' in group sglang.srt.plugins" in (report["reason"])
    )


def test_verify_with_the_hook_not_installed_is_inactive(sglang_cpu, monkeypatch):
    from sglang_mtp_dequant.tools.verify import run as verify_run

    monkeypatch.setenv("SGLANG_PLUGINS", "none")
    monkeypatch.setattr(verify_run.context, "registered_targets", lambda: frozenset())
    report = verify_run.run_verify(fixture_dir("q35_dense_w8a8_dynamic"))
    assert report.verdict == "inactive" and "SGLANG_PLUGINS='none'" in report.reason


# -- what could not be checked -------------------------------------------------------------------


def test_no_dry_run_is_unchecked_with_its_reason(doctor_json):
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"), "--no-dry-run")
    assert code == EXIT_CODES["unchecked"] == 3 and report["verdict"] == "unchecked"
    assert report["reason"].startswith("nothing wrong found, but not checked: the dry run was")


def test_a_dry_run_that_cannot_run_is_unchecked_never_ok(doctor_json, monkeypatch):
    from sglang_mtp_dequant.tools import dryrun

    def broken(*_args, **_kwargs):
        raise AssertionError("a CPU-only assertion")

    monkeypatch.setattr(dryrun, "simulate_load", broken)
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"))
    assert code == 3 and report["verdict"] == "unchecked"
    assert report["dry_run"] == "not run (AssertionError: a CPU-only assertion)"
    assert "AssertionError: a CPU-only assertion" in report["reason"]


def test_an_unhooked_draft_class_with_codes_is_unsupported(doctor_json, monkeypatch):
    """Not a plugin failure: "not supported (yet)", exit 4 (the real class is built; the
    plugin is made to hook none)."""
    from sglang_mtp_dequant.tools.doctor import analysis

    monkeypatch.setattr(analysis, "spec_for_class", lambda cls: None)
    monkeypatch.setattr(analysis, "spec_for_architecture", lambda arch: None)
    code, report = doctor_json(fixture_dir("q35_dense_w8a8_dynamic"))
    assert code == EXIT_CODES["unsupported"] == 4 and report["verdict"] == "unsupported"
    assert report["draft_class"] == "Qwen3_5ForCausalLMMTP"
    assert "which this plugin does not hook (not supported yet)" in report["reason"]
