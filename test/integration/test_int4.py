"""int4 drafts (W4A8_DYNAMIC V1 and V0 two-stage, W4A16) checked against msmodelslim's own output.

Real: msmodelslim 26.1.0 checkpoints (``q35_dense_w4a8_dynamic``: a Qwen3.5 MTP draft, V1
engine; ``qwen3_v0_*``: a tiny Qwen3 without MTP, V0 engine, whole source model as reference),
sglang's ``Qwen3_5ForCausalLMMTP`` and ``safetensors_weights_iterator``. The ``qwen3_v0_*``
checkpoints have no MTP layer, so no sglang draft class loads them: they go through the
plugin's own stream transform (``DequantizingStream``, the code the hook runs) fed by
sglang's iterator, with every tensor treated as a draft tensor.

Expected values come from ``reference.py`` (masking unpacker written from msmodelslim's
packing code, fp32 formulas), never from the plugin.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from support.checkpoints import edit_description, edit_tensors, write_modelslim_checkpoint
from support.paths import fixture_dir, reference_file
from support.reference import (
    DENSE_PROJECTIONS,
    dequantize_int4_fp32,
    description,
    expand_groups,
    int4_step,
    load_all,
    pack_int4_rows,
    unpack_int4_cols,
    unpack_int4_rows,
)

W4A8_V1 = "q35_dense_w4a8_dynamic"
V0_REFERENCES = (
    "qwen3_v0_w4a16_per_channel",
    "qwen3_v0_w4a16_per_group",
    "qwen3_v0_w4a8_dynamic_two_stage",
)


def expected(folder: str, name: str, dtype=torch.bfloat16) -> torch.Tensor:
    tensors, desc = load_all(folder), description(folder)
    return dequantize_int4_fp32(tensors, name, desc[name], desc.get("version")).to(dtype)


def stream_through_plugin(folder: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The hook's transform, fed by sglang's DefaultModelLoader stream; every tensor counts as
    draft (these V0 fixtures are whole Qwen3 layers: there is no Qwen3 draft class to build)."""
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from sglang_mtp_dequant.serving.stream import DequantizingStream
    from support.checkpoints import open_checkpoint
    from support.cpu_sglang import path_weights

    plan = DequantPlan.build(open_checkpoint(folder, wanted=lambda name: True))
    plan.raise_first_error()
    stream = DequantizingStream(lambda: plan, dtype, is_draft=lambda name: True)
    return dict(stream.apply(path_weights(folder)))


# -- V1 W4A8_DYNAMIC through sglang's Qwen3.5 draft --------------------------------------------


def test_w4a8_v1_draft_bit_identical_to_fp32_dequant(load_draft):
    folder = fixture_dir(W4A8_V1)
    params = dict(load_draft(folder).named_parameters())
    for param, parts in DENSE_PROJECTIONS.items():
        want = torch.cat([expected(folder, n) for n in parts])
        assert torch.equal(params[param].detach(), want), param


def test_w4a8_v1_draft_within_half_a_step_of_original(load_draft):
    """CHECK.txt: msmodelslim's own error is <= 0.516 step; a nibble-order bug is ~13 steps."""
    folder = fixture_dir(W4A8_V1)
    tensors, original = load_all(folder), load_file(reference_file(W4A8_V1))
    params = dict(load_draft(folder).named_parameters())
    for param, parts in DENSE_PROJECTIONS.items():
        rows = 0
        for name in parts:
            w = original[name].float()
            got = params[param].detach()[rows : rows + w.shape[0]].float()
            rows += w.shape[0]
            step = int4_step(tensors, name, w.shape[1])
            excess = (got - w).abs() - (0.52 * step + w.abs() * 2.0**-8)
            assert excess.max() <= 0, f"{name}: {excess.max():.3e} beyond the bound"


def test_stock_sglang_stops_on_packed_int4(load_draft):
    """The failure users report, reproduced: stock sglang's shape check on packed codes."""
    with pytest.raises(AssertionError, match=r"\[64, 128\].*\[32, 128\]"):
        load_draft(fixture_dir(W4A8_V1), plugin=False)


def test_scale_bias_is_a_gemm_correction_and_is_consumed(load_draft, caplog):
    """``scale_bias`` is 8 * sum(w) over column blocks (CHECK.txt): derived from the weight,
    for the NPU's int4 GEMM. It is dropped with the other companions, never applied."""
    folder = fixture_dir(W4A8_V1)
    tensors = load_all(folder)
    for name in DENSE_PROJECTIONS["model.layers.0.o_proj.weight"]:
        w = expected(folder, name, torch.float32)
        bias = tensors[name[: -len(".weight")] + ".scale_bias"]
        blocks = 8 * w.reshape(w.shape[0], bias.shape[1], -1).sum(-1)
        assert torch.allclose(bias, blocks, rtol=1e-4, atol=1e-6)
    load_draft(folder)
    message = [r for r in caplog.records if r.name == "sglang_mtp_dequant"][0].getMessage()
    assert "(W4A8_DYNAMIC x7)" in message and "21 companion tensors consumed" in message
    assert not [r for r in caplog.records if "not found in params_dict" in r.getMessage()]


# -- the V0 format references (tiny Qwen3, no MTP) -------------------------------------------


def model_dtype(folder: str) -> torch.dtype:
    with open(os.path.join(folder, "config.json")) as handle:
        return getattr(torch, json.load(handle)["dtype"])


@pytest.mark.parametrize("in_fp32", [False, True], ids=["model-dtype", "fp32"])
@pytest.mark.parametrize("name", V0_REFERENCES)
def test_v0_references_bit_identical_to_fp32_dequant(name, in_fp32):
    """In the model's dtype and in fp32 itself: the decoder rounds once, like the formula."""
    folder = fixture_dir(name)
    dtype = torch.float32 if in_fp32 else model_dtype(folder)
    out = stream_through_plugin(folder, dtype)
    desc = description(folder)
    quantized = [n for n, t in desc.items() if n.endswith(".weight") and t != "FLOAT"]
    assert len(quantized) == 14
    for n in quantized:
        assert out[n].dtype == dtype
        assert torch.equal(out[n], expected(folder, n, dtype)), n
    leftovers = [n for n in out if not n.endswith((".weight", ".bias"))]
    assert leftovers == [], "companions must never reach sglang's loader"


# measured bound of each reference (in steps): RTN in bf16 arithmetic, two roundings for the
# two-stage form (see test_two_stage_error_is_two_roundings), GPTQ error propagation
V0_BOUND = {
    "qwen3_v0_w4a16_per_channel": 0.57,
    "qwen3_v0_w4a8_dynamic_two_stage": 0.59,
    "qwen3_v0_w4a16_per_group": 2.5,
}


@pytest.mark.parametrize("name", V0_REFERENCES)
def test_v0_references_within_quantization_error_of_source(name):
    folder = fixture_dir(name)
    tensors, desc = load_all(folder), description(folder)
    source = load_file(reference_file(name))
    out = stream_through_plugin(folder, torch.float32)
    for n, scheme in desc.items():
        if not n.endswith(".weight") or scheme == "FLOAT":
            continue
        w = source[n].float()
        step = int4_step(tensors, n, w.shape[1])
        err = (out[n] - w).abs() / step
        assert err.max() <= V0_BOUND[name], f"{n}: {err.max():.3f} steps"
        assert err.mean() <= 0.4, f"{n}: mean {err.mean():.3f} steps"


def test_two_stage_formula_is_the_one_msmodelslim_uses():
    """w = (q * weight_scale_second) * weight_scale, proven on the tool's output three ways."""
    folder = fixture_dir("qwen3_v0_w4a8_dynamic_two_stage")
    tensors, source = load_all(folder), load_file(reference_file("qwen3_v0_w4a8_dynamic_two_stage"))
    base = "model.layers.0.mlp.down_proj"
    q = unpack_int4_rows(tensors[base + ".weight"]).float()
    s1, s2 = tensors[base + ".weight_scale"], tensors[base + ".weight_scale_second"]
    assert tensors[base + ".weight_offset"].abs().max() == 0
    assert tensors[base + ".weight_offset_second"].abs().max() == 0  # int64 zeros: symmetric
    assert torch.equal(s2, s2.round()), "second-stage scales are integers"
    # 1. msmodelslim's export computes scale_bias from exactly this dequantization (bf16 scales,
    #    complex_quantifier.py): it matches to the last bit
    w_bf16_scales = (q * expand_groups(s2.bfloat16(), q.shape[1])) * s1.bfloat16()
    blocks = tensors[base + ".scale_bias"].shape[1]
    bias = 8 * w_bf16_scales.reshape(q.shape[0], blocks, -1).sum(-1)
    assert torch.equal(bias, tensors[base + ".scale_bias"])
    # 2. it lands within 0.6 step of the source weight ...
    step = int4_step(tensors, base + ".weight", q.shape[1])
    w = (q * expand_groups(s2, q.shape[1])) * s1.float()
    assert ((w - source[base + ".weight"].float()).abs() / step).max() < 0.6
    # 3. ... and the formulas a reader might guess instead are far off
    without_second = q * s1.float()
    assert ((without_second - source[base + ".weight"].float()).abs() / step).max() > 5


def test_two_stage_error_is_two_roundings():
    """Quantizing to int8 (step s1) then to int4 (step s1*s2) errs by at most half of each."""
    folder = fixture_dir("qwen3_v0_w4a8_dynamic_two_stage")
    tensors = load_all(folder)
    source = load_file(reference_file("qwen3_v0_w4a8_dynamic_two_stage"))
    for n, scheme in description(folder).items():
        if not n.endswith(".weight") or scheme == "FLOAT":
            continue
        w = source[n].float()
        s2 = expand_groups(tensors[n[: -len(".weight")] + ".weight_scale_second"], w.shape[1])
        step = int4_step(tensors, n, w.shape[1])
        got = dequantize_int4_fp32(tensors, n, scheme, "1.0.0")
        assert ((got - w).abs() / step - (0.5 + 0.5 / s2)).max() <= 1e-3, n


# -- layouts with no tool output: built from the tool's codes, then checked the same way --------


def rewrite(folder: str, tensors: dict, desc: dict) -> None:
    """The copied fixture's weights replaced by ``tensors`` in one file, its description by
    ``desc`` (whose global entries are kept)."""
    for f in os.listdir(folder):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(folder, f))
    write_modelslim_checkpoint(
        folder, tensors, desc, version=None, group_size=None, model_quant_type=None, indent=None
    )


def test_w4a16_per_group_packs_along_out(tmp_path):
    """msmodelslim packs per-group W4A16 along ``out`` (``_w4a16_pack_int4``, trans_flag False).

    The per-group reference holds per-channel scales on disk (its "group" is GPTQ's block), so
    the layout is built from the per-channel tool output: its codes re-packed along ``out`` with
    msmodelslim's algorithm, its scale/offset repeated per group of 32 (the same values).
    """
    source = fixture_dir("qwen3_v0_w4a16_per_channel")
    folder = str(tmp_path / "per_group")
    shutil.copytree(source, folder)
    tensors, desc = load_all(source), description(source)
    for n, scheme in list(desc.items()):
        if not n.endswith(".weight") or scheme != "W4A16":
            continue
        base = n[: -len(".weight")]
        q = unpack_int4_cols(tensors[n])
        tensors[n] = pack_int4_rows(q)
        for suffix in ("weight_scale", "weight_offset"):
            tensors[f"{base}.{suffix}"] = expand_groups(tensors[f"{base}.{suffix}"], q.shape[1])[
                :, ::32
            ].contiguous()
    desc["group_size"] = 32
    rewrite(folder, tensors, desc)
    got = stream_through_plugin(folder, torch.float32)
    for n, scheme in desc.items():
        if n.endswith(".weight") and scheme == "W4A16":
            assert tensors[n].shape[0] * 2 == got[n].shape[0]
            assert torch.equal(got[n], expected(source, n, torch.float32)), n


@pytest.mark.parametrize("name", [W4A8_V1, "qwen3_v0_w4a16_per_channel"])
def test_legacy_one_code_per_byte(tmp_path, name):
    """Savers before the ascendv1 format store one int4 code per int8 and write no version."""
    source = fixture_dir(name)
    folder = str(tmp_path / "legacy")
    shutil.copytree(source, folder)
    tensors, desc = load_all(source), description(source)
    for n in [n for n, t in desc.items() if n.endswith(".weight") and t.startswith("W4")]:
        stored = tensors[n]
        scale_rows = tensors[n[: -len(".weight")] + ".weight_scale"].shape[0]
        packed_rows = stored.shape[0] * 2 == scale_rows
        tensors[n] = (unpack_int4_rows(stored) if packed_rows else unpack_int4_cols(stored)).to(
            torch.int8
        )
    del desc["version"]
    rewrite(folder, tensors, desc)
    got = stream_through_plugin(folder, torch.bfloat16)
    for n, scheme in desc.items():
        if n.endswith(".weight") and scheme.startswith("W4"):
            assert tensors[n].shape == got[n].shape
            assert torch.equal(got[n], expected(source, n)), n


# -- refusals ------------------------------------------------------------------------------------


def test_packed_w4a16_without_version_is_refused_at_decode(tmp_path):
    """Packed per-channel W4A16 and unpacked W4A16 look alike by shape; only the description's
    version tells them apart. Without it the bytes leave the int4 range: a clear error."""
    from sglang_mtp_dequant.errors import DraftWeightError

    folder = str(tmp_path / "no_version")
    shutil.copytree(fixture_dir("qwen3_v0_w4a16_per_channel"), folder)
    edit_description(folder, lambda desc: {k: v for k, v in desc.items() if k != "version"})
    with pytest.raises(DraftWeightError, match="version") as info:
        stream_through_plugin(folder, torch.bfloat16)
    assert info.value.tensor.endswith("_proj.weight") and info.value.file.endswith(".safetensors")


def test_nonzero_w4a8_offset_is_refused(tmp_path):
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from support.checkpoints import open_checkpoint

    folder = str(tmp_path / "offset")
    shutil.copytree(fixture_dir(W4A8_V1), folder)
    path = os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors")

    def nonzero_offset(tensors):
        tensors["mtp.layers.0.mlp.up_proj.weight_offset"][3] = 2.0

    edit_tensors(path, nonzero_offset, metadata=None)
    plan = DequantPlan.build(open_checkpoint(folder, wanted=lambda n: n.startswith("mtp.")))
    (refused,) = plan.errors
    assert refused.info.name == "mtp.layers.0.mlp.up_proj.weight"
    assert "nonzero weight_offset" in str(refused.error) and path in str(refused.error)
