"""What a checkpoint folder holds (formats/checkpoint.py): headers, index files, description."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang_mtp_dequant.errors import CheckpointFormatError
from sglang_mtp_dequant.formats.checkpoint import dtype_name, is_code_dtype
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


def test_a_group_size_that_is_no_integer_is_refused(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    path = os.path.join(str(tmp_path), "quant_model_description.json")
    with open(path) as handle:
        desc = json.load(handle)
    desc["group_size"] = "32"
    with open(path, "w") as handle:
        json.dump(desc, handle)
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
