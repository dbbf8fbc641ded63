"""The weight-stream transform (serving/stream.py) with a real plan of a checkpoint written in
the test: what reaches sglang's loaders, by name, dtype and bits."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.formats.plan import DequantPlan
from sglang_mtp_dequant.serving.stream import DequantizingStream
from support.checkpoints import write_modelslim_checkpoint
from support.reference import quantize_w8a8_dynamic, same_bits
from unit.helpers import W, open_folder

V = "mtp.layers.0.mlp.down_proj"
TARGET = "model.layers.0.mlp.up_proj.weight"
NORM = "mtp.norm.weight"


def checkpoint(folder: str) -> dict[str, torch.Tensor]:
    """W and V as W8A8_DYNAMIC with non-zero offsets (so the offset is exercised), a FLOAT
    norm; the tensors as written."""
    generator = torch.Generator().manual_seed(3)
    tensors: dict[str, torch.Tensor] = {}
    desc: dict[str, str] = {}
    for name, shape in ((W, (8, 16)), (V, (16, 8))):
        parts = quantize_w8a8_dynamic(torch.randn(*shape, generator=generator))
        parts["weight_offset"] = torch.randint(
            -3, 4, parts["weight_scale"].shape, generator=generator
        ).float()
        for suffix, value in parts.items():
            tensors[f"{name}.{suffix}"] = value
            desc[f"{name}.{suffix}"] = "W8A8_DYNAMIC"
    tensors[NORM] = torch.randn(16, generator=generator).bfloat16()
    desc[NORM] = "FLOAT"
    write_modelslim_checkpoint(folder, tensors, desc)
    return tensors


def expected(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """``(q - offset) * scale`` in fp32, rounded once to bf16."""
    q = tensors[f"{name}.weight"].float()
    scale = tensors[f"{name}.weight_scale"].float()
    offset = tensors[f"{name}.weight_offset"].float()
    return ((q - offset) * scale).to(torch.bfloat16)


def stream_of(folder: str, **options) -> DequantizingStream:
    plan = DequantPlan.build(open_folder(folder))
    return DequantizingStream(
        lambda: plan, torch.bfloat16, lambda n: n.startswith("mtp."), **options
    )


def test_planned_weights_are_decoded_bit_for_bit_and_companions_dropped(tmp_path):
    tensors = checkpoint(str(tmp_path))
    target = torch.randint(-128, 127, (4, 4), dtype=torch.int8)
    stream = stream_of(str(tmp_path))
    out = list(stream.apply([*sorted(tensors.items()), (TARGET, target)]))
    names = [n for n, _ in out]
    assert names == [f"{V}.weight", W + ".weight", NORM, TARGET]
    got = dict(out)
    assert same_bits(got[f"{W}.weight"], expected(tensors, W))
    assert same_bits(got[f"{V}.weight"], expected(tensors, V))
    assert got[NORM] is tensors[NORM]
    assert got[TARGET] is target  # not the draft's: sglang's business, int8 or not


def test_stats_count_what_the_pass_did(tmp_path):
    tensors = checkpoint(str(tmp_path))
    stream = stream_of(str(tmp_path))
    list(stream.apply(sorted(tensors.items())))
    stats = stream.stats
    assert stats.dequantized == 2
    assert dict(stats.schemes) == {"W8A8_DYNAMIC": 2}
    assert stats.quantized_bytes == 8 * 16 + 16 * 8  # int8: one byte a code
    assert stats.decoded_codes == 256
    assert stats.companions_consumed == 4
    assert stats.already_float == 0 and stats.left_to_other_ranks == 0
    assert stats.seconds > 0
    assert stream.streamed[f"{W}.weight"] == torch.int8
    assert stream.streamed[NORM] == torch.bfloat16
    assert stream.streamed[f"{W}.weight_scale"] == torch.float32


def test_the_observer_is_told_each_draft_tensor_handed_on(tmp_path):
    tensors = checkpoint(str(tmp_path))
    seen: list[tuple[str, torch.dtype]] = []
    stream = stream_of(str(tmp_path), observer=lambda n, t: seen.append((n, t.dtype)))
    list(stream.apply([*sorted(tensors.items()), (TARGET, torch.zeros(2))]))
    assert seen == [
        (f"{V}.weight", torch.bfloat16),
        (f"{W}.weight", torch.bfloat16),
        (NORM, torch.bfloat16),
    ]


def test_an_already_float_planned_weight_is_passed_through_untouched(tmp_path):
    tensors = checkpoint(str(tmp_path))
    upstream = expected(tensors, W)  # what an upstream fix would already have decoded
    stream = stream_of(str(tmp_path))
    got = dict(
        stream.apply(
            [(f"{W}.weight", upstream), (f"{W}.weight_scale", tensors[f"{W}.weight_scale"])]
        )
    )
    assert got == {f"{W}.weight": upstream} and got[f"{W}.weight"] is upstream
    assert stream.stats.already_float == 1 and stream.stats.dequantized == 0
    assert stream.stats.companions_consumed == 1


def test_an_unplanned_int8_draft_weight_is_refused_naming_it(tmp_path):
    tensors = checkpoint(str(tmp_path))
    stray = "mtp.layers.0.mlp.gate_proj.weight"
    stream = stream_of(str(tmp_path))
    with pytest.raises(DraftWeightError) as caught:
        list(stream.apply([(NORM, tensors[NORM]), (stray, torch.ones(4, 4, dtype=torch.int8))]))
    assert caught.value.tensor == stray and caught.value.file is None
    message = str(caught.value)
    assert f"draft tensor {stray!r}: streamed as int8 codes into an unquantized draft" in message
    assert "What to do: serve the draft quantized, or load it from a local checkpoint" in message


def test_the_refusal_carries_the_callers_hint_and_can_be_turned_off(tmp_path):
    checkpoint(str(tmp_path))
    stray = ("mtp.layers.0.mlp.gate_proj.weight", torch.ones(4, 4, dtype=torch.float8_e4m3fn))
    with pytest.raises(DraftWeightError, match="What to do: pass a local folder$"):
        list(stream_of(str(tmp_path), missing_plan_hint="pass a local folder").apply([stray]))
    out = list(stream_of(str(tmp_path), refuse_raw_codes=False).apply([stray]))
    assert out == [stray]


def test_integer_companions_of_unplanned_weights_are_left_to_sglang(tmp_path):
    checkpoint(str(tmp_path))
    bias = ("mtp.layers.0.self_attn.o_proj.quant_bias", torch.zeros(4, dtype=torch.int32))
    assert list(stream_of(str(tmp_path)).apply([bias])) == [bias]


def test_without_a_plan_raw_codes_are_refused_and_floats_pass(tmp_path):
    stream = DequantizingStream(lambda: None, torch.bfloat16, lambda n: n.startswith("mtp."))
    norm = (NORM, torch.ones(4, dtype=torch.bfloat16))
    assert list(stream.apply([norm])) == [norm]
    with pytest.raises(DraftWeightError, match="mtp.fc.weight"):
        list(stream.apply([norm, ("mtp.fc.weight", torch.ones(2, 2, dtype=torch.uint8))]))


def test_a_weight_streaming_unlike_its_header_is_refused_naming_the_file(tmp_path):
    checkpoint(str(tmp_path))
    stream = stream_of(str(tmp_path))
    with pytest.raises(DraftWeightError) as caught:
        list(stream.apply([(f"{W}.weight", torch.zeros(8, 8, dtype=torch.int8))]))
    assert caught.value.tensor == f"{W}.weight"
    assert caught.value.file == os.path.join(str(tmp_path), "quant_model_weights.safetensors")
    assert "streamed as torch.int8[8, 8], but the header said int8[8, 16]" in str(caught.value)


def test_the_plan_is_made_on_the_first_tensor_not_before():
    """sglang resolves its files when its iterator is first advanced: an empty stream never
    asks for a plan."""

    def planner():
        raise AssertionError("planned with nothing streamed")

    stream = DequantizingStream(planner, torch.bfloat16, lambda n: True)
    assert list(stream.apply([])) == []
    assert stream.plan is None
