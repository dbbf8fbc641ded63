"""What msmodelslim 26.1.0's static W8A8 writes for a biased projection (real export).

The fixture ``q35_dense_w8a8_static_bias`` is a tiny Qwen3.5 with ``attention_bias=True``
exported by msmodelslim (RECIPE.md). The float ``X.bias`` must be there, equal to the source
bias, so a draft built unquantized keeps its bias when ``quant_bias`` (the int8 GEMM's term)
is dropped, as the plugin's static scheme does.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file

from support.paths import REFERENCE, fixture_dir

FIXTURE = fixture_dir("q35_dense_w8a8_static_bias")
PROJS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _tensors() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    weights = load_file(os.path.join(FIXTURE, "quant_model_weights-00001-of-00001.safetensors"))
    reference = load_file(os.path.join(REFERENCE, "q35_dense_w8a8_static_bias.safetensors"))
    with open(os.path.join(FIXTURE, "quant_model_description.json")) as handle:
        return weights, reference, json.load(handle)


def test_float_bias_is_written_beside_quant_bias_and_equals_the_source() -> None:
    weights, reference, desc = _tensors()
    for proj in PROJS:
        base = f"mtp.layers.0.self_attn.{proj}"
        assert desc[f"{base}.weight"] == "W8A8"
        assert desc[f"{base}.bias"] == "FLOAT"
        assert weights[f"{base}.quant_bias"].dtype == torch.int32
        bias = weights[f"{base}.bias"]
        assert bias.dtype == torch.float32
        assert torch.equal(bias, reference[f"{base}.bias"].float())


def test_quant_bias_is_the_bias_folded_into_the_int8_gemm() -> None:
    """(quant_bias + input_offset * sum_j q[i, j]) * deq_scale gives the bias back to within
    msmodelslim's own rounding (below 1e-3 here, bias absmax ~0.16); without the input_offset
    term it does not (off by > 0.01). The float ``.bias`` is what a dequantized draft loads."""
    weights, reference, _ = _tensors()
    for proj in PROJS:
        base = f"mtp.layers.0.self_attn.{proj}"
        q = weights[f"{base}.weight"].double()
        deq = weights[f"{base}.deq_scale"].double()
        offset = weights[f"{base}.input_offset"].double()
        recovered = (weights[f"{base}.quant_bias"].double() + offset * q.sum(1)) * deq
        bias = reference[f"{base}.bias"].double()
        assert (recovered - bias).abs().max().item() < 1e-3, base
        naive = weights[f"{base}.quant_bias"].double() * deq
        assert (naive - bias).abs().max().item() > 0.01, base
