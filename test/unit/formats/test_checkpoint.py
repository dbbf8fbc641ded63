"""What a checkpoint folder holds (formats/checkpoint.py): headers, index files, description."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang_mtp_dequant.errors import CheckpointFormatError
from sglang_mtp_dequant.formats.checkpoint import dtype_name, is_code_dtype
from support.checkpoints import edit_description
from unit.helpers import W, open_folder, w8a8_checkpoint


def test_headers_give_file_dtype_and_shape(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    ckpt = open_folder(str(tmp_path))
    info = ckpt.tensors[f"{W}.weight"]
    assert info.dtype == torch.int8 and info.shape == (8, 16) and info.holds_codes
    assert info.file == os.path.join(str(tmp_path), "quant_model_weights.safetensors")
    assert ckpt.type_of(f"{W}.weight") == "W8A8_DYNAMIC" and ckpt.group_size == 0
    assert not ckpt.tensors["mtp.norm.weight"].holds_codes


def test_only_wanted_names_are_recorded(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    ckpt = open_folder(str(tmp_path), wanted=lambda name: name.endswith("norm.weight"))
    assert set(ckpt.tensors) == {"mtp.norm.weight"}


def _index(folder, weight_map) -> str:
    path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(path, "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return path


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("../elsewhere.safetensors", "outside the checkpoint folder"),
        ("/abs/path.safetensors", "outside the checkpoint folder"),
        ("quant_model_weights-00002-of-00002.safetensors", "which does not exist"),
    ],
)
def test_an_index_entry_outside_the_folder_or_missing_is_refused(tmp_path, entry, problem):
    w8a8_checkpoint(str(tmp_path))
    index = _index(str(tmp_path), {f"{W}.weight": entry})
    with pytest.raises(CheckpointFormatError) as caught:
        open_folder(str(tmp_path))
    assert caught.value.file == index and problem in caught.value.problem
    assert "What to do: " in str(caught.value)


def test_a_missing_shard_no_wanted_name_is_in_is_left_to_whoever_needs_it(tmp_path):
    """The index's shards are judged once each; a missing one fails only a load that wants
    a name in it (the draft of a download holding just the draft's shards still opens)."""
    w8a8_checkpoint(str(tmp_path))
    _index(str(tmp_path), {f"{W}.weight": "quant_model_weights.safetensors",
                           "model.layers.0.mlp.w.weight": "absent-00001.safetensors"})  # fmt: skip
    ckpt = open_folder(str(tmp_path), wanted=lambda name: name.startswith("mtp."))
    assert f"{W}.weight" in ckpt.tensors
    with pytest.raises(CheckpointFormatError, match="'absent-00001.safetensors', which does not"):
        open_folder(str(tmp_path), wanted=lambda name: True)


@pytest.mark.parametrize("entry", [["a.safetensors"], {"a": 1}, 7, ""])
def test_an_index_entry_that_is_no_file_name_is_refused_by_name(tmp_path, entry):
    """An unhashable or non-string shard takes the name-by-name path, whose error names it."""
    w8a8_checkpoint(str(tmp_path))
    index = _index(str(tmp_path), {f"{W}.weight": entry})
    with pytest.raises(CheckpointFormatError) as caught:
        open_folder(str(tmp_path))
    assert caught.value.file == index
    assert f"maps '{W}.weight' to {entry!r}, not a file name" in caught.value.problem


def test_json_orjson_refuses_is_read_as_python_json_reads_it(tmp_path):
    """NaN and integers past 64 bits are JSON to Python's json, not to orjson: the fallback
    reads them as before; what neither reads raises json's error."""
    from sglang_mtp_dequant.formats.config import read_json

    path = tmp_path / "x.json"
    path.write_text('{"a": NaN, "b": 123456789012345678901234567890, "c": "\u00e9"}')
    got = read_json(str(path))
    assert got["a"] != got["a"] and got["b"] == 123456789012345678901234567890
    assert got["c"] == "\u00e9"
    path.write_text('{"a": ')
    with pytest.raises(json.JSONDecodeError):
        read_json(str(path))


def test_a_group_size_that_is_no_integer_is_refused(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    edit_description(str(tmp_path), lambda desc: desc.update(group_size="32"))
    with pytest.raises(CheckpointFormatError, match="group_size is '32'"):
        open_folder(str(tmp_path))


@pytest.mark.parametrize(
    "dtype, codes",
    [
        (torch.int8, True),
        (torch.uint8, True),
        (torch.int32, True),
        (torch.float8_e4m3fn, True),
        (torch.float8_e5m2, True),
        (torch.bfloat16, False),
        (torch.float32, False),
        (torch.bool, False),
        ("F8_E8M0", False),  # a header tag torch has no dtype for: not judged as codes
    ],
)
def test_code_dtypes(dtype, codes):
    assert is_code_dtype(dtype) is codes


def test_dtype_name():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name("F8_E8M0") == "F8_E8M0"
