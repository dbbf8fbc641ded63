"""The MX schemes on checkpoints msmodelslim 26.1.0 itself wrote (``_gen/build_mx.sh``).

Real: the tool's ascendv1 saver output for a tiny Qwen3.5 with its MTP layer quantized
(``q35_dense_w8a8_mxfp8``, ``q35_dense_w4a4_mxfp4``, ``q35_dense_w4a8_mxfp``,
``q35_dense_w4a4_mxfp4_dualscale`` with ``dual_block_size`` 64), sglang's
``Qwen3_5ForCausalLMMTP`` and ``DefaultModelLoader`` stream, the plugin's hook. Expected values:
``reference.dequantize_mx_f32`` (bit fields decoded in float64), with the dual block size taken
from the recipe (64), not from the plugin's inference.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from support.paths import fixture_dir, reference_file
from support.reference import (
    DENSE_PROJECTIONS,
    dequantize_mx_f32,
    description,
    fp4_codes_f64,
    fp8_codes_f64,
    load_all,
    same_bits,
)

FIXTURES = {
    "q35_dense_w8a8_mxfp8": "W8A8_MXFP8",
    "q35_dense_w4a4_mxfp4": "W4A4_MXFP4",
    "q35_dense_w4a8_mxfp": "W4A8_MXFP",
    "q35_dense_w4a4_mxfp4_dualscale": "W4A4_MXFP4_DUALSCALE",
}
DUAL_BLOCK = 64  # the recipe's dual_block_size (_gen/cfg/q35_dense_w4a4_mxfp4_dualscale.yaml)


def expected(tensors: dict, name: str) -> torch.Tensor:
    """fp32 decode of one projection of the tool's output, from the reference."""
    base = name[: -len(".weight")]
    dual = tensors.get(base + ".weight_dual_scale")
    blocks = None if dual is None else dual.shape[1]
    return dequantize_mx_f32(
        tensors[name],
        tensors[base + ".weight_scale"],
        dual,
        DUAL_BLOCK if blocks and blocks > 1 else None,
    )


def codes(q: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(fp4_codes_f64(q) if q.dtype == torch.uint8 else fp8_codes_f64(q))


@pytest.mark.parametrize("name", FIXTURES)
def test_the_tools_output_has_the_layout_the_saver_defines(name):
    """What ``ascendv1.py`` writes, as read from the file: names, dtypes, shapes, types."""
    tensors, desc = load_all(fixture_dir(name)), description(fixture_dir(name))
    scheme = FIXTURES[name]
    assert desc["model_quant_type"] == scheme and desc["group_size"] == 32
    for names in DENSE_PROJECTIONS.values():
        for n in names:
            base = n[: -len(".weight")]
            w, e = tensors[n], tensors[base + ".weight_scale"]
            out, in_features = load_file(reference_file(name))[n].shape
            packed = scheme != "W8A8_MXFP8"
            assert w.dtype == (torch.uint8 if packed else torch.float8_e4m3fn), n
            assert w.shape == (out, in_features // 2 if packed else in_features), n
            assert e.dtype == torch.uint8 and e.shape == (out, -(-in_features // 32)), n
            assert desc[n] == desc[base + ".weight_scale"] == scheme
            if scheme == "W4A4_MXFP4_DUALSCALE":
                dual = tensors[base + ".weight_dual_scale"]
                assert dual.dtype == torch.float32
                assert dual.shape == (out, -(-in_features // DUAL_BLOCK), 1), n


@pytest.mark.parametrize("name", FIXTURES)
def test_draft_bit_identical_to_the_reference_decode(load_draft, name, caplog):
    folder = fixture_dir(name)
    tensors = load_all(folder)
    params = dict(load_draft(folder).named_parameters())
    for param, names in DENSE_PROJECTIONS.items():
        want = torch.cat([expected(tensors, n).bfloat16() for n in names])
        assert same_bits(params[param].detach(), want), param
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(ours) == 1 and f"dequantized 7 tensors ({FIXTURES[name]} x7)" in ours[0], ours


@pytest.mark.parametrize("name", FIXTURES)
def test_draft_within_the_tools_quantization_error(load_draft, name):
    """Every decoded weight lies within the MX quantizer's own error of the original float
    weight (in units of its block's scale: e2m1 rounds by at most 1 and clamps 7 to 6;
    e4m3 rounds by at most 16 and clamps 512 to 448), plus the bf16 rounding."""
    folder = fixture_dir(name)
    tensors, original = load_all(folder), load_file(reference_file(name))
    params = dict(load_draft(folder).named_parameters())
    limit = 64.0 if FIXTURES[name] == "W8A8_MXFP8" else 1.0
    for param, names in DENSE_PROJECTIONS.items():
        rows = 0
        for n in names:
            w = original[n].float()
            got = params[param].detach()[rows : rows + w.shape[0]].float()
            rows += w.shape[0]
            step = expected(tensors, n) / codes(tensors[n]).float()  # the scale of each element
            step = torch.where(torch.isfinite(step), step, torch.zeros(()))
            step = step.abs().amax(dim=1, keepdim=True)  # the row's largest block scale
            excess = (got - w).abs() - (limit * step + w.abs() * 2.0**-8)
            assert excess.max() <= 0, f"{n}: {excess.max():.3e} beyond the bound"


@pytest.mark.parametrize("name", FIXTURES)
def test_the_exponent_bias_and_the_nibble_order_are_the_tools(name):
    """The saver's values single out the decoding rules:

    - each block's largest |code| sits at the top of the element grid, where the tool's shared
      exponent puts it (e4m3: 256..448 from ``floor(log2(amax)) - 8``; e2m1: 4 or 6 from
      ``floor(log2(amax / 0.875)) - 2``, and 3 where the tool's bf16 ``log2`` rounds a block's
      exponent down), so the block scale is ``2 ** (byte - 127)``;
    - a bias off by one (2x the scale, or half), or the nibbles read the other way round, puts
      the weights far off the originals: the rules are the only ones within the tool's error.
    """
    folder = fixture_dir(name)
    tensors, original = load_all(folder), load_file(reference_file(name))
    fp4 = FIXTURES[name] != "W8A8_MXFP8"
    for n in DENSE_PROJECTIONS["model.layers.0.mlp.down_proj.weight"]:
        base = n[: -len(".weight")]
        q = codes(tensors[n]).abs()
        block_max = q.reshape(q.shape[0], -1, 32).amax(-1)
        if fp4:
            assert set(block_max.unique().tolist()) <= {3.0, 4.0, 6.0}, n
            assert float((block_max == 3.0).float().mean()) < 0.1, n
        else:
            assert bool(((block_max >= 256) & (block_max <= 448)).all()), n
        w = original[n].float()
        right = (expected(tensors, n) - w).abs().max()
        wrongs = {}
        for shift in (1, -1):
            biased = (tensors[base + ".weight_scale"].long() + shift).to(torch.uint8)
            wrongs[f"bias {127 - shift}"] = {**tensors, base + ".weight_scale": biased}
        if fp4:
            packed = tensors[n]
            wrongs["nibbles swapped"] = {**tensors, n: (packed >> 4) | ((packed & 0xF) << 4)}
        for why, other in wrongs.items():
            wrong = (expected(other, n) - w).abs().max()
            assert wrong > 2 * right, (n, why, float(wrong), float(right))


def test_dual_scale_is_max_over_six_per_block_of_64():
    """In every dual block the tool divides by max|w| / 6, so the block's largest
    |fp4 * 2**e| is exactly 6: the dual blocks are 64 inputs wide (two per 128-wide row), the
    size the plugin infers from the dual scale's shape."""
    folder = fixture_dir("q35_dense_w4a4_mxfp4_dualscale")
    tensors = load_all(folder)
    name = "mtp.layers.0.mlp.down_proj"
    dual = tensors[f"{name}.weight_dual_scale"]
    assert dual.shape == (64, 2, 1)
    inner = expected({k: v for k, v in tensors.items() if "dual" not in k}, f"{name}.weight")
    per_block = inner.abs().reshape(64, 2, 64).amax(-1)
    assert torch.equal(per_block, torch.full((64, 2), 6.0))


def test_stock_sglang_misloads_the_tools_mx_drafts(load_draft):
    """Stock sglang: MXFP8 float8 values copied as they are, packed fp4 stopped by a shape
    check; the plugin's load differs from both."""
    folder = fixture_dir("q35_dense_w8a8_mxfp8")
    stock = dict(load_draft(folder, plugin=False).named_parameters())
    raw = load_all(folder)["mtp.layers.0.mlp.down_proj.weight"].to(torch.bfloat16)
    assert torch.equal(stock["model.layers.0.mlp.down_proj.weight"].detach(), raw)
    with pytest.raises(AssertionError):
        load_draft(fixture_dir("q35_dense_w4a4_mxfp4"), plugin=False)


@pytest.mark.parametrize("name", FIXTURES)
def test_doctor_plans_every_projection(name):
    from sglang_mtp_dequant.tools.doctor import diagnose

    report = diagnose(fixture_dir(name))
    planned = sorted(t.name for t in report.tensors if t.action == "dequantize")
    assert planned == sorted(n for names in DENSE_PROJECTIONS.values() for n in names)
    assert {t.scheme for t in report.tensors if t.action == "dequantize"} == {FIXTURES[name]}
    assert report.verdict == "ok" and report.unfilled == {} and report.skipped == []


@pytest.mark.parametrize("name", ["q35_dense_w8a8_mxfp8", "q35_dense_w4a4_mxfp4_dualscale"])
def test_verify_is_exact_on_the_tools_mx_output(sglang_cpu, name):
    """``verify``'s own independent decoder (``tools/verify/independent.py``) agrees with the
    plugin's load on every projection: exact, and stock loads something else."""
    from sglang_mtp_dequant.tools.verify import run_verify

    report = run_verify(fixture_dir(name), reference=reference_file(name))
    assert report.ok, report
    rows = {r.parameter: r for r in report.rows}
    for param in DENSE_PROJECTIONS:
        assert rows[param].quantized and rows[param].check == "exact", rows[param]
