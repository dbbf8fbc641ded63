"""Every MTP draft loads right or is refused, quantized or not: compressed-tensors and ModelOpt
checkpoints written by the libraries themselves (``fixtures/compressed_tensors``,
``fixtures/modelopt``), drafts built as sglang builds them on CUDA and on NPU.

What is real: sglang 0.5.23's ``ServerArgs``, draft ``ModelConfig``, quantization config
(compressed-tensors' schemes picked as on an sm90 GPU), ``Qwen3_5ForCausalLMMTP`` and
``DefaultModelLoader`` stream, its plugins loaded by ``load_plugins()``. What is stood in, as
the CLI does it (``tools/launch.py``): ``torch.cuda.get_device_capability()`` answers (9, 0)
while the draft is built for CUDA, the draft classes' ``is_npu`` answers True for NPU.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.guard import MisloadedDraftError
from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.verify.independent import independent_dequantize
from support.paths import E2E, FIXTURES, MODELSLIM

CT = os.path.join(FIXTURES, "compressed_tensors")
MO = os.path.join(FIXTURES, "modelopt")
W4A16, W8A8, NVFP4 = "q35_ct_w4a16_fc", "q35_ct_w8a8_int", "q35_ct_nvfp4"
PUBLISHED = "q35_ct_w4a16_mtp_ignored"
FORMATS = {W4A16: "pack-quantized", W8A8: "int-quantized", NVFP4: "nvfp4-pack-quantized"}
PLUGIN_LOG = "sglang_mtp_dequant"


def ct(name: str) -> str:
    return os.path.join(CT, name)


@pytest.fixture
def load_as(sglang_cpu, caplog):
    """Build the real draft for a folder as sglang does on ``device`` and load it through
    sglang's DefaultModelLoader stream, with the plugin's hook (``plugin=True``) or bypassed."""
    from sglang_mtp_dequant.serving.plugin import bypassed
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
        sglang_weights,
    )
    from sglang_mtp_dequant.tools.launch import parse_launch

    caplog.set_level(logging.INFO)

    def load(folder: str, device: str = "cuda", plugin: bool = True):
        launch = parse_launch(folder, ["--device", device])
        publish_context(folder, **launch.server_args())
        config = draft_model_config(folder)
        with launch.platform():
            model = build_draft(config)
        for param in model.parameters():
            if param.is_floating_point():
                param.data.fill_(float("nan"))  # a part never written stays NaN
        if plugin:
            model.load_weights(sglang_weights(config, model))
        else:
            with bypassed():
                model.load_weights(sglang_weights(config, model))
        return model

    return load


def params(model) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "embed_tokens" not in n and "lm_head" not in n  # taken from the target
    }


def expected_fc(folder: str) -> torch.Tensor:
    """``fc.weight`` by verify's independent rule (the format's own formula, fp32, rounded once)."""
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    stored = "mtp.fc.weight_packed" if "mtp.fc.weight_packed" in tensors else "mtp.fc.weight"
    fmt = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]["format"]
    weight = independent_dequantize(tensors, stored, f"compressed-tensors {fmt}", None)
    assert weight is not None
    return weight.bfloat16()


def edited(src: str, dest, drop=(), cast: dict | None = None, codes=()) -> str:
    """A copy of fixture folder ``src`` without the tensors ``drop``, ``cast`` ones as the
    given dtype, and ``codes`` ones replaced by their int8 codes (per-row absmax), no scale."""
    folder = str(dest)
    shutil.copytree(src, folder)
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for name in drop:
        del tensors[name]
    for name, dtype in (cast or {}).items():
        tensors[name] = tensors[name].to(dtype)
    for name in codes:
        weight = tensors[name].float()
        scale = weight.abs().amax(-1, keepdim=True) / 127
        tensors[name] = torch.round(weight / scale).to(torch.int8)
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


# -- drafts sglang builds quantized (CUDA) ----------------------------------------------------


@pytest.mark.parametrize("fixture", [W4A16, W8A8, NVFP4])
def test_stock_sglang_misloads_fc_of_a_quantized_draft_silently(load_as, caplog, fixture):
    """The bug, as it is: on CUDA the draft is built quantized and its plain nn.Linear ``fc``
    gets nothing (packed formats: skipped) or raw int8 codes with the scale dropped."""
    model = load_as(ct(fixture), plugin=False)
    assert model.quant_config is not None
    fc = model.fc.weight.detach().float()
    if fixture == W8A8:
        assert fc.abs().max() == 128.0  # int8 codes in a bf16 parameter
    else:
        assert fc.isnan().all()  # never written: uninitialised memory on a GPU
    assert not [r for r in caplog.records if r.name == PLUGIN_LOG]


@pytest.mark.parametrize("fixture", [W4A16, W8A8, NVFP4])
def test_plugin_decodes_fc_with_compressed_tensors_and_leaves_the_rest_to_sglang(
    load_as, caplog, fixture
):
    stock = params(load_as(ct(fixture), plugin=False))
    caplog.clear()
    plugin = params(load_as(ct(fixture)))
    assert torch.equal(plugin["fc.weight"], expected_fc(ct(fixture)))
    for name, value in plugin.items():  # every other parameter exactly as sglang loaded it
        if name != "fc.weight":
            assert torch.equal(value, stock[name]), name
    (line,) = [r.getMessage() for r in caplog.records if r.name == PLUGIN_LOG]
    assert "is built quantized (compressed_tensors)" in line
    assert f"(compressed-tensors {FORMATS[fixture]} x1) by compressed-tensors to bfloat16" in line


def test_the_published_layout_loads_untouched_and_silent(load_as, caplog):
    """Every mtp.* linear in quantization_config.ignore: sglang loads it right itself."""
    stock = params(load_as(ct(PUBLISHED), plugin=False))
    caplog.clear()
    plugin = params(load_as(ct(PUBLISHED)))
    assert stock.keys() == plugin.keys()
    for name in stock:
        assert torch.equal(plugin[name], stock[name]), name
        assert not plugin[name].isnan().any(), name
    assert not [r for r in caplog.records if r.name == PLUGIN_LOG and r.levelno >= logging.INFO]


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_a_plain_linear_never_written_is_refused_naming_it(load_as, tmp_path, device):
    """``mtp.fc.weight_packed`` missing: its companions stream to sglang, which skips them, and
    the guard names ``fc.weight``, the names meant for it, and (built quantized) the format."""
    folder = edited(ct(W4A16), tmp_path / "ckpt", drop=["mtp.fc.weight_packed"])
    with pytest.raises(MisloadedDraftError) as caught:
        load_as(folder, device=device)
    (finding,) = caught.value.findings
    assert finding.parameter == "fc.weight" and finding.unwritten == "no write at all"
    assert {"mtp.fc.weight_scale", "mtp.fc.weight_shape"} <= set(caught.value.skipped)
    message = str(caught.value)
    assert "fc.weight [bfloat16 [64, 128]]: never written by sglang's loaders" in message
    assert "only mtp.fc.weight_scale, mtp.fc.weight_shape, which sglang's loaders skipped" in (
        message
    )
    built = "built quantized (compressed_tensors; config.json: compressed-tensors (pack-quantized))"
    npu_advice = "--speculative-draft-model-quantization modelslim"
    if device == "cuda":
        assert built in message and "needs its float weight in the checkpoint" in message
        assert npu_advice not in message
    else:
        assert "built quantized" not in message and npu_advice in message


#: fc codes the plugin cannot decode, refused before any write: (fixture, edit, what it says)
UNDECODABLE_FC = {
    "companion-missing": (
        W4A16,
        {"drop": ["mtp.fc.weight_shape"]},
        ["draft tensor 'mtp.fc.weight_packed'", "but the checkpoint has no mtp.fc.weight_shape"],
    ),
    # int8 mtp.fc.weight in the published layout, whose quantization_config ignores mtp.fc
    "codes-the-config-ignores": (
        PUBLISHED,
        {"codes": ["mtp.fc.weight"]},
        [
            "draft tensor 'mtp.fc.weight'",
            "is stored as compressed-tensors int-quantized",
            "quantization_config does not quantize it",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(UNDECODABLE_FC))
def test_fc_codes_nothing_can_decode_are_refused_before_any_write(load_as, tmp_path, case):
    fixture, edit, said = UNDECODABLE_FC[case]
    folder = edited(ct(fixture), tmp_path / "ckpt", **edit)
    with pytest.raises(DraftWeightError) as caught:
        load_as(folder)
    assert type(caught.value) is DraftWeightError  # the plan's refusal, not the guard's
    for words in said:
        assert words in str(caught.value)


def test_codes_stored_as_floats_in_a_plain_linear_are_refused_by_value(load_as, tmp_path):
    """int8 codes saved as bf16 (no dtype gives them away): the plan keeps a float tensor,
    sglang copies it, and the guard's value check refuses ``fc.weight``."""
    folder = edited(ct(W8A8), tmp_path / "ckpt", cast={"mtp.fc.weight": torch.bfloat16})
    with pytest.raises(MisloadedDraftError) as caught:
        load_as(folder)
    (finding,) = caught.value.findings
    assert finding.parameter == "fc.weight" and finding.evidence is not None
    assert "raw codes instead of weights" in str(caught.value)


#: checkpoints sglang builds quantized on CUDA, broken in a way the plugin cannot decode away:
#: (fixture, edit, the draft parameter the refusal names)
BROKEN_QUANTIZED = {
    "norm-as-int8-codes": (W8A8, {"codes": ["mtp.norm.weight"]}, "model.norm.weight"),
    "quantized-layer-scale-missing": (
        W8A8,
        {"drop": ["mtp.layers.0.mlp.down_proj.weight_scale"]},
        "model.layers.0.mlp.down_proj.weight_scale",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_QUANTIZED))
def test_a_quantized_draft_left_with_codes_or_holes_is_refused_naming_the_parameter(
    load_as, cli_json, tmp_path, case
):
    """(b) codes in a plain float parameter (a norm) whose scale nothing read; (a) a parameter a
    quantization method owns left unwritten. The load is refused; the doctor says so first."""
    fixture, edit, parameter = BROKEN_QUANTIZED[case]
    folder = edited(ct(fixture), tmp_path / "ckpt", **edit)
    with pytest.raises(MisloadedDraftError) as caught:
        load_as(folder)
    (finding,) = caught.value.findings
    assert finding.parameter == parameter
    if "codes" in edit:
        (source,) = finding.sources
        assert source.name == edit["codes"][0] and source.raw_codes
        assert f"fed by {edit['codes'][0]} (int8, copied as raw codes)" in str(caught.value)
    else:
        assert finding.unwritten == "no write at all"
    code, report = cli_json("doctor", folder, "--device", "cuda")
    assert code == 1 and report["verdict"] == "error"
    named = [*report["problems"], *report["unfilled_parameters"]]
    assert any(p.startswith(parameter) for p in named), named


def test_codes_in_a_linear_the_config_ignores_are_refused_before_any_write(
    load_as, cli_json, tmp_path
):
    """int8 codes with no scale in a linear the config ignores (sglang builds it unquantized):
    the plugin's plan, which decodes what sglang builds unquantized over codes, finds nothing
    says how they were quantized and refuses the tensor before any write; the doctor first."""
    name = "mtp.layers.0.self_attn.o_proj.weight"
    folder = edited(ct(PUBLISHED), tmp_path / "ckpt", codes=[name])
    with pytest.raises(DraftWeightError) as caught:
        load_as(folder)
    assert type(caught.value) is DraftWeightError  # the plan's refusal, not the guard's
    said = str(caught.value)
    assert name in said and "quantization_config does not quantize it" in said, said
    code, report = cli_json("doctor", folder, "--device", "cuda")
    assert code == 1 and report["verdict"] == "error"
    (row,) = [t for t in report["tensors"] if t["name"] == name]
    assert row["action"] == "error" and "does not quantize it" in row["reason"], row


# -- drafts sglang builds unquantized (NPU; ModelOpt NVFP4 on any platform) --------------------


@pytest.mark.parametrize("fixture", [W4A16, W8A8, NVFP4])
def test_on_npu_the_whole_draft_is_decoded_by_compressed_tensors(load_as, fixture):
    model = load_as(ct(fixture), device="npu")
    assert model.quant_config is None
    loaded = params(model)
    assert torch.equal(loaded["fc.weight"], expected_fc(ct(fixture)))
    assert all(not v.isnan().any() for v in loaded.values())


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_modelopt_nvfp4_mtp_is_decoded_within_one_ulp_of_modelopts_formula(load_as, device):
    folder = os.path.join(MO, "q35_modelopt_nvfp4_mtp")
    model = load_as(folder, device=device)
    assert model.quant_config is None  # sglang forces serialized modelopt_fp4 drafts unquantized
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    want = independent_dequantize(tensors, "mtp.fc.weight", "ModelOpt NVFP4", None).bfloat16()
    got = model.fc.weight.detach()
    apart = ((got + 0.0).view(torch.int16).int() - (want + 0.0).view(torch.int16).int()).abs()
    assert int(apart.max()) <= 1  # compressed-tensors' converter rounds its scale its own way


def test_modelopt_nvfp4_with_a_bf16_mtp_is_left_alone(load_as, caplog):
    model = load_as(os.path.join(MO, "q35_modelopt_nvfp4"), device="cuda")
    source = load_file(os.path.join(MO, "q35_modelopt_nvfp4", "model.safetensors"))
    assert torch.equal(model.fc.weight.detach(), source["mtp.fc.weight"])
    assert not [r for r in caplog.records if r.name == PLUGIN_LOG and r.levelno >= logging.INFO]


# -- doctor and verify for the user's launch --------------------------------------------------


@pytest.fixture
def cli_json(capsys, tmp_path):
    def run(*args: str) -> tuple[int, dict]:
        code = main([*args, "--json", "--log", str(tmp_path / "cli.log")])
        return code, json.loads(capsys.readouterr().out)

    return run


@pytest.mark.parametrize("fixture", [W4A16, W8A8, NVFP4, PUBLISHED])
def test_doctor_for_cuda_names_the_quantized_build_and_what_happens_to_fc(cli_json, fixture):
    code, report = cli_json("doctor", ct(fixture), "--device", "cuda")
    assert code == 0 and report["verdict"] == "ok", report["reason"]
    assert report["built_quantized"] == "compressed_tensors"
    assert report["launch"].startswith("asked for the launch `--device cuda`, as on CUDA")
    assert report["unfilled_parameters"] == {}
    fc = [t for t in report["tensors"] if t["name"].startswith("mtp.fc.")]
    if fixture == PUBLISHED:
        assert [t["action"] for t in fc] == ["keep"]
        assert "only checks the load" in report["reason"]
    else:
        (row,) = fc
        assert row["action"] == "dequantize" and "decoded by compressed-tensors" in row["reason"]
        assert "fc.weight would hold uninitialised memory or raw codes" in report["stock_sglang"]


@pytest.mark.parametrize("fixture", [W4A16, W8A8, PUBLISHED])
def test_doctor_for_cuda_says_inactive_when_sglang_would_not_load_the_plugin(
    cli_json, monkeypatch, fixture
):
    """The two exports whose fc only the plugin decodes need it (exit 5 without it); the
    published layout does not (exit 0)."""
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    code, report = cli_json("doctor", ct(fixture), "--device", "cuda")
    if fixture == PUBLISHED:
        assert code == 0 and report["verdict"] == "ok", report["reason"]
    else:
        assert code == 5 and report["verdict"] == "inactive", report["reason"]
        assert "SGLANG_PLUGINS='some_other_plugin' does not name mtp_dequant" in report["reason"]


def test_doctor_for_cuda_refuses_what_the_load_refuses(cli_json, tmp_path):
    dropped = edited(ct(W4A16), tmp_path / "a", drop=["mtp.fc.weight_packed"])
    code, report = cli_json("doctor", dropped, "--device", "cuda")
    assert code == 1 and report["unfilled_parameters"] == {"fc.weight": "no write at all"}
    incomplete = edited(ct(W4A16), tmp_path / "b", drop=["mtp.fc.weight_shape"])
    code, report = cli_json("doctor", incomplete, "--device", "cuda")
    assert code == 1
    (row,) = [t for t in report["tensors"] if t["action"] == "error"]
    assert row["name"] == "mtp.fc.weight_packed"


def test_doctor_without_flags_answers_as_on_npu_and_says_so(cli_json):
    code, report = cli_json("doctor", ct(W4A16))
    assert code == 0 and report["built_quantized"] is None and report["plugin_acts"]
    assert report["launch"].startswith("asked as on NPU with the draft quantization unset")


def test_doctor_takes_the_whole_launch_command_after_a_double_dash(capsys, tmp_path):
    code = main([
        "doctor", "--json", "--log", str(tmp_path / "log"), "--", "python", "-m",
        "sglang.launch_server", "--model-path", ct(W8A8), "--device", "cuda",
        "--speculative-algorithm", "EAGLE", "--tp-size", "2",
    ])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["built_quantized"] == "compressed_tensors"
    assert "--speculative-algorithm EAGLE" in report["launch"]
    assert any(n.startswith("--tp-size 2 / --ep-size 1") for n in report["notes"])


def test_a_flag_sglang_does_not_know_is_a_usage_error(cli_json):
    code, report = cli_json("doctor", ct(W8A8), "--device", "cuda", "--no-such-flag")
    assert code == 1 and "sglang's launch_server parser refused the flags" in report["reason"]


@pytest.mark.parametrize("command", ["doctor", "verify"])
def test_json_alone_on_stdout_progress_on_stderr(tmp_path, command):
    """``sglang-mtp-dequant verify --json | jq`` works: stdout parses as JSON as it is."""
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mtp_dequant.tools.cli", command, ct(W8A8), "--device",
         "cuda", "--json", "--log", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["verdict"] == "ok", out.stderr[-2000:]
    assert "(sglang's own output:" in out.stderr
    if command == "verify":
        assert "plugin load (hooked load_weights)" in out.stderr
        quantized = [p for p in report["parameters"] if p["quantized"]]
        assert [(p["parameter"], p["check"]) for p in quantized] == [("fc.weight", "exact")]


PROJECTIONS = {
    "fc.weight",
    "model.layers.0.qkv_proj.weight",
    "model.layers.0.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
}
LIBRARY_FIXTURES = [*(ct(f) for f in (W4A16, W8A8, NVFP4, PUBLISHED))] + [
    os.path.join(MO, f) for f in ("q35_modelopt_nvfp4_mtp", "q35_modelopt_nvfp4")
]


@pytest.mark.parametrize("device", ["npu", "cuda"])
@pytest.mark.parametrize("folder", LIBRARY_FIXTURES, ids=os.path.basename)
def test_verify_checks_every_library_fixture_against_the_formats_own_formula(
    cli_json, folder, device
):
    """Each library-written fixture, loaded as sglang builds it on ``device``: every
    parameter the plugin decoded equals verify's independent fp32 rule (bf16 rounded once;
    ModelOpt: within one bf16 ulp), and every other parameter equals stock sglang's load."""
    code, report = cli_json("verify", folder, "--device", device)
    assert code == 0 and report["verdict"] == "ok", report.get("reason")
    decoded = {p["parameter"]: p["check"] for p in report["parameters"] if p["quantized"]}
    rest = {p["parameter"]: p["check"] for p in report["parameters"] if not p["quantized"]}
    assert rest and set(rest.values()) == {"exact"}, rest
    quantized_mtp = os.path.basename(folder) not in (PUBLISHED, "q35_modelopt_nvfp4")
    built_quantized = device == "cuda" and "compressed_tensors" in folder
    if not quantized_mtp:
        assert decoded == {}
    elif built_quantized:  # the quantized layers are sglang's; the plugin decodes fc alone
        assert decoded == {"fc.weight": "exact"}
    else:
        assert set(decoded) == PROJECTIONS
        allowed = {"exact", "ulp"} if "modelopt" in folder else {"exact"}
        assert set(decoded.values()) <= allowed, decoded


#: the checkpoints this package was built for: (folder, the doctor's verdict before this change)
#: the three Qwen3 V0 exports have no MTP layer: "no draft (MTP) tensors" is their error
EXISTING = [
    *((os.path.join(MODELSLIM, n), "error" if n.startswith("qwen3_v0") else "ok")
      for n in sorted(os.listdir(MODELSLIM))
      if os.path.isfile(os.path.join(MODELSLIM, n, "config.json"))),
    *((os.path.join(E2E, n), "ok") for n in sorted(os.listdir(E2E))
      if os.path.isfile(os.path.join(E2E, n, "config.json"))),
]  # fmt: skip


@pytest.mark.parametrize("flags", [(), ("--device", "npu"), ("--device", "cuda")], ids=str)
def test_every_existing_fixture_keeps_its_verdict_for_any_platform(cli_json, flags):
    """The ModelSlim and e2e fixtures: the doctor's verdict (and its exit code) is the one it
    gave before launch flags and the quantized-draft guard, on every platform asked."""
    assert len(EXISTING) == 31  # 21 ModelSlim fixtures (2 NextN-FLOAT derived), 10 e2e ones
    got = {}
    for folder, _ in EXISTING:
        code, report = cli_json("doctor", folder, *flags)
        got[folder] = (code, report["verdict"])
    want = {folder: ({"ok": 0, "error": 1}[v], v) for folder, v in EXISTING}
    assert got == want
