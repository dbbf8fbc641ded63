"""The MX schemes msmodelslim 26.1.0 writes (W8A8_MXFP8, W4A8_MXFP, W4A4_MXFP4,
W4A4_MXFP4_DUALSCALE), decoded bit for bit, or refused.

Expected values come from ``reference.py``: every e4m3 / e2m1 / E8M0 value decoded from its bit
fields in float64 (exact for these products) and rounded to f32 once, never from the plugin.
"Bit for bit" compares the bit patterns (``same_bits``), so a -0.0 where the format says -0.0
counts too (msmodelslim writes nibble 8, fp4's -0, for small negative weights).

The checkpoints are header-faithful to msmodelslim's saver (``ascendv1.py``
``on_*_mx_dynamic_*``: names, dtypes, shapes, description entries, ``group_size`` 32); the
float-MTP fixture's float weights are quantized with the tool's per-block formulas, re-written
in ``reference.quantize_mx``; the loads go through sglang's own ``Qwen3_5ForCausalLMMTP`` and
``DefaultModelLoader`` stream with the plugin's hook. ``test_msmodelslim_mx.py`` checks the
same decode on checkpoints msmodelslim itself wrote.
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
from sglang_mtp_dequant.formats.plan import DequantPlan
from sglang_mtp_dequant.formats.schemes import infer_type, scheme_for
from sglang_mtp_dequant.formats.schemes.mx import e8m0_to_float32, unpack_e2m1
from support.checkpoints import edit_tensors, open_checkpoint, write_modelslim_checkpoint
from support.paths import fixture_dir, reference_file
from support.reference import (
    DENSE_PROJECTIONS,
    MX_BLOCK,
    dequantize_mx_f32,
    e2m1_value,
    e8m0_value,
    load_all,
    pack_fp4,
    quantize_mx,
    same_bits,
)

FLOAT = "q35_dense_float_mtp"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP4_TYPES = ("W4A4_MXFP4", "W4A8_MXFP")


def info(name="mtp.layers.0.mlp.up_proj.weight", dtype=torch.uint8, shape=(4, 16)) -> TensorInfo:
    return TensorInfo(name, "/ckpt/quant_model_weights.safetensors", dtype, tuple(shape))


def decode(scheme: str, weight: torch.Tensor, dtype=torch.bfloat16, **companions) -> torch.Tensor:
    """The plugin's decode of one weight, through its scheme class (no checkpoint)."""
    decoder = scheme_for(scheme).prepare(
        info(dtype=weight.dtype, shape=weight.shape), companions, 32
    )
    return decoder.decompress(weight, dtype)


def random_fp4(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Packed bytes covering every nibble, -0 (8) included."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.int64).to(
        torch.uint8
    )


def random_e4m3(*shape: int, seed: int = 0) -> torch.Tensor:
    """float8_e4m3fn codes of every finite byte (NaN bytes 0x7F/0xFF replaced by zero)."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.int64).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0
    return raw.view(torch.float8_e4m3fn)


def random_e8m0(rows: int, cols: int, seed: int = 1, low: int = 0, high: int = 255):
    """E8M0 bytes in [low, high) (255, NaN, excluded), one per block of 32 inputs."""
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-cols // MX_BLOCK)
    return torch.randint(low, high, (rows, blocks), generator=gen, dtype=torch.int64).to(
        torch.uint8
    )


# -- the element formats, against their definitions ---------------------------------------------


def test_every_packed_byte_decodes_to_its_two_e2m1_values():
    """All 256 bytes: low nibble = even column, high = odd column, each from its bit fields."""
    packed = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(1, 256)
    got = unpack_e2m1(packed).float()
    want = torch.tensor(
        [v for b in range(256) for v in (e2m1_value(b & 0xF), e2m1_value(b >> 4))]
    ).reshape(1, 512)
    assert same_bits(got, want)
    assert same_bits(got[0, 16], torch.tensor(-0.0))  # byte 0x08's low nibble: fp4's -0


def test_every_e8m0_byte_is_its_power_of_two():
    stored = torch.arange(255, dtype=torch.int64).to(torch.uint8)
    want = torch.tensor([e8m0_value(b) for b in range(255)], dtype=torch.float64).float()
    assert same_bits(e8m0_to_float32(stored), want)
    assert float(e8m0_to_float32(torch.tensor([0], dtype=torch.uint8))) == 2.0**-127


def test_packing_order_is_what_the_decode_reads():
    """The tool's pairing (row-major, first value low) round-trips; swapping the nibbles, or
    pairing along rows instead, decodes other weights: a test that could fail does."""
    values = torch.tensor([[0.5, -6.0, 1.5, 0.0], [3.0, -0.5, 4.0, -2.0]])
    packed = pack_fp4(values)
    assert packed.tolist() == [[0xF1, 0x03], [0x95, 0xC6]]  # -6 = 0xF, -2 = 0xC
    assert same_bits(unpack_e2m1(packed).float(), values)
    swapped = (packed >> 4) | ((packed & 0xF) << 4)
    assert not torch.equal(unpack_e2m1(swapped).float(), values)
    along_rows = pack_fp4(values.T.contiguous())  # (4, 1): pairs of rows
    assert not torch.equal(unpack_e2m1(along_rows).float().reshape(2, 4), values)


# -- each scheme's decode, bit for bit -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 96), (5, 80), (3, 33), (2, 31), (1, 1), (6, 64)])
def test_mxfp8_bit_exact(shape, dtype):
    """Every finite e4m3 byte, exponents over the whole E8M0 range (2**-127 .. 2**127), rows
    whose last block is shorter (80 = 32 + 32 + 16, 33, 31, 1)."""
    rows, cols = shape
    q, e = random_e4m3(rows, cols), random_e8m0(rows, cols)
    got = decode("W8A8_MXFP8", q, dtype, weight_scale=e)
    assert same_bits(got, dequantize_mx_f32(q, e).to(dtype))


@pytest.mark.parametrize("scheme", FP4_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 96), (5, 80), (3, 34), (2, 2), (1, 64)])
def test_mxfp4_bit_exact(scheme, shape, dtype):
    rows, cols = shape
    packed, e = random_fp4(rows, cols), random_e8m0(rows, cols)
    got = decode(scheme, packed, dtype, weight_scale=e)
    assert got.shape == (rows, cols)
    assert same_bits(got, dequantize_mx_f32(packed, e).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "cols, dual_block",
    [(1040, 512), (1024, 512), (96, 64), (80, 16), (48, 8), (64, 64), (40, 4096)],
)
@pytest.mark.parametrize("layout", ["saved", "flat"])
def test_dual_scale_bit_exact(cols, dual_block, layout, dtype):
    """``(fp4 * 2**e) * dual``: dual blocks larger than, equal to and smaller than the MX block,
    ragged last blocks of both (1040 = 2 * 512 + 16), one dual block per row (40 < 4096);
    ``weight_dual_scale`` as the saver writes it (out, n, 1) or flat (out, n)."""
    rows = 3
    gen = torch.Generator().manual_seed(cols)
    packed, e = random_fp4(rows, cols), random_e8m0(rows, cols, low=100, high=150)
    blocks = -(-cols // dual_block)
    dual = torch.rand(rows, blocks, 1, generator=gen) * 0.1 + 1e-4
    dual[0, 0, 0] = 0.0  # an all-zero dual block: max|w| / 6 = 0
    stored = dual if layout == "saved" else dual.reshape(rows, blocks)
    got = decode("W4A4_MXFP4_DUALSCALE", packed, dtype, weight_scale=e, weight_dual_scale=stored)
    want = dequantize_mx_f32(packed, e, dual, dual_block if blocks > 1 else None).to(dtype)
    assert same_bits(got, want)


def test_dual_scale_is_not_ignored():
    packed, e = random_fp4(2, 64), random_e8m0(2, 64, low=120, high=130)
    dual = torch.full((2, 1, 1), 0.25)
    with_dual = decode("W4A4_MXFP4_DUALSCALE", packed, weight_scale=e, weight_dual_scale=dual)
    assert torch.equal(with_dual, decode("W4A4_MXFP4", packed, weight_scale=e) * 0.25)


def test_experts_in_one_tensor_decode_per_expert():
    """A leading expert dimension (fused experts): each expert's rows take their own blocks."""
    packed = torch.stack([random_fp4(4, 64, seed=s) for s in range(3)])
    e = torch.stack([random_e8m0(4, 64, seed=s + 10) for s in range(3)])
    decoder = scheme_for("W4A4_MXFP4").prepare(info(shape=packed.shape), {"weight_scale": e}, 32)
    assert decoder.shape == (3, 4, 64)
    got = decoder.decompress(packed, torch.bfloat16)
    for x in range(3):
        assert same_bits(got[x], dequantize_mx_f32(packed[x], e[x]).bfloat16())
    only = decoder.decompress(packed, torch.bfloat16, only=[1])
    assert same_bits(only[1], got[1]) and bool(only[0].isnan().all())


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme, weight, companions, match",
    [
        ("W4A4_MXFP4", random_fp4(4, 80), {"weight_scale": random_e8m0(4, 64)}, "blocks of 32"),
        ("W4A4_MXFP4", random_fp4(4, 64), {"weight_scale": random_e8m0(4, 64)[:, :1]}, "blocks"),
        ("W4A4_MXFP4", random_fp4(4, 64), {}, "no mtp.layers.0.mlp.up_proj.weight_scale"),
        (
            "W8A8_MXFP8",
            random_e4m3(4, 64),
            {"weight_scale": torch.full((4, 2), 255, dtype=torch.uint8)},
            "E8M0's NaN",
        ),
        (
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 64),
            {"weight_scale": random_e8m0(4, 64)},
            "no mtp.layers.0.mlp.up_proj.weight_dual_scale",
        ),
        (  # 100 inputs in 3 dual blocks: no power-of-two block size gives 3
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 100),
            {"weight_scale": random_e8m0(4, 100), "weight_dual_scale": torch.ones(4, 3, 1)},
            "fits no power-of-two dual block",
        ),
        (
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 64),
            {"weight_scale": random_e8m0(4, 64), "weight_dual_scale": torch.ones(2, 1, 1)},
            "fits no power-of-two dual block",
        ),
        (
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 64),
            {
                "weight_scale": random_e8m0(4, 64),
                "weight_dual_scale": torch.tensor([1.0, float("nan"), 1.0, 1.0]).reshape(4, 1, 1),
            },
            "NaN or inf",
        ),
        (
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 64),
            {"weight_scale": random_e8m0(4, 64), "weight_dual_scale": -torch.ones(4, 1, 1)},
            "negative",
        ),
        (  # 2**127 * 4.0 overflows fp32: the folded scale would not be exact
            "W4A4_MXFP4_DUALSCALE",
            random_fp4(4, 64),
            {
                "weight_scale": torch.full((4, 2), 254, dtype=torch.uint8),
                "weight_dual_scale": torch.full((4, 1, 1), 4.0),
            },
            "normal range",
        ),
    ],
    ids=[
        "scale-floor-not-ceil",
        "scale-too-few-blocks",
        "scale-missing",
        "scale-nan-byte",
        "dual-missing",
        "dual-no-block-size",
        "dual-wrong-rows",
        "dual-nan",
        "dual-negative",
        "dual-product-overflows",
    ],
)
def test_malformed_companions_are_refused_naming_the_tensor(scheme, weight, companions, match):
    with pytest.raises(DraftWeightError, match=match) as caught:
        decode(scheme, weight, **companions)
    assert caught.value.tensor == "mtp.layers.0.mlp.up_proj.weight"
    assert caught.value.file == "/ckpt/quant_model_weights.safetensors"


@pytest.mark.parametrize(
    "scheme, weight_dtype, scale_dtype, match",
    [
        ("W4A4_MXFP4", torch.uint8, torch.float32, "weight_scale as uint8"),
        ("W4A4_MXFP4", torch.int8, torch.uint8, "expects a >=2-D uint8 weight"),
        ("W8A8_MXFP8", torch.float8_e5m2, torch.uint8, "float8_e4m3fn weight"),
        ("W8A8_MXFP8", torch.float8_e4m3fn, torch.int8, "weight_scale as uint8"),
    ],
)
def test_storage_the_saver_never_writes_is_refused_from_headers(
    scheme, weight_dtype, scale_dtype, match
):
    scale = info("mtp.layers.0.mlp.up_proj.weight_scale", scale_dtype, (4, 2))
    with pytest.raises(DraftWeightError, match=match):
        scheme_for(scheme).check_storage(
            info(dtype=weight_dtype, shape=(4, 64)), {"weight_scale": scale}
        )


F32, U8 = torch.float32, torch.uint8
FP8_E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize(
    "weight_dtype, companions, expected",
    [
        (U8, {"weight_scale": U8}, "W4A4_MXFP4"),
        (U8, {"weight_scale": U8, "weight_dual_scale": F32}, "W4A4_MXFP4_DUALSCALE"),
        (FP8_E4M3, {"weight_scale": U8}, "W8A8_MXFP8"),
        (FP8_E4M3, {"weight_scale": F32}, "FP8"),
        (FP8_E4M3, {"weight_scale": F32, "weight_offset": F32}, "FP8"),
        (torch.int8, {"weight_scale": F32, "weight_offset": F32}, "W8A8_DYNAMIC"),
        # a companion stored as no claimant defines: the claim stands, check_storage names it
        (torch.int8, {"weight_scale": torch.int32}, "W8A8_DYNAMIC"),
    ],
)
def test_inference_without_a_description_uses_the_companions_storage(
    weight_dtype, companions, expected
):
    infos = {s: info(f"x.{s}", d, (4, 2)) for s, d in companions.items()}
    assert infer_type(info(dtype=weight_dtype), infos) == expected


# -- checkpoints as msmodelslim's saver lays them out, loaded through sglang ------------------


def mx_checkpoint(folder: str, scheme: str, dual_block: int = 32) -> dict[str, dict]:
    """The float-MTP fixture with every draft projection quantized to ``scheme`` as
    ``ascendv1.py`` writes it; returns {projection: its quantized tensors}."""
    os.makedirs(folder)
    shutil.copy(os.path.join(fixture_dir(FLOAT), "config.json"), folder)
    tensors = load_all(fixture_dir(FLOAT))
    desc = json.load(open(os.path.join(fixture_dir(FLOAT), "quant_model_description.json")))
    desc = {k: v for k, v in desc.items() if isinstance(v, str)}
    original = load_file(reference_file(FLOAT))
    written = {}
    for names in DENSE_PROJECTIONS.values():
        for name in names:
            w = original[name].float()
            base = name[: -len(".weight")]
            if scheme == "W4A4_MXFP4_DUALSCALE":
                rows, cols = w.shape
                blocks = -(-cols // dual_block)
                padded = torch.zeros(rows, blocks * dual_block)
                padded[:, :cols] = w
                dual = padded.reshape(rows, blocks, dual_block).abs().amax(-1, keepdim=True) / 6.0
                scaled = (padded.reshape(rows, blocks, dual_block) / dual).reshape(rows, -1)
                parts = quantize_mx(scaled[:, :cols], fp4=True)
                parts["weight_dual_scale"] = dual
            else:
                parts = quantize_mx(w, fp4=scheme != "W8A8_MXFP8")
            for suffix, value in parts.items():
                tensors[f"{base}.{suffix}"] = value
                desc[f"{base}.{suffix}"] = scheme
            written[name] = parts
    write_modelslim_checkpoint(folder, tensors, desc, group_size=32, model_quant_type=scheme)
    return written


def expected_projection(parts: dict, dual_block: int) -> torch.Tensor:
    dual = parts.get("weight_dual_scale")
    blocks = None if dual is None else dual.shape[1]
    width = dual_block if blocks and blocks > 1 else None
    return dequantize_mx_f32(parts["weight"], parts["weight_scale"], dual, width).bfloat16()


MX_SCHEMES = ("W8A8_MXFP8", "W4A8_MXFP", "W4A4_MXFP4", "W4A4_MXFP4_DUALSCALE")


@pytest.mark.parametrize("scheme", MX_SCHEMES)
def test_draft_loads_bit_exact_through_sglang(load_draft, tmp_path, scheme, caplog):
    written = mx_checkpoint(str(tmp_path / scheme), scheme)
    params = dict(load_draft(str(tmp_path / scheme)).named_parameters())
    for param, names in DENSE_PROJECTIONS.items():
        want = torch.cat([expected_projection(written[n], 32) for n in names])
        assert same_bits(params[param].detach(), want), param
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    companions = 14 if scheme == "W4A4_MXFP4_DUALSCALE" else 7
    assert len(ours) == 1 and f"dequantized 7 tensors ({scheme} x7)" in ours[0], ours
    assert f"{companions} companion tensors consumed" in ours[0]
    assert not [r for r in caplog.records if "not found in params_dict" in r.getMessage()]


@pytest.mark.parametrize("scheme", MX_SCHEMES)
def test_draft_within_mx_quantization_error_of_the_original(load_draft, tmp_path, scheme):
    """A sanity bound, not the proof: the MX quantizer's own error (in units of the block's
    scale) plus the bf16 rounding; a wrong nibble order or block is off by far more."""
    written = mx_checkpoint(str(tmp_path / scheme), scheme)
    original = load_file(reference_file(FLOAT))
    params = dict(load_draft(str(tmp_path / scheme)).named_parameters())
    # e4m3: blocks reach 2**9 * step and clamp at 448 (64 steps off), round by 16 at most;
    # e2m1: blocks reach 7 * step and clamp at 6, round by 1 at most
    limit = 64.0 if scheme == "W8A8_MXFP8" else 1.0
    for param, names in DENSE_PROJECTIONS.items():
        rows = 0
        for name in names:
            w = original[name].float()
            got = params[param].detach()[rows : rows + w.shape[0]].float()
            rows += w.shape[0]
            parts = written[name]
            step = 2.0 ** (parts["weight_scale"].float() - 127).repeat_interleave(32, dim=1)
            if "weight_dual_scale" in parts:
                step = step * parts["weight_dual_scale"].reshape(w.shape[0], -1).repeat_interleave(
                    w.shape[1] // parts["weight_dual_scale"].shape[1], dim=1
                )
            excess = (got - w).abs() - (limit * step + w.abs() * 2.0**-8)
            assert excess.max() <= 1e-7, f"{name}: {excess.max():.3e} beyond the bound"


def test_dual_scale_with_a_block_spanning_several_mx_blocks(load_draft, tmp_path):
    """dual blocks of 64 over 128-wide rows (o_proj, down_proj): 2 dual blocks per row."""
    written = mx_checkpoint(str(tmp_path / "d64"), "W4A4_MXFP4_DUALSCALE", dual_block=64)
    assert written["mtp.layers.0.mlp.down_proj.weight"]["weight_dual_scale"].shape == (64, 2, 1)
    params = dict(load_draft(str(tmp_path / "d64")).named_parameters())
    for param, names in DENSE_PROJECTIONS.items():
        want = torch.cat([expected_projection(written[n], 64) for n in names])
        assert same_bits(params[param].detach(), want), param


def test_stock_sglang_misloads_mx_drafts(load_draft, tmp_path):
    """What stock sglang does with them: MXFP8's float8 values copied as they are (up to 448
    per block), packed fp4 stopped by a shape check."""
    written = mx_checkpoint(str(tmp_path / "fp8"), "W8A8_MXFP8")
    params = dict(load_draft(str(tmp_path / "fp8"), plugin=False).named_parameters())
    name = "mtp.layers.0.self_attn.o_proj.weight"
    raw = written[name]["weight"].to(torch.bfloat16)
    assert torch.equal(params["model.layers.0.o_proj.weight"].detach(), raw)
    mx_checkpoint(str(tmp_path / "fp4"), "W4A4_MXFP4")
    with pytest.raises(AssertionError):
        load_draft(str(tmp_path / "fp4"), plugin=False)


def test_malformed_checkpoint_is_refused_before_any_weight_loads(tmp_path):
    """Through the plan: a NaN exponent in one projection names that tensor and its file."""
    folder = str(tmp_path / "nan")
    mx_checkpoint(folder, "W4A4_MXFP4")

    def nan_exponent(tensors):
        tensors["mtp.layers.0.mlp.up_proj.weight_scale"][2, 1] = 255

    path = edit_tensors(os.path.join(folder, "quant_model_weights.safetensors"), nan_exponent)
    plan = DequantPlan.build(open_checkpoint(folder, wanted=lambda n: n.startswith("mtp.")))
    (refused,) = plan.errors
    assert refused.info.name == "mtp.layers.0.mlp.up_proj.weight"
    assert "E8M0's NaN" in str(refused.error) and path in str(refused.error)
