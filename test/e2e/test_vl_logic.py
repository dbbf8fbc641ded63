"""``e2e/vl.py``'s own logic, without a server: the launch, the float VL folder, the pass rules."""

from __future__ import annotations

import json
import os

import pytest
from e2e.client import Generation
from safetensors.torch import load_file

from e2e import vl
from support.paths import E2E, REFERENCE


def test_the_vl_servers_launch_f1_with_their_tokenizer():
    """One folder, no quantization flag (F1), EAGLE, and sglang's tokenizer (its multimodal
    processor needs it): the other CPU flags as every e2e server."""
    run = vl.VLRun("plugin", "/m/vl", True, True, draft_quantization=None)
    command = run.command(30000)
    assert "--skip-tokenizer-init" not in command
    assert (
        "--quantization" not in command and "--speculative-draft-model-quantization" not in command
    )
    assert command[command.index("--speculative-algorithm") + 1] == "EAGLE"
    assert command[command.index("--dtype") + 1] == "float32"


@pytest.mark.parametrize("family", sorted(vl.FAMILIES))
def test_the_float_folder_is_the_text_model_and_the_float_tower(family, tmp_path):
    """The float VL folder holds the float text model (release names), its MTP head, the
    committed float vision tower, and the export's config, tokenizer and processor."""
    folder = vl.float_folder(family, str(tmp_path))
    export, text = (os.path.join(E2E, n) for n in vl.FAMILIES[family])
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    floats = load_file(os.path.join(text, "model.safetensors"))
    tower = load_file(os.path.join(REFERENCE, f"vl_{family}_visual.safetensors"))
    assert set(tensors) == {
        n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n
        for n in floats
    } | set(tower)
    assert all(tensors[n].equal(t) for n, t in tower.items())
    assert tensors["mtp.fc.weight"].equal(floats["mtp.fc.weight"])
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        with open(os.path.join(folder, name)) as a, open(os.path.join(export, name)) as b:
            assert a.read() == b.read()
    with open(os.path.join(folder, "config.json")) as handle:
        assert json.load(handle)["vision_config"]["deepstack_visual_indexes"] == []


def served(label: str, accept: float, images: dict[str, list[int]], error: str = ""):
    text = [Generation([1], {"completion_tokens": accept * 10, "spec_verify_ct": 10})]
    return vl.Served(label, [] if error else text, images, error, "/nonexistent.log")


@pytest.fixture
def runs():
    tower = {"a.png": [10, 11], "b.png": [12, 13]}
    return {
        "plugin": served("plugin", 2.0, dict(tower)),
        "float_tower": served("float_tower", 2.0, tower),
        "float": served("float", 2.0, {"a.png": [10, 11], "b.png": [12, 14]}),
        "stock": served("stock", 1.1, {"a.png": [20, 21], "b.png": [12, 13]}),
    }


def test_the_pass_rules(runs, monkeypatch):
    monkeypatch.setattr(vl, "plugin_messages", lambda path: f"from {E2E}/vl_hybrid:")
    assert vl.check("hybrid", runs) == []
    runs["plugin"].images["b.png"] = [12, 99]
    runs["plugin"].text[0].meta["completion_tokens"] = 15
    failures = vl.check("hybrid", runs)
    assert any(f.startswith("b.png: the plugin answers") for f in failures)
    assert any(f.startswith("plugin's accept length 1.5 < 0.97") for f in failures)


def test_stock_that_answers_as_float_or_float_that_ignores_the_image_fails(runs, monkeypatch):
    monkeypatch.setattr(vl, "plugin_messages", lambda path: f"from {E2E}/vl_hybrid:")
    runs["stock"].images = dict(runs["float_tower"].images)
    assert vl.check("hybrid", runs) == [
        "stock answers every image as the float tower: the export shows no bug"
    ]
    runs["stock"] = served("stock", 0, {}, error="ValueError: Unsupported ModelSlim MoE schemes")
    assert vl.check("hybrid", runs) == []  # stock that does not start is shown, not failed
    runs["float"].images = {"a.png": [1], "b.png": [1]}
    assert vl.check("hybrid", runs) == [
        "the float folder gives every image the same answer: no image decides"
    ]


@pytest.mark.parametrize("family", sorted(vl.FAMILIES))
def test_the_float_tower_folder_is_the_export_with_the_towers_float_weights(family, tmp_path):
    """Every tensor of the export but the tower's quantized layers, which are their float
    originals described FLOAT, companions gone."""
    folder = vl.float_tower_folder(family, str(tmp_path))
    export = os.path.join(E2E, vl.FAMILIES[family][0])
    shard = "quant_model_weights-00001-of-00001.safetensors"
    got, was = (load_file(os.path.join(f, shard)) for f in (folder, export))
    tower = load_file(os.path.join(REFERENCE, f"vl_{family}_visual.safetensors"))
    with open(os.path.join(folder, "quant_model_description.json")) as handle:
        described = json.load(handle)
    changed = {n for n in was if n not in got or not got[n].equal(was[n])}
    assert changed == {
        f"model.visual.blocks.0.{layer}.{part}"
        for layer in ("attn.qkv", "attn.proj", "mlp.linear_fc1")
        for part in ("weight", "weight_scale", "weight_offset")
    }
    for name in (n for n in changed if n.endswith(".weight")):
        assert got[name].equal(tower[name]) and described[name] == "FLOAT"
