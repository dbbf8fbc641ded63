"""float8 draft weights in a draft sglang builds unquantized: decoded bit for bit, or refused.

DeepSeek-V3 / GLM FP8 checkpoints store each projection as ``float8_e4m3fn`` codes with a
``weight_scale_inv`` (f32, one value per block of 128 x 128, the last block of a dimension
shorter when 128 does not divide it); other FP8 exports store one ``weight_scale`` per tensor or
per output channel. When sglang builds the draft unquantized, its loaders copy the float8 values
themselves (up to 448) into the bf16 parameters: the silent misload of int8 codes, in another
format.

The checkpoints here are made the DeepSeek way from float weights (the float-MTP fixture, the
MoE fixture's float reference weights, and a wider Qwen3.5 draft whose projections span several
blocks per dimension with a ragged last block), and loaded through sglang's real
``Qwen3_5ForCausalLMMTP`` and ``DefaultModelLoader``, with the plugin and without (stock).
Expected values are computed independently (``tools/verify``'s decoder, no code shared with
the plugin's): ``bf16(fp32(q) * scale_expanded)``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.guard import MODE_ENV
from sglang_mtp_dequant.serving.guard.values import code_evidence
from support.checkpoints import dropping, edit_tensors
from support.paths import fixture_dir, reference_file
from support.reference import DENSE_PROJECTIONS, decode_codes, load_all

BLOCK = 128
FLOAT = "q35_dense_float_mtp"
MOE = "q35moe_w8a8_dynamic"
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
#: draft parameters and the checkpoint tensors stacked into them, beyond the dense projections
FC = {"fc.weight": ["mtp.fc.weight"]}
MOE_PARAMS = {
    "model.layers.0.qkv_proj.weight": DENSE_PROJECTIONS["model.layers.0.qkv_proj.weight"],
    "model.layers.0.o_proj.weight": ["mtp.layers.0.self_attn.o_proj.weight"],
    "model.layers.0.mlp.shared_expert.gate_up_proj.weight": [
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight",
        "mtp.layers.0.mlp.shared_expert.up_proj.weight",
    ],
    "model.layers.0.mlp.shared_expert.down_proj.weight": [
        "mtp.layers.0.mlp.shared_expert.down_proj.weight"
    ],
    **FC,
}


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)


# -- quantizing the DeepSeek way, and the independent reference --------------------------------


def block_quantize(w: torch.Tensor, dtype=torch.float8_e4m3fn, block: int = BLOCK):
    """DeepSeek-V3's FP8 export: per block of ``block`` x ``block``, ``scale_inv = amax /
    finfo.max`` (f32), ``q = float8(w / scale_inv)``; ragged last blocks keep their own scale."""
    w = w.float()
    out, cols = w.shape
    rows_b, cols_b = -(-out // block), -(-cols // block)
    top = torch.finfo(dtype).max
    scale = torch.empty(rows_b, cols_b, dtype=torch.float32)
    q = torch.empty(out, cols, dtype=dtype)
    for i in range(rows_b):
        for j in range(cols_b):
            r, c = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            s = w[r, c].abs().amax().clamp(min=1e-12) / top
            scale[i, j] = s
            q[r, c] = (w[r, c] / s).clamp(-top, top).to(dtype)
    return q, scale


def block_dequantize(q: torch.Tensor, scale_inv: torch.Tensor):
    """bf16(fp32(q) * scale_inv expanded to every element): one fp32 product, one rounding."""
    return decode_codes(q, weight_scale_inv=scale_inv).to(torch.bfloat16)


def scaled_quantize(w: torch.Tensor, layout: str, dtype=torch.float8_e4m3fn):
    """Per-tensor / per-channel FP8 (``weight_scale``, not inverse-named: ``w = q * s``)."""
    w = w.float()
    top = torch.finfo(dtype).max
    if layout.startswith("tensor"):
        s = w.abs().amax().clamp(min=1e-12) / top
        q = (w / s).clamp(-top, top).to(dtype)
        return q, (s.reshape(()) if layout == "tensor_scalar" else s.reshape(1))
    s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / top
    q = (w / s).clamp(-top, top).to(dtype)
    return q, (s if layout == "channel" else s.reshape(-1))


def scaled_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bf16(fp32(q) * scale), the scale per tensor or per output channel."""
    return decode_codes(q, weight_scale=scale).to(torch.bfloat16)


# -- checkpoints -------------------------------------------------------------------------------


def is_projection(name: str) -> bool:
    """The weights an FP8 export quantizes: every linear of the draft layer (and ``fc``)."""
    return name.startswith("mtp.") and (name.endswith("_proj.weight") or name == "mtp.fc.weight")


def write_checkpoint(folder: str, config_from: str, tensors: dict, text_config: dict | None = None):
    """A plain FP8-style export: one ``model.safetensors`` and the config (no ModelSlim
    description, no quantization_config: the draft is built unquantized)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(config_from, "config.json")) as handle:
        config = json.load(handle)
    config.pop("quantization_config", None)
    config["text_config"].update(text_config or {})
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def fp8_from_fixture(folder: str, fixture: str, quantize, suffix: str):
    """The fixture with every draft projection replaced by float8 codes of its float reference
    weight plus ``<base>.<suffix>``; the ModelSlim companions of the old int8 weights dropped.
    Returns the folder and {projection: (codes, scale)}."""
    reference = load_file(reference_file(fixture))
    tensors = {
        n: t
        for n, t in load_all(fixture_dir(fixture)).items()
        if not (n.startswith("mtp.") and n.rpartition(".")[2] in ("weight_scale", "weight_offset"))
    }
    codes = {}
    for name, weight in reference.items():
        if is_projection(name):
            q, s = quantize(weight)
            tensors[name], tensors[f"{name[: -len('weight')]}{suffix}"] = q, s
            codes[name] = (q, s)
        else:
            tensors[name] = weight
    return write_checkpoint(folder, fixture_dir(fixture), tensors), codes


#: a Qwen3.5 draft whose every projection spans several 128-blocks per dimension, the last one
#: ragged: hidden 320 = 128 + 128 + 64, intermediate 192 = 128 + 64, q (with gate) 256, kv 64
WIDE = {"hidden_size": 320, "intermediate_size": 192}
WIDE_SHAPES = {
    "mtp.fc.weight": (320, 640),
    "mtp.layers.0.self_attn.q_proj.weight": (256, 320),
    "mtp.layers.0.self_attn.k_proj.weight": (64, 320),
    "mtp.layers.0.self_attn.v_proj.weight": (64, 320),
    "mtp.layers.0.self_attn.o_proj.weight": (320, 128),
    "mtp.layers.0.mlp.gate_proj.weight": (192, 320),
    "mtp.layers.0.mlp.up_proj.weight": (192, 320),
    "mtp.layers.0.mlp.down_proj.weight": (320, 192),
}
WIDE_NORMS = {
    "mtp.pre_fc_norm_embedding.weight": 320,
    "mtp.pre_fc_norm_hidden.weight": 320,
    "mtp.norm.weight": 320,
    "mtp.layers.0.input_layernorm.weight": 320,
    "mtp.layers.0.post_attention_layernorm.weight": 320,
    "mtp.layers.0.self_attn.q_norm.weight": 32,
    "mtp.layers.0.self_attn.k_norm.weight": 32,
}


def wide_fp8(folder: str, dtype=torch.float8_e4m3fn):
    gen = torch.Generator().manual_seed(7)
    tensors, codes = {}, {}
    for name, shape in WIDE_SHAPES.items():
        weight = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
        weight[:, -1] *= 40  # a few larger values: the blocks' scales differ
        q, s = block_quantize(weight, dtype)
        tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
        codes[name] = (q, s)
    for name, size in WIDE_NORMS.items():
        tensors[name] = (0.1 * torch.randn(size, generator=gen)).to(torch.bfloat16)
    return write_checkpoint(folder, fixture_dir(FLOAT), tensors, WIDE), codes


def expected_params(codes: dict, params: dict, decode) -> dict[str, torch.Tensor]:
    return {p: torch.cat([decode(*codes[n]) for n in names]) for p, names in params.items()}


def assert_loaded(model, codes, params, decode) -> None:
    loaded = dict(model.named_parameters())
    for param, want in expected_params(codes, params, decode).items():
        got = loaded[param].detach()
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), param


# -- block-scaled float8 (weight_scale_inv) ------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT8, ids=("e4m3", "e5m2"))
def test_block_fp8_draft_dequantizes_bit_exact(load_draft, tmp_path, dtype, caplog):
    """Tiny shapes: one block per dimension, except q_proj's 256 rows (two row blocks)."""
    folder, codes = fp8_from_fixture(
        str(tmp_path / "fp8"), FLOAT, lambda w: block_quantize(w, dtype), "weight_scale_inv"
    )
    assert codes["mtp.layers.0.self_attn.q_proj.weight"][1].shape == (2, 1)
    model = load_draft(folder)
    assert_loaded(model, codes, DENSE_PROJECTIONS | FC, block_dequantize)
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(ours) == 1 and "dequantized 8 tensors (FP8_BLOCK x8)" in ours[0], ours
    assert "8 companion tensors consumed" in ours[0]


@pytest.mark.parametrize("dtype", FLOAT8, ids=("e4m3", "e5m2"))
def test_block_fp8_several_blocks_per_dim_with_ragged_last_block(load_draft, tmp_path, dtype):
    """hidden 320 (128 + 128 + 64) and intermediate 192 (128 + 64): every projection has more
    than one block along each dimension it spans beyond 128, and a shorter last block."""
    folder, codes = wide_fp8(str(tmp_path / "wide"), dtype)
    assert codes["mtp.layers.0.mlp.down_proj.weight"][1].shape == (3, 2)
    assert codes["mtp.layers.0.mlp.gate_proj.weight"][1].shape == (2, 3)
    scales = codes["mtp.layers.0.mlp.down_proj.weight"][1]
    assert len(set(scales.flatten().tolist())) == scales.numel()  # a wrong block shows
    model = load_draft(folder)
    assert_loaded(model, codes, DENSE_PROJECTIONS | FC, block_dequantize)


def test_block_fp8_moe_draft_experts_dequantize_bit_exact(load_draft, tmp_path):
    """The MoE draft from its float reference weights: per-expert float8 + weight_scale_inv."""
    folder, codes = fp8_from_fixture(str(tmp_path / "moe"), MOE, block_quantize, "weight_scale_inv")
    model = load_draft(folder)
    assert_loaded(model, codes, MOE_PARAMS, block_dequantize)
    loaded = dict(model.named_parameters())
    expert = "mtp.layers.0.mlp.experts"
    for e in range(4):
        gate, up, down = (
            block_dequantize(*codes[f"{expert}.{e}.{p}_proj.weight"])
            for p in ("gate", "up", "down")
        )
        w13 = loaded["model.layers.0.mlp.experts.w13_weight"][e]
        assert torch.equal(w13, torch.cat([gate, up])), e
        assert torch.equal(loaded["model.layers.0.mlp.experts.w2_weight"][e], down), e


def test_stock_sglang_loads_the_raw_float8_values(load_draft, tmp_path):
    """Without the plugin every projection holds the codes themselves (blocks reach 448),
    which the value guard recognises as codes (which format it names: ``test_guard.py``)."""
    folder, codes = fp8_from_fixture(
        str(tmp_path / "fp8"), FLOAT, block_quantize, "weight_scale_inv"
    )
    model = load_draft(folder, plugin=False)
    loaded = dict(model.named_parameters())
    for param, names in (DENSE_PROJECTIONS | FC).items():
        raw = torch.cat([codes[n][0].to(torch.bfloat16) for n in names])
        assert torch.equal(loaded[param].detach(), raw), param
        assert float(loaded[param].abs().max()) == 448.0
        assert code_evidence(loaded[param].detach()) is not None, param  # the guard sees it


@pytest.mark.parametrize("missing", ("mtp.layers.0.self_attn.k_proj.weight", "mtp.fc.weight"))
def test_float8_weight_without_its_scale_is_refused_naming_it(load_draft, tmp_path, missing):
    folder, _ = fp8_from_fixture(str(tmp_path / "fp8"), FLOAT, block_quantize, "weight_scale_inv")
    edit_tensors(
        os.path.join(folder, "model.safetensors"),
        dropping(missing.replace(".weight", ".weight_scale_inv")),
    )
    with pytest.raises(DraftWeightError) as caught:
        load_draft(folder)
    message = str(caught.value)
    assert f"draft tensor {missing!r}" in message and "float8_e4m3fn" in message
    assert "(also refused" not in message  # only that one


def test_block_scale_of_the_wrong_shape_is_refused(load_draft, tmp_path):
    """A scale that fits no block size (3 row blocks for 64 rows) is never broadcast."""
    folder, _ = fp8_from_fixture(str(tmp_path / "fp8"), FLOAT, block_quantize, "weight_scale_inv")
    name = "mtp.layers.0.self_attn.k_proj.weight_scale_inv"
    edit_tensors(
        os.path.join(folder, "model.safetensors"),
        lambda tensors: tensors.update({name: torch.ones(5, 1)}),
    )
    with pytest.raises(DraftWeightError, match="mtp.layers.0.self_attn.k_proj.weight"):
        load_draft(folder)


# -- per-tensor / per-channel float8 (weight_scale) ---------------------------------------------


@pytest.mark.parametrize("layout", ("tensor_scalar", "tensor_1", "channel", "channel_flat"))
def test_scaled_fp8_draft_dequantizes_bit_exact(load_draft, tmp_path, layout, caplog):
    folder, codes = fp8_from_fixture(
        str(tmp_path / layout), FLOAT, lambda w: scaled_quantize(w, layout), "weight_scale"
    )
    model = load_draft(folder)
    assert_loaded(model, codes, DENSE_PROJECTIONS | FC, scaled_dequantize)
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(ours) == 1 and "(FP8 x8)" in ours[0], ours


# -- the doctor -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, scheme, suffix",
    (("block", "FP8_BLOCK", "weight_scale_inv"), ("channel", "FP8", "weight_scale")),
)
def test_doctor_plans_fp8_and_sees_every_parameter_filled(tmp_path, kind, scheme, suffix):
    from sglang_mtp_dequant.tools.doctor import diagnose

    quantize = block_quantize if kind == "block" else (lambda w: scaled_quantize(w, "channel"))
    folder, codes = fp8_from_fixture(str(tmp_path / kind), FLOAT, quantize, suffix)
    report = diagnose(folder)
    planned = {t.name: t for t in report.tensors if t.action == "dequantize"}
    assert sorted(planned) == sorted(codes)
    for name, row in planned.items():
        assert row.scheme == scheme and row.dtype == "float8_e4m3fn", name
        assert row.companions == [name.replace(".weight", f".{suffix}")]
    assert report.verdict == "ok" and report.unfilled == {} and report.skipped == []
    assert report.dry_run == (
        "Qwen3_5ForCausalLMMTP on the meta device, through the plugin's stream"
    )


def test_doctor_refuses_the_float8_weight_without_scale(tmp_path):
    from sglang_mtp_dequant.tools.doctor import diagnose

    folder, _ = fp8_from_fixture(str(tmp_path / "fp8"), FLOAT, block_quantize, "weight_scale_inv")
    edit_tensors(
        os.path.join(folder, "model.safetensors"),
        dropping("mtp.layers.0.mlp.up_proj.weight_scale_inv"),
    )
    report = diagnose(folder)
    assert report.verdict == "error"
    assert [t.name for t in report.tensors if t.action == "error"] == [
        "mtp.layers.0.mlp.up_proj.weight"
    ]
