"""The one reader of config.json (formats/config.py) and the JSON reading every checkpoint file
goes through: what it returns, and the errors, each naming its file."""

from __future__ import annotations

import json
import os

import pytest

from sglang_mtp_dequant.errors import CheckpointFormatError
from sglang_mtp_dequant.formats.config import CheckpointConfig, load_json, read_json
from unit.helpers import open_folder, w8a8_checkpoint


def write_config(folder, content: object | str) -> str:
    path = os.path.join(str(folder), "config.json")
    with open(path, "w") as handle:
        handle.write(content if isinstance(content, str) else json.dumps(content))
    return path


def test_fields_at_the_top_level_or_under_text_config(tmp_path):
    write_config(
        tmp_path,
        {
            "architectures": ["Qwen3_5ForConditionalGeneration", "Other"],
            "model_type": "qwen3_5",
            "text_config": {"num_hidden_layers": 64, "model_type": "qwen3_5_text"},
        },
    )
    config = CheckpointConfig.read(str(tmp_path))
    assert config.path == os.path.join(str(tmp_path), "config.json")
    assert config.architecture == "Qwen3_5ForConditionalGeneration"
    assert config.value("num_hidden_layers") == 64  # only in text_config
    assert config.value("model_type") == "qwen3_5"  # the top level wins
    assert config.value("absent") is None
    assert config.text == {"num_hidden_layers": 64, "model_type": "qwen3_5_text"}


@pytest.mark.parametrize("architectures", [None, [], "Qwen3ForCausalLM", [3]])
def test_no_architecture_unless_a_list_starting_with_a_name(tmp_path, architectures):
    write_config(tmp_path, {"architectures": architectures, "text_config": "not an object"})
    config = CheckpointConfig.read(str(tmp_path))
    assert config.architecture is None
    assert config.text == {}


@pytest.mark.parametrize(
    "raw, dtype",
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
        ({"dtype": "float16", "torch_dtype": "bfloat16"}, "float16"),
        ({"torch_dtype": "float32", "text_config": {"torch_dtype": "bfloat16"}}, "bfloat16"),
        ({"text_config": {"dtype": "float16", "torch_dtype": "float32"}}, "float16"),
        ({"text_config": {"dtype": "int8"}, "torch_dtype": "float32"}, "float32"),
        ({"torch_dtype": "float8_e4m3fn"}, None),
        ({}, None),
    ],
)
def test_the_draft_dtype_text_config_first_dtype_before_torch_dtype(tmp_path, raw, dtype):
    write_config(tmp_path, raw)
    assert CheckpointConfig.read(str(tmp_path)).dtype == dtype


def test_the_namespace_gives_attribute_access_nested(tmp_path):
    write_config(tmp_path, {"hidden_size": 8, "text_config": {"rope": {"theta": 1e6}}})
    namespace = CheckpointConfig.read(str(tmp_path)).namespace()
    assert namespace.hidden_size == 8 and namespace.text_config.rope.theta == 1e6


def test_a_missing_config_is_refused_naming_the_path(tmp_path):
    with pytest.raises(CheckpointFormatError) as caught:
        CheckpointConfig.read(str(tmp_path))
    path = os.path.join(str(tmp_path), "config.json")
    assert caught.value.file == path
    assert str(caught.value) == (
        f"sglang-mtp-dequant: {path}: is missing: sglang cannot build any model from this "
        "folder. What to do: pass the checkpoint folder that holds config.json"
    )


@pytest.mark.parametrize("content", ['{"architectures": [', "\xff not json", ""])
def test_unreadable_json_is_refused_naming_the_file(tmp_path, content):
    path = write_config(tmp_path, content)
    with pytest.raises(CheckpointFormatError) as caught:
        CheckpointConfig.read(str(tmp_path))
    assert caught.value.file == path
    assert caught.value.problem.startswith("is not readable as a model config (")
    assert caught.value.hint == "restore the config.json the checkpoint shipped with"


def test_undecodable_bytes_are_refused_naming_the_file(tmp_path):
    path = os.path.join(str(tmp_path), "config.json")
    with open(path, "wb") as handle:
        handle.write(b'{"a": "\xff"}')
    with pytest.raises(CheckpointFormatError) as caught:
        CheckpointConfig.read(str(tmp_path))
    assert caught.value.file == path and "utf-8" in caught.value.problem


@pytest.mark.parametrize("content, kind", [([1, 2], "list"), ("3", "int"), ('"x"', "str")])
def test_json_that_is_no_object_is_refused_by_its_type(tmp_path, content, kind):
    path = write_config(tmp_path, content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(CheckpointFormatError) as caught:
        CheckpointConfig.read(str(tmp_path))
    assert caught.value.file == path
    assert caught.value.problem == f"holds a JSON {kind}, not an object"


def test_load_json_names_what_the_file_should_be_and_what_to_do(tmp_path):
    path = os.path.join(str(tmp_path), "index.json")
    with pytest.raises(CheckpointFormatError) as caught:
        load_json(path, "a safetensors index", "export again")
    assert caught.value.file == path
    assert caught.value.problem.startswith("is not readable as a safetensors index ([Errno 2]")
    assert str(caught.value).endswith(". What to do: export again")


def test_read_json_reads_what_orjson_refuses(tmp_path):
    def parse_json(raw: bytes) -> object:
        path = tmp_path / "file.json"
        path.write_bytes(raw)
        return read_json(str(path))

    assert parse_json(b'{"x": Infinity, "y": [1]}') == {"x": float("inf"), "y": [1]}
    with pytest.raises(json.JSONDecodeError):
        parse_json(b"{")


@pytest.mark.parametrize(
    "text, problem",
    [
        ('["W8A8_DYNAMIC"]', "holds a JSON list, not an object of tensor types"),
        ('{"mtp.norm.weight": "FLOAT",', "is not readable as a ModelSlim quant_model_description"),
    ],
    ids=["a-json-list", "broken-json"],
)
def test_a_description_that_is_no_json_object_is_refused_naming_it(tmp_path, text, problem):
    """A list, or JSON that does not parse: the error names the file and what is wrong."""
    w8a8_checkpoint(str(tmp_path))
    path = os.path.join(str(tmp_path), "quant_model_description.json")
    with open(path, "w") as handle:
        handle.write(text)
    with pytest.raises(CheckpointFormatError) as caught:
        open_folder(str(tmp_path))
    assert caught.value.file == path
    assert caught.value.problem.startswith(problem)
