"""transformers' quantized target (``e2e/quantized_reference.py``): its W8A8_DYNAMIC arithmetic
against the servers' CPU stand-ins for the Ascend kernels (``e2e_shim_npu_ops``, whose own
arithmetic ``test_e2e_shims.py`` checks against numpy), and its model against the export's
files. The reference shares no code with the stand-ins: agreeing here is what lets it stand
beside sglang's quantized target in docs/results.md."""

from __future__ import annotations

import os

import e2e_shim_npu_ops as npu_ops
import pytest
import torch
from safetensors.torch import load_file

from e2e import quantized_reference as qref
from support.paths import E2E

Q36, FLOAT = os.path.join(E2E, "hybrid_qwen36_recipe"), os.path.join(E2E, "hybrid_float")
WEIGHTS = "quant_model_weights-00001-of-00001.safetensors"
GDN_QKV = "model.layers.0.linear_attn.in_proj_qkv"


def test_per_token_int8_is_the_stand_ins_formula_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(17, 192, generator=generator) * torch.rand(17, 1, generator=generator) * 20
    x[3] = 0.0  # an all-zero token stays zero
    codes, scale = npu_ops.dynamic_quant(x)
    want = codes.to(torch.float32) * scale[:, None]
    assert torch.equal(qref.per_token_int8(x), want)
    assert qref.per_token_int8(x)[3].abs().max() == 0


def test_a_w8a8_layer_computes_what_the_stand_in_matmul_computes():
    """A real layer of the export (layer 0's GDN ``in_proj_qkv``): the reference's float32
    product against the stand-ins' exact integer product times both scales, to float32
    rounding; and not the float model's output (the layer is quantized)."""
    tensors = load_file(os.path.join(Q36, WEIGHTS))
    q, scale, offset = (
        tensors[f"{GDN_QKV}.{p}"] for p in ("weight", "weight_scale", "weight_offset")
    )
    layer = qref.W8A8DynamicLinear(q, scale, offset)
    x = torch.randn(9, q.shape[1], generator=torch.Generator().manual_seed(1))
    codes, x_scale = npu_ops.dynamic_quant(x)
    want = npu_ops.quant_matmul(
        codes, q.T.contiguous(), scale.flatten(), pertoken_scale=x_scale, output_dtype=torch.float32
    )
    got = layer(x)
    bound = 1e-5 * (qref.per_token_int8(x).abs() @ layer.weight.abs().T) + 1e-7
    assert torch.all((got - want).abs() <= bound), float((got - want).abs().max())
    float_weight = load_file(os.path.join(FLOAT, "model.safetensors"))[f"{GDN_QKV}.weight"]
    assert (got - x @ float_weight.to(torch.float32).T).abs().max() > 1e-4


@pytest.fixture(scope="module")
def qwen36_model():
    return qref.build(Q36)


def test_every_layer_the_description_quantizes_is_replaced(qwen36_model):
    layers = qref.quantized_linears(Q36)
    assert len(layers) == 22 and f"{GDN_QKV}" in layers
    assert not any(name.startswith("mtp.") for name in layers)
    replaced = sorted(
        n for n, m in qwen36_model.named_modules() if isinstance(m, qref.W8A8DynamicLinear)
    )
    assert replaced == layers
    assert "model.layers.0.linear_attn.in_proj_b" not in layers  # FLOAT in this recipe


def test_every_other_tensor_is_the_exports_own(qwen36_model):
    """No parameter keeps transformers' initial value: each equals the export's tensor."""
    tensors = load_file(os.path.join(Q36, WEIGHTS))
    state = qwen36_model.state_dict()
    quantized = set(qref.quantized_linears(Q36))
    checked = 0
    for name, value in state.items():
        if name.rsplit(".", 1)[0] in quantized:
            continue
        assert torch.equal(value, tensors[name].to(torch.float32)), name
        checked += 1
    assert checked == sum(1 for _ in qwen36_model.parameters())


def test_a_layer_the_description_does_not_quantize_is_refused():
    with pytest.raises(ValueError, match="in_proj_b"):
        qref.build(Q36, ["model.layers.0.linear_attn.in_proj_b"], FLOAT)


def test_agreement_counts_positions_and_first_differences():
    want = [qref.Decode([1, 2, 3], []), qref.Decode([4, 5, 6], [])]
    got = [qref.Decode([1, 2, 3], []), qref.Decode([4, 9, 6], [])]
    assert qref.agreement(want, got) == (5, 6, [3, 1])


def test_discrepancy_compares_gaps_only_on_a_shared_path():
    """Each top token's logit minus the first decode's choice, in both; a step is compared
    while the two contexts are equal (step 1 here though the choices there differ), not after."""
    a = [qref.Decode([1, 2, 5], [{1: 5.0, 7: 4.0}, {2: 3.0, 7: 2.5}, {5: 1.0, 7: 0.0}])]
    b = [qref.Decode([1, 7, 5], [{1: -1.0, 7: -2.5}, {7: -0.1, 2: -0.2}, {5: 0.0, 7: -9.0}])]
    assert qref.discrepancy(a, b) == pytest.approx([0.5, 0.6])


def test_the_two_recipes_exports_differ_only_in_the_six_gdn_matrices():
    """What lets docs/results.md read "the Qwen3.6 export with its GDN layers left float" as the
    Qwen3.5 export: every tensor of the Qwen3.5 export is the Qwen3.6 export's, except
    ``in_proj_qkv`` / ``in_proj_z`` of the three GDN layers (float there, codes here)."""
    q36 = load_file(os.path.join(Q36, WEIGHTS))
    q35 = load_file(os.path.join(E2E, "hybrid_w8a8", WEIGHTS))
    differing = sorted(
        k for k, v in q35.items() if not (v.dtype == q36[k].dtype and torch.equal(v, q36[k]))
    )
    gdn = [
        f"model.layers.{i}.linear_attn.{p}.weight"
        for i in range(3)
        for p in ("in_proj_qkv", "in_proj_z")
    ]
    assert differing == sorted(gdn)
    assert len(q35) == 117 and sorted(set(q36) - set(q35)) == sorted(
        f"{g[: -len('.weight')]}.{p}" for g in gdn for p in ("weight_scale", "weight_offset")
    )
