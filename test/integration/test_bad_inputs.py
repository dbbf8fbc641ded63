"""Bad input never becomes a silently wrong draft: the load stops with an error that names
the tensor, the file, the shapes and what to do. Each case edits a copy of the real fixture."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang_mtp_dequant.errors import CheckpointFormatError, DraftWeightError
from support.checkpoints import dropping, edit_description, edit_tensors

NAME = "q35_dense_w8a8_dynamic"
SHARD = "quant_model_weights-00001-of-00001.safetensors"
WEIGHT = "mtp.layers.0.self_attn.q_proj.weight"


def edit_shard(folder: str, edit) -> str:
    return edit_tensors(os.path.join(folder, SHARD), edit)


def expect_refusal(load_draft, folder, error_type=DraftWeightError, *fragments):
    with pytest.raises(error_type) as caught:
        load_draft(folder)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert "What to do:" in message
    return caught.value


def test_int8_weight_without_scale(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    path = edit_shard(folder, dropping(WEIGHT[: -len("weight")] + "weight_scale"))
    error = expect_refusal(load_draft, folder, DraftWeightError, WEIGHT, path, "no ")
    assert error.tensor == WEIGHT and error.file == path


@pytest.mark.parametrize("bad_shape", [(256, 3), (128, 1), (256, 64), (4,)])
def test_scale_shape_fits_neither_layout(load_draft, copy_checkpoint, bad_shape):
    folder = copy_checkpoint(NAME)
    scale_name = WEIGHT[: -len("weight")] + "weight_scale"

    def edit(tensors):
        tensors[scale_name] = torch.full(bad_shape, 0.01)

    path = edit_shard(folder, edit)
    expect_refusal(
        load_draft, folder, DraftWeightError, WEIGHT, path, str(list(bad_shape)), "[256, 64]"
    )


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), 0.0, -0.01])
def test_scale_not_finite_positive(load_draft, copy_checkpoint, bad_value):
    folder = copy_checkpoint(NAME)
    scale_name = WEIGHT[: -len("weight")] + "weight_scale"

    def edit(tensors):
        tensors[scale_name] = tensors[scale_name].clone()
        tensors[scale_name][7, 0] = bad_value

    path = edit_shard(folder, edit)
    expect_refusal(load_draft, folder, DraftWeightError, WEIGHT, path, "weight_scale")


def point_index_entry(folder: str, name: str, shard: str) -> str:
    """Make the index map ``name`` to ``shard``; returns the index path."""
    index_path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"][name] = shard
    with open(index_path, "w") as handle:
        json.dump(index, handle)
    return index_path


def test_index_entry_outside_the_folder(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    index_path = point_index_entry(folder, WEIGHT, "../elsewhere/" + SHARD)
    expect_refusal(load_draft, folder, CheckpointFormatError, index_path, WEIGHT, "outside")


def test_index_entry_naming_a_missing_shard(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    index_path = point_index_entry(folder, WEIGHT, "quant_model_weights-00002-of-00002.safetensors")
    expect_refusal(
        load_draft, folder, CheckpointFormatError, index_path, WEIGHT, "00002-of-00002", "not exist"
    )


def test_scheme_the_plugin_does_not_decode(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    edit_description(folder, lambda desc: desc.update({WEIGHT: "W2A2_FUTURE"}))
    expect_refusal(load_draft, folder, DraftWeightError, WEIGHT, "W2A2_FUTURE", "W8A8_DYNAMIC")


def test_refused_before_any_parameter_is_written(load_draft, copy_checkpoint, sglang_cpu):
    """The plan is checked before streaming: a refused load writes nothing into the draft."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    folder = copy_checkpoint(NAME)
    edit_shard(folder, dropping("mtp.layers.0.mlp.down_proj.weight_scale"))
    config, model = new_draft(folder)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(DraftWeightError):
        model.load_weights(sglang_weights(config, model))
    for name, param in model.named_parameters():
        # bitwise: torch.empty() leaves NaN patterns, and NaN != NaN
        assert torch.equal(before[name].view(torch.int16), param.detach().view(torch.int16)), name


def test_integer_draft_weight_with_no_plan_is_refused_in_the_stream():
    """No plan (the files sglang streams could not be found): integer codes still stop."""
    from sglang_mtp_dequant.serving.stream import DequantizingStream

    stream = DequantizingStream(lambda: None, torch.bfloat16, lambda n: n.startswith("mtp."))
    weights = [
        ("model.language_model.layers.0.mlp.up_proj.weight", torch.ones(2, 2, dtype=torch.int8)),
        ("mtp.fc.weight", torch.ones(2, 2, dtype=torch.bfloat16)),
        (WEIGHT, torch.ones(2, 2, dtype=torch.int8)),
    ]
    out = stream.apply(weights)
    assert next(out)[0].startswith("model.language_model")  # target weights are not ours
    assert next(out)[0] == "mtp.fc.weight"
    with pytest.raises(DraftWeightError, match="q_proj.weight"):
        next(out)


def test_asymmetric_w8a16_weight_without_offset(load_draft, copy_checkpoint):
    """W8A16 offsets are nonzero: without one every weight would decode shifted."""
    folder = copy_checkpoint("q35_dense_w8a16_asym")
    path = edit_shard(folder, dropping(WEIGHT[: -len("weight")] + "weight_offset"))
    expect_refusal(load_draft, folder, DraftWeightError, WEIGHT, path, "weight_offset")


# -- companions stored as a dtype their scheme does not define (checked from the headers) ------

STATIC = "q35_dense_w8a8_static"
TWO_STAGE = "qwen3_v0_w4a8_dynamic_two_stage"


@pytest.mark.parametrize(
    "fixture, suffix, dtype",
    [
        (NAME, "weight_scale", torch.int32),  # read as is: weights thousands of times too big
        (NAME, "weight_scale", torch.int64),
        (NAME, "weight_offset", torch.int8),
        ("q35_dense_w8a16_asym", "weight_offset", torch.int32),
        (STATIC, "deq_scale", torch.int32),  # f32, or the f32 bit pattern as int64 only
        (STATIC, "deq_scale", torch.float16),
        (STATIC, "input_scale", torch.int64),
    ],
)
def test_companion_of_an_undefined_dtype_is_refused(
    load_draft, copy_checkpoint, fixture, suffix, dtype
):
    folder = copy_checkpoint(fixture)
    name = WEIGHT[: -len("weight")] + suffix

    def edit(tensors):
        tensors[name] = (tensors[name].float() * 2**16).round().to(dtype)

    path = edit_shard(folder, edit)
    error = expect_refusal(
        load_draft, folder, DraftWeightError, name, path, str(dtype).replace("torch.", "")
    )
    assert error.tensor == name and error.file == path


def test_two_stage_second_scale_of_an_undefined_dtype_is_refused(sglang_cpu, copy_checkpoint):
    """The V0 two-stage W4A8 fixture (a Qwen3 checkpoint: planned, not built here)."""
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from support.checkpoints import open_checkpoint

    folder = copy_checkpoint(TWO_STAGE)
    shard = next(f for f in sorted(os.listdir(folder)) if f.endswith(".safetensors"))
    path = os.path.join(folder, shard)
    edited = []

    def to_int32(tensors):
        edited.append(next(n for n in sorted(tensors) if n.endswith("weight_scale_second")))
        tensors[edited[0]] = tensors[edited[0]].to(torch.int32)

    edit_tensors(path, to_int32)
    (name,) = edited
    plan = DequantPlan.build(open_checkpoint(folder, wanted=lambda n: True))
    refused = {e.error.tensor: e.error for e in plan.errors}
    assert name in refused and refused[name].file == path
    assert "int32" in str(refused[name]) and "What to do:" in str(refused[name])
