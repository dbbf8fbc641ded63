"""Every dense W8 scheme msmodelslim writes, loaded through sglang's own draft class.

For each fixture: every draft projection equals the fp32 ``(q - offset) * scale`` rounded once
to the draft's dtype (the one sglang's ``--dtype auto`` picks: bf16, or fp16 for the fixtures
whose config says float32: the per-group and W8A16 ones) bit for bit, lies within the
quantization error of the original float weights, and the same load without the plugin (stock
sglang) holds the raw integer codes.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from support.paths import DENSE_W8, fixture_dir, reference_file
from support.reference import (
    DENSE_PROJECTIONS,
    dequantize_fp32,
    description,
    load_all,
    quantization_step,
)
from support.sglang_release import TARGET_FILLED


def config_dtype(folder: str) -> str:
    with open(os.path.join(folder, "config.json")) as handle:
        return json.load(handle)["text_config"]["dtype"]


def expected_param(folder: str, param: str, dtype=torch.bfloat16) -> torch.Tensor:
    tensors, desc = load_all(folder), description(folder)
    parts = [dequantize_fp32(tensors, n, desc[n]).to(dtype) for n in DENSE_PROJECTIONS[param]]
    return torch.cat(parts, dim=0)


@pytest.mark.parametrize("name", DENSE_W8)
def test_projections_bit_identical_to_fp32_dequant(load_draft, name):
    folder = fixture_dir(name)
    params = dict(load_draft(folder).named_parameters())
    for param, parts in DENSE_PROJECTIONS.items():
        got = params[param].detach()
        want = expected_param(folder, param, got.dtype)
        assert got.dtype == (
            torch.bfloat16 if config_dtype(folder) == "bfloat16" else torch.float16
        )
        assert torch.equal(got, want), (
            f"{name}: {param} differs from the rounded dequant of {parts}"
        )


@pytest.mark.parametrize("name", DENSE_W8)
def test_projections_within_quantization_error_of_original(load_draft, name):
    folder = fixture_dir(name)
    tensors, desc = load_all(folder), description(folder)
    reference = load_file(reference_file(name))
    params = dict(load_draft(folder).named_parameters())
    for param, parts in DENSE_PROJECTIONS.items():
        rows = 0
        for ckpt_name in parts:
            original = reference[ckpt_name].float()
            got = params[param].detach()[rows : rows + original.shape[0]].float()
            rows += original.shape[0]
            step = quantization_step(tensors, ckpt_name, desc[ckpt_name])
            # msmodelslim's own rounding (<= 1.1 steps in fp32, see CHECK.txt) plus the one
            # rounding to the bf16/fp16 parameter (half an ulp: at most 2**-9 relative, bounded
            # by 2**-8 |w|);
            # static W8A8 needs that allowance: its fp32 error alone reaches 1.09 steps
            bf16_half_ulp = original.abs() * 2.0**-8
            excess = (got - original).abs() - (1.1 * step + bf16_half_ulp)
            assert excess.max() <= 0, f"{name}: {ckpt_name} off by {excess.max():.3e} beyond bound"


@pytest.mark.parametrize("name", DENSE_W8)
def test_stock_sglang_loads_raw_codes(load_draft, name):
    """The bug this package exists for, reproduced with sglang's unwrapped load_weights."""
    params = dict(load_draft(fixture_dir(name), plugin=False).named_parameters())
    for param in DENSE_PROJECTIONS:
        absmax = params[param].detach().abs().max().item()
        assert absmax >= 100, f"{name}: stock {param} absmax {absmax}, expected raw int8 codes"
    plugin_params = dict(load_draft(fixture_dir(name)).named_parameters())
    for param in DENSE_PROJECTIONS:
        assert plugin_params[param].detach().abs().max().item() < 1.0


@pytest.mark.parametrize("name", DENSE_W8)
def test_float_parts_of_the_draft_unchanged(load_draft, name):
    """fc and the norms (FLOAT in every fixture) load exactly as stock sglang loads them."""
    folder = fixture_dir(name)
    stock = dict(load_draft(folder, plugin=False).named_parameters())
    plugin = dict(load_draft(folder).named_parameters())
    untouched = [p for p in stock if p not in DENSE_PROJECTIONS and p not in TARGET_FILLED]
    assert "fc.weight" in untouched
    for param in untouched:
        assert torch.equal(stock[param], plugin[param]), param


def test_one_info_line_per_load(load_draft, caplog):
    load_draft(fixture_dir("q35_dense_w8a8_dynamic"))
    lines = [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(lines) == 1 and lines[0].levelname == "INFO"
    message = lines[0].getMessage()
    assert "dequantized 7 tensors (W8A8_DYNAMIC x7) to bfloat16" in message
    assert "14 companion tensors consumed" in message


def test_static_companions_are_consumed(load_draft, caplog):
    """deq_scale / input_offset / quant_bias / input_scale never reach sglang's name mapping."""
    load_draft(fixture_dir("q35_dense_w8a8_static"))
    message = [r for r in caplog.records if r.name == "sglang_mtp_dequant"][0].getMessage()
    assert "(W8A8 x7)" in message and "28 companion tensors consumed" in message
    assert not [r for r in caplog.records if "not found in params_dict" in r.getMessage()]


def test_fp32_draft_gets_fp32_weights(load_draft):
    """The decoded tensor takes the draft's dtype: an fp32 draft keeps full fp32 precision."""
    folder = fixture_dir("q35_dense_w8a16_asym")
    params = dict(load_draft(folder, dtype="float32").named_parameters())
    param = "model.layers.0.o_proj.weight"
    assert torch.equal(params[param].detach(), expected_param(folder, param, torch.float32))
