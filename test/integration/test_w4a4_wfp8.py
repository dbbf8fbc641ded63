"""W4A4_DYNAMIC (per channel and per group) and WFP8AFP8_DYNAMIC as msmodelslim 26.1.0 writes
them, decoded bit for bit, or refused.

What the saver writes (``modelslim_v1/save/ascendv1.py``):

- ``on_w4a4_dynamic_per_channel`` / ``_per_group``: ``weight`` int8 (out, in), ONE int4 code
  per byte (``module.weight.to(torch.int8)``, no packing); ``weight_scale`` and
  ``weight_offset`` f32 (out, 1) per channel or (out, in/G) per group, ``group_size`` G in the
  description; symmetric (zero offsets) or asymmetric (``int4_per_*_asym``).
- ``on_wfp8afp8_dynamic_per_channel``: ``weight`` float8_e4m3fn (out, in), ``weight_scale``
  f32 (out, 1), ``weight_offset`` f32 zeros (out, 1).

WFP8AFP8_DYNAMIC is also checked on the tool's own output (``q35_dense_wfp8afp8_dynamic``,
``_gen/build_mx.sh``). msmodelslim 26.1.0 cannot write W4A4_DYNAMIC on the CPU, or anywhere
through its V1 ``linear_quant`` (no int4 activation quantizer is registered: FAILED.md, 9.).

Expected values: ``reference.dequantize_affine_loops``, element by element in numpy f32, float8
codes decoded from their bit fields. The checkpoints are the float-MTP fixture's float weights
quantized with the tool's formulas (``ir/api/impl/int_quantization.py``,
``fp_quantization.py``), laid out as the saver lays them out, and loaded through sglang's
``Qwen3_5ForCausalLMMTP`` and ``DefaultModelLoader`` stream with the plugin's hook.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.formats.checkpoint import TensorInfo
from sglang_mtp_dequant.formats.schemes import scheme_for
from support.checkpoints import write_modelslim_checkpoint
from support.paths import fixture_dir, reference_file
from support.reference import (
    DENSE_PROJECTIONS,
    dequantize_affine_loops,
    description,
    load_all,
    same_bits,
)

FLOAT = "q35_dense_float_mtp"
FILE = "/ckpt/quant_model_weights.safetensors"
NAME = "mtp.layers.0.mlp.down_proj.weight"


def decode(scheme, weight, dtype=torch.bfloat16, group_size=0, **companions):
    info = TensorInfo(NAME, FILE, weight.dtype, tuple(weight.shape))
    scheme_for(scheme).check_storage(
        info, {s: TensorInfo(s, FILE, v.dtype, tuple(v.shape)) for s, v in companions.items()}
    )
    return scheme_for(scheme).prepare(info, companions, group_size).decompress(weight, dtype)


# -- msmodelslim's quantizers, re-written from int_quantization.py / fp_quantization.py --------


def quantize_int4(w: torch.Tensor, group: int, symmetric: bool) -> dict[str, torch.Tensor]:
    """``calculate_int_qparam`` + ``int_quantize`` for INT4 per channel (group 0) or per group
    of ``group`` inputs: symmetric ``scale = max|w| / 7``, offset 0; asymmetric
    ``scale = (max - min) / 15``, ``offset = round(-min / scale) - 8``;
    ``q = clamp(round(w / scale + offset), -8, 7)``."""
    w = w.float()
    rows, cols = w.shape
    g = w.reshape(rows, -1, group if group else cols)
    lo = torch.minimum(g.amin(-1), torch.zeros(()))
    hi = torch.maximum(g.amax(-1), torch.zeros(()))
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        scale = torch.maximum(torch.maximum(-lo, hi) / 7.0, torch.tensor(eps))
        offset = torch.zeros_like(scale)
    else:
        scale = torch.maximum(hi / 15 - lo / 15, torch.tensor(eps))
        offset = (-lo / scale).round() - 8
    q = torch.clamp(torch.round(g / scale[..., None] + offset[..., None]), -8, 7)
    return {
        "weight": q.reshape(rows, cols).to(torch.int8),
        "weight_scale": scale.reshape(rows, -1),
        "weight_offset": offset.reshape(rows, -1),
    }


def quantize_fp8_per_channel(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """``calculate_fp8_qparam`` + ``fp8_quantize``: ``scale = max|w| / 448`` per row,
    ``q = e4m3(clamp(w / scale, -448, 448))``; the saver adds zero offsets."""
    w = w.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448
    q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}


# -- the decode, bit for bit -------------------------------------------------------------------


def random_int4(rows, cols, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (rows, cols), generator=gen).to(torch.int8)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize(
    "rows, cols, group", [(7, 33, 0), (5, 64, 0), (6, 64, 32), (3, 96, 16), (1, 8, 8)]
)
@pytest.mark.parametrize("symmetric", (True, False), ids=("sym", "asym"))
def test_w4a4_dynamic_bit_exact(rows, cols, group, symmetric, dtype):
    gen = torch.Generator().manual_seed(rows * cols)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    parts = quantize_int4(w, group, symmetric)
    got = decode(
        "W4A4_DYNAMIC",
        parts["weight"],
        dtype,
        group,
        **{k: v for k, v in parts.items() if k != "weight"},
    )
    want = dequantize_affine_loops(parts["weight"], parts["weight_scale"], parts["weight_offset"])
    assert same_bits(got, want.to(dtype))
    if not symmetric:
        assert bool(parts["weight_offset"].any())  # the offsets are really applied


def test_w4a4_offset_and_groups_matter():
    """A decode that ignored the offset, or spread the group scales along the wrong axis,
    would differ: these tests can fail."""
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) * 0.05 + 0.02
    parts = quantize_int4(w, 32, symmetric=False)
    right = dequantize_affine_loops(parts["weight"], parts["weight_scale"], parts["weight_offset"])
    no_offset = dequantize_affine_loops(parts["weight"], parts["weight_scale"], None)
    transposed = parts["weight_scale"].T.reshape(4, 2)
    other_axis = dequantize_affine_loops(parts["weight"], transposed, parts["weight_offset"])
    assert not torch.equal(right, no_offset) and not torch.equal(right, other_axis)
    assert (right - w).abs().max() < (no_offset - w).abs().max()


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("rows, cols", [(7, 33), (5, 64), (1, 1)])
def test_wfp8afp8_dynamic_bit_exact(rows, cols, dtype):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)) * 0.05
    parts = quantize_fp8_per_channel(w)
    got = decode(
        "WFP8AFP8_DYNAMIC",
        parts["weight"],
        dtype,
        **{k: v for k, v in parts.items() if k != "weight"},
    )
    want = dequantize_affine_loops(parts["weight"], parts["weight_scale"], None)
    assert same_bits(got, want.to(dtype))


# -- refusals ----------------------------------------------------------------------------------


def w4a4_parts(rows=4, cols=64, group=0):
    parts = quantize_int4(torch.randn(rows, cols) * 0.05, group, symmetric=True)
    return parts.pop("weight"), parts


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda q, c: c.pop("weight_offset"), "no mtp.layers.0.mlp.down_proj.weight_offset"),
        (lambda q, c: c.pop("weight_scale"), "no mtp.layers.0.mlp.down_proj.weight_scale"),
        (lambda q, c: c.update(weight_scale=torch.ones(4, 3)), "fits neither per-channel"),
        (lambda q, c: c.update(weight_scale=-torch.ones(4, 1)), "values <= 0"),
        (lambda q, c: c.update(weight_offset=torch.full((4, 1), float("nan"))), "NaN or inf"),
    ],
    ids=["offset-missing", "scale-missing", "groups-not-dividing", "scale-negative", "offset-nan"],
)
def test_w4a4_malformed_companions_refused(change, match):
    q, companions = w4a4_parts()
    change(q, companions)
    with pytest.raises(DraftWeightError, match=match) as caught:
        decode("W4A4_DYNAMIC", q, **companions)
    assert caught.value.tensor == NAME and caught.value.file == FILE


def test_w4a4_codes_outside_int4_refused_at_decode():
    q, companions = w4a4_parts()
    q[1, 5] = 9
    with pytest.raises(DraftWeightError, match="outside int4") as caught:
        decode("W4A4_DYNAMIC", q, **companions)
    assert caught.value.tensor == NAME and "re-export" in caught.value.hint


def test_w4a4_packed_rows_refused():
    """(out/2, in): sglang's SGLANG_NPU_W4A4_NEW_PACKING layout, not this saver's."""
    q, companions = w4a4_parts()
    with pytest.raises(DraftWeightError, match="one code per int8 byte"):
        decode("W4A4_DYNAMIC", q[:2].contiguous(), **companions)


def test_w4a4_group_size_disagreeing_with_the_description_refused():
    q, companions = w4a4_parts(group=32)
    with pytest.raises(DraftWeightError, match="group_size 16"):
        decode("W4A4_DYNAMIC", q, group_size=16, **companions)


def fp8_parts(rows=4, cols=64):
    parts = quantize_fp8_per_channel(torch.randn(rows, cols) * 0.05)
    return parts.pop("weight"), parts


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda c: c["weight_offset"].__setitem__((2, 0), 1.0), "nonzero weight_offset"),
        (lambda c: c.update(weight_scale=torch.ones(4, 2)), "per channel"),
        (lambda c: c.update(weight_scale=torch.ones(1)), "per channel"),
        (lambda c: c["weight_scale"].__setitem__((1, 0), float("inf")), "NaN or inf"),
        (lambda c: c.pop("weight_scale"), "no weight_scale"),
    ],
    ids=["offset-nonzero", "per-group", "per-tensor", "scale-inf", "scale-missing"],
)
def test_wfp8afp8_malformed_companions_refused(change, match):
    q, companions = fp8_parts()
    change(companions)
    with pytest.raises(DraftWeightError, match=match) as caught:
        decode("WFP8AFP8_DYNAMIC", q, **companions)
    assert caught.value.tensor == NAME and caught.value.file == FILE


@pytest.mark.parametrize(
    "scheme, weight, scale_dtype, match",
    [
        ("WFP8AFP8_DYNAMIC", torch.zeros(4, 8).to(torch.float8_e5m2), torch.float32, "e4m3fn"),
        ("WFP8AFP8_DYNAMIC", torch.zeros(4, 8).to(torch.float8_e4m3fn), torch.uint8, "float32"),
        ("W4A4_DYNAMIC", torch.zeros(4, 8, dtype=torch.uint8), torch.float32, "int8 weight"),
        ("W4A4_DYNAMIC", torch.zeros(4, 8, dtype=torch.int8), torch.int32, "float32"),
    ],
)
def test_storage_the_saver_never_writes_refused(scheme, weight, scale_dtype, match):
    scale = torch.ones(4, 1, dtype=scale_dtype)
    with pytest.raises(DraftWeightError, match=match):
        decode(scheme, weight, weight_scale=scale, weight_offset=torch.zeros(4, 1))


# -- loads through sglang's draft class --------------------------------------------------------


def checkpoint(folder: str, scheme: str, group: int = 0, symmetric: bool = True) -> dict:
    os.makedirs(folder)
    shutil.copy(os.path.join(fixture_dir(FLOAT), "config.json"), folder)
    tensors = load_all(fixture_dir(FLOAT))
    with open(os.path.join(fixture_dir(FLOAT), "quant_model_description.json")) as handle:
        desc = {k: v for k, v in json.load(handle).items() if isinstance(v, str)}
    original = load_file(reference_file(FLOAT))
    written = {}
    for names in DENSE_PROJECTIONS.values():
        for name in names:
            if scheme == "W4A4_DYNAMIC":
                parts = quantize_int4(original[name], group, symmetric)
            else:
                parts = quantize_fp8_per_channel(original[name])
            base = name[: -len(".weight")]
            for suffix, value in parts.items():
                tensors[f"{base}.{suffix}"] = value
                desc[f"{base}.{suffix}"] = scheme
            written[name] = parts
    write_modelslim_checkpoint(folder, tensors, desc, group_size=group, model_quant_type=scheme)
    return written


CASES = {
    "w4a4-per-channel-sym": ("W4A4_DYNAMIC", 0, True),
    "w4a4-per-channel-asym": ("W4A4_DYNAMIC", 0, False),
    "w4a4-per-group-32-asym": ("W4A4_DYNAMIC", 32, False),
    "wfp8afp8": ("WFP8AFP8_DYNAMIC", 0, True),
}


@pytest.mark.parametrize("case", CASES)
def test_draft_loads_bit_exact_through_sglang(load_draft, tmp_path, case, caplog):
    scheme, group, symmetric = CASES[case]
    written = checkpoint(str(tmp_path / case), scheme, group, symmetric)
    params = dict(load_draft(str(tmp_path / case)).named_parameters())
    for param, names in DENSE_PROJECTIONS.items():
        want = torch.cat(
            [
                dequantize_affine_loops(
                    written[n]["weight"],
                    written[n]["weight_scale"],
                    None if scheme == "WFP8AFP8_DYNAMIC" else written[n]["weight_offset"],
                ).bfloat16()
                for n in names
            ]
        )
        assert same_bits(params[param].detach(), want), param
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(ours) == 1 and f"dequantized 7 tensors ({scheme} x7)" in ours[0], ours
    assert "14 companion tensors consumed" in ours[0]


def test_stock_sglang_loads_the_raw_codes(load_draft, tmp_path):
    """Stock: int4 codes (|q| <= 8) and float8 values (up to 448) in the bf16 parameters."""
    checkpoint(str(tmp_path / "w4a4"), "W4A4_DYNAMIC")
    checkpoint(str(tmp_path / "fp8"), "WFP8AFP8_DYNAMIC")
    w4 = dict(load_draft(str(tmp_path / "w4a4"), plugin=False).named_parameters())
    f8 = dict(load_draft(str(tmp_path / "fp8"), plugin=False).named_parameters())
    for param in DENSE_PROJECTIONS:
        assert float(w4[param].abs().max()) in (7.0, 8.0), param
        assert float(f8[param].abs().max()) == 448.0, param


# -- WFP8AFP8_DYNAMIC as msmodelslim itself wrote it ---------------------------------------------

TOOL_FP8 = "q35_dense_wfp8afp8_dynamic"


def test_the_tools_wfp8afp8_output_has_the_saver_layout():
    tensors, desc = load_all(fixture_dir(TOOL_FP8)), description(fixture_dir(TOOL_FP8))
    assert desc["model_quant_type"] == "WFP8AFP8_DYNAMIC"
    for names in DENSE_PROJECTIONS.values():
        for n in names:
            base = n[: -len(".weight")]
            w, s, o = (tensors[base + x] for x in (".weight", ".weight_scale", ".weight_offset"))
            assert w.dtype == torch.float8_e4m3fn and s.dtype == o.dtype == torch.float32
            assert s.shape == o.shape == (w.shape[0], 1) and not bool(o.any())
            assert desc[n] == desc[base + ".weight_scale"] == "WFP8AFP8_DYNAMIC"


def test_the_tools_wfp8afp8_draft_bit_exact_and_within_its_error(load_draft):
    """Bit for bit the reference; within e4m3's half spacing (2**-4 relative, 2**-10 steps
    below the normal range) of the original weight, plus the bf16 rounding."""
    folder = fixture_dir(TOOL_FP8)
    tensors, original = load_all(folder), load_file(reference_file(TOOL_FP8))
    params = dict(load_draft(folder).named_parameters())
    for param, names in DENSE_PROJECTIONS.items():
        parts = [
            dequantize_affine_loops(tensors[n], tensors[n[:-7] + ".weight_scale"], None)
            for n in names
        ]
        got = params[param].detach()
        assert same_bits(got, torch.cat(parts).bfloat16()), param
        rows = 0
        for n in names:
            w = original[n].float()
            mine = got[rows : rows + w.shape[0]].float()
            rows += w.shape[0]
            scale = tensors[n[:-7] + ".weight_scale"]
            bound = w.abs() * (2.0**-4 + 2.0**-8) + scale * 2.0**-10
            assert bool(((mine - w).abs() <= bound).all()), n
