"""The per-tensor decision (formats/plan.py) and the scheme registry, on tiny checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.formats.plan import DequantPlan
from sglang_mtp_dequant.formats.schemes import register_scheme
from sglang_mtp_dequant.formats.schemes.int8 import AffineInt8
from support.checkpoints import dropping, edit_description, edit_tensors
from support.reference import dequantize_fp32
from unit.helpers import W, open_folder, w8a8_checkpoint

V = "mtp.layers.0.mlp.down_proj"


def test_codes_with_their_scales_are_decoded_bit_for_bit(tmp_path):
    tensors = w8a8_checkpoint(str(tmp_path))
    plan = DequantPlan.build(open_folder(str(tmp_path)))
    entry = plan.entries[f"{W}.weight"]
    assert entry.action == "dequantize" and entry.scheme == "W8A8_DYNAMIC"
    assert {f"{W}.weight_scale", f"{W}.weight_offset"} <= plan.consumed
    got = entry.decoder.decompress(tensors[f"{W}.weight"], torch.bfloat16)
    want = dequantize_fp32(tensors, f"{W}.weight", "W8A8_DYNAMIC").bfloat16()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert plan.entries["mtp.norm.weight"].action == "keep"


def test_a_missing_scale_is_refused_naming_tensor_and_file(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    path = edit_tensors(str(tmp_path), dropping(f"{W}.weight_scale"))
    plan = DequantPlan.build(open_folder(str(tmp_path)))
    (refused,) = plan.errors
    assert refused.info.name == f"{W}.weight" and refused.error.file == path
    assert f"has no {W}.weight_scale" in str(refused.error)


def test_the_first_refusal_names_the_others(tmp_path):
    w8a8_checkpoint(str(tmp_path), names=(W, V))
    edit_tensors(str(tmp_path), dropping(f"{W}.weight_scale", f"{V}.weight_scale"))
    plan = DequantPlan.build(open_folder(str(tmp_path)))
    with pytest.raises(DraftWeightError) as caught:
        plan.raise_first_error()
    assert caught.value.tensor == f"{V}.weight"  # sorted: down_proj first
    assert f"(also refused: {W}.weight)" in str(caught.value)


def test_a_scheme_nothing_decodes_is_refused_listing_what_is(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    edit_description(str(tmp_path), lambda d: d.update({f"{W}.weight": "W9A9_NOPE"}))
    plan = DequantPlan.build(open_folder(str(tmp_path)))
    (refused,) = plan.errors
    assert "W9A9_NOPE, a scheme this plugin does not decode" in str(refused.error)
    assert "W8A8_DYNAMIC" in str(refused.error)


def test_a_described_type_stored_as_float_is_kept(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    edit_tensors(
        str(tmp_path), lambda t: t.update({f"{W}.weight": t[f"{W}.weight"].to(torch.bfloat16)})
    )
    entry = DequantPlan.build(open_folder(str(tmp_path))).entries[f"{W}.weight"]
    assert entry.action == "keep" and entry.reason.startswith("described as W8A8_DYNAMIC but")


def test_the_registry_refuses_a_type_registered_twice():
    class Again(AffineInt8):
        types = ("W8A8_DYNAMIC",)

    with pytest.raises(ValueError, match="Again registers 'W8A8_DYNAMIC', which AffineInt8"):
        register_scheme(Again)


def test_the_plan_reads_no_weight_bytes(tmp_path, monkeypatch):
    """Only headers and the small companions: reading a weight's bytes here would double the
    I/O of a load (sglang streams every weight once)."""
    import safetensors

    w8a8_checkpoint(str(tmp_path))
    real_open = safetensors.safe_open
    read: list[str] = []

    class Spy:
        def __init__(self, *args, **kwargs):
            self.handle = real_open(*args, **kwargs)

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.handle.get_tensor(name)

        def __getattr__(self, attribute):
            return getattr(self.handle, attribute)

    from sglang_mtp_dequant.formats import checkpoint

    monkeypatch.setattr(checkpoint, "safe_open", Spy)
    DequantPlan.build(open_folder(str(tmp_path)))
    assert read and not [n for n in read if n.endswith(".weight")], read
    assert os.path.exists(tmp_path / "quant_model_description.json")
    json.loads((tmp_path / "quant_model_description.json").read_text())
