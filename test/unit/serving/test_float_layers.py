"""The FLOAT-layer decision per MoE layer (``formats/description.py``, which
``serving/float_layers.py`` applies), from descriptions alone (no sglang):
the committed fixtures' descriptions and hand-made ones. The hook itself, on sglang's real
classes, is tested in ``test/integration/test_float_moe_layers.py``."""

from __future__ import annotations

import json
import os

import pytest

from sglang_mtp_dequant.errors import MixedPrecisionLayerError
from sglang_mtp_dequant.formats import description as described
from sglang_mtp_dequant.serving import float_layers
from support.paths import E2E

MTP = "mtp.layers.0.mlp.experts"


def description_of(fixture: str) -> dict:
    with open(os.path.join(E2E, fixture, "quant_model_description.json"), encoding="utf-8") as f:
        return json.load(f)


def test_float_experts_fixture_every_expert_layer_built_unquantized():
    plan = described.moe_layer_plan(description_of("moe_float_experts"))
    assert plan.built_unquantized == (*(f"model.layers.{i}.mlp.experts" for i in range(4)), MTP)
    assert plan.refused == () and plan.stock == ()
    assert plan.stock_fails == plan.built_unquantized


def test_quantized_experts_are_left_to_sglang():
    plan = described.moe_layer_plan(description_of("moe_w8a8"))
    assert plan.built_unquantized == () and plan.refused == ()
    assert MTP in plan.stock and len(plan.stock) == 5
    assert plan.stock_fails == ()


def test_a_dense_description_has_no_moe_layer():
    assert described.moe_layers(description_of("w8a8")) == []


def _experts(
    schemes: dict[int, str], layer: str = MTP, names=("gate_proj", "up_proj", "down_proj")
):
    return {f"{layer}.{e}.{p}.weight": s for e, s in schemes.items() for p in names}


@pytest.mark.parametrize(
    "schemes, decision",
    [
        ({0: "FLOAT", 1: "FLOAT"}, "built_unquantized"),
        ({0: "W8A8_DYNAMIC", 1: "W8A8_DYNAMIC"}, "stock"),
        ({0: "FLOAT", 1: "W8A8_DYNAMIC"}, "refused"),
        ({0: "W8A8_DYNAMIC", 1: "FLOAT"}, "refused"),  # stock would build it quantized
        ({0: "W4A8_DYNAMIC", 1: "FLOAT"}, "refused"),
    ],
)
def test_decision_per_layer(schemes, decision):
    plan = described.moe_layer_plan(_experts(schemes))
    got = {
        "built_unquantized": plan.built_unquantized,
        "stock": plan.stock,
        "refused": tuple(p.layer for p in plan.refused),
    }
    assert got[decision] == (MTP,)
    assert sum(len(v) for v in got.values()) == 1


def test_w13_float_w2_quantized_is_refused():
    description = {**_experts({0: "FLOAT"}), f"{MTP}.0.down_proj.weight": "W8A8_DYNAMIC"}
    assert [p.layer for p in described.moe_layer_plan(description).refused] == [MTP]


def test_w1_w3_w2_naming_is_read_as_sglang_reads_it():
    description = _experts({0: "FLOAT", 1: "FLOAT"}, names=("w1", "w3", "w2"))
    assert described.moe_layer_plan(description).built_unquantized == (MTP,)


def test_refusal_names_the_layer_an_example_of_each_precision_and_the_launch():
    precision = described.ExpertPrecision(MTP, _experts({0: "FLOAT", 1: "W8A8_DYNAMIC"}))
    error = float_layers.refusal(precision, is_draft=True)
    assert isinstance(error, MixedPrecisionLayerError) and error.layer == MTP
    text = str(error)
    assert text.startswith(f"sglang-mtp-dequant: MoE layer {MTP}: ")
    assert f"{MTP}.0.gate_proj.weight" in text and f"{MTP}.1.gate_proj.weight" in text
    assert "3 expert projection(s) FLOAT" in text and "3 W8A8_DYNAMIC" in text
    assert "F1 (no quantization flag) or F3 (--speculative-draft-model-quantization unquant)" in (
        error.hint
    )


def test_refusal_of_a_target_layer_names_the_re_export():
    layer = "model.layers.3.mlp.experts"
    precision = described.ExpertPrecision(layer, _experts({0: "FLOAT", 1: "W8A8"}, layer))
    hint = float_layers.refusal(precision, is_draft=False).hint
    assert "re-export" in hint and "unquant" not in hint


# -- which layers are the draft's: the MTP classes' and the NextN layer's ---------------------

NEXTN = "model.layers.2.mlp.experts"


def _nextn_description() -> dict:
    """A NextN export's description as msmodelslim writes it: target layers 0 and 1, the NextN
    draft layer 2 after them (``num_hidden_layers`` = 2)."""
    made = {f"model.layers.{i}.self_attn.q_a_proj.weight": "W8A8" for i in range(3)}
    return {**made, **_experts({0: "FLOAT", 1: "FLOAT"}, NEXTN), "model.norm.weight": "FLOAT"}


def test_the_nextn_layer_is_the_highest_listed_and_the_draft_s():
    made = _nextn_description()
    assert described.nextn_layer_of(made) == "model.layers.2"
    is_draft = described.draft_layers(made)
    assert is_draft(f"{NEXTN}.0.up_proj.weight") and is_draft("model.decoder.mlp.experts")
    assert not is_draft("model.layers.1.self_attn.q_a_proj.weight")
    assert not is_draft("model.layers.20.mlp.experts")  # a prefix of another index is not it


def test_an_mtp_description_has_no_nextn_layer_and_its_draft_is_mtp():
    made = description_of("moe_float_experts")
    assert described.nextn_layer_of(made) is None
    is_draft = described.draft_layers(made)
    assert is_draft(f"{MTP}.0.up_proj.weight") and not is_draft("model.layers.3.mlp.experts")


def test_sglangs_nextn_decoder_is_looked_up_under_the_checkpoint_name():
    """sglang builds the NextN layer as ``model.decoder`` (off the NPU's one-folder naming) and
    its loader maps ``model.layers.<n>`` there: the description says it under the latter."""
    made = _nextn_description()
    assert described.described_as(made, "model.decoder.mlp.experts") == NEXTN
    assert described.described_as(made, NEXTN) == NEXTN
    assert described.described_as(made, "model.decoderx.mlp") == "model.decoderx.mlp"
    assert described.described_as(description_of("w8a8"), "model.decoder.mlp") == (
        "model.decoder.mlp"
    )


def test_the_nextn_layer_with_float_experts_is_not_the_targets_stop():
    """Issue 48: layer 2 of a GLM-5 export whose NextN layer is FLOAT was called the target's."""
    made = _nextn_description()
    plan = described.moe_layer_plan(made)
    assert plan.built_unquantized == (NEXTN,)
    assert plan.target_stops(described.draft_layers(made)) == ()
    assert plan.target_stops(lambda name: name.startswith("mtp.")) == (NEXTN,)  # the old rule
    experts = description_of("moe_float_experts")
    stops = described.moe_layer_plan(experts).target_stops(described.draft_layers(experts))
    assert stops == tuple(f"model.layers.{i}.mlp.experts" for i in range(4))
