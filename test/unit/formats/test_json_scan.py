"""The draft's entries read out of an index's or description's bytes (formats/json_scan.py):
the same as parsing the whole file, or no answer at all."""

from __future__ import annotations

import glob
import json
import os
import random

import pytest

from sglang_mtp_dequant.formats.json_scan import NotScannable, ScannedObject, scan_object
from sglang_mtp_dequant.formats.naming import (
    NameMatch,
    mtp_prefix,
    needles_of,
    nextn_layer,
    nextn_layer_multimodal,
)
from support.paths import FIXTURES

JSON_FILES = sorted(
    glob.glob(os.path.join(FIXTURES, "**", "quant_model_description*.json"), recursive=True)
    + glob.glob(os.path.join(FIXTURES, "**", "*.safetensors.index.json"), recursive=True)
)


def test_the_fixtures_json_files_are_found():
    """The comparison below runs over every committed index and description, never none."""
    assert len(JSON_FILES) >= 10, JSON_FILES


NEEDLES = (("mtp",), ("model.layers.1.",), ("model.layers.2.", "lm_head.weight"), ("embed",))


def _scanned(data: bytes) -> ScannedObject:
    found = scan_object(data)
    assert found is not None
    return found


def _flat_strings(obj: dict, needles) -> dict[str, str]:
    return {k: v for k, v in obj.items() if isinstance(v, str) and any(n in k for n in needles)}


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_every_fixture_file_scans_as_it_parses(path):
    with open(path, "rb") as handle:
        data = handle.read()
    parsed = json.loads(data)
    found = _scanned(data)
    obj = found.member("weight_map") if "weight_map" in parsed else found
    whole = parsed["weight_map"] if "weight_map" in parsed else parsed
    for needles in NEEDLES:
        assert obj.entries(needles) == _flat_strings(whole, needles)
    if "weight_map" not in parsed:
        assert found.scalar("group_size") == parsed.get("group_size")
        assert found.scalar("version") == parsed.get("version")
    else:
        shards = sorted(set(whole.values()))
        assert obj.values_held([*shards, "absent.safetensors"]) == set(shards)


def _random_index(rng: random.Random, compact: bool) -> dict:
    shards = [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)]
    names = [f"model.layers.{i}.mlp.experts.{e}.up_proj.weight" for i in range(4) for e in range(9)]
    names += [f"mtp.layers.0.{p}.weight" for p in ("q_proj", "k_proj", "fc")] + ["lm_head.weight"]
    rng.shuffle(names)
    used = shards[: rng.randint(1, len(shards))]
    weight_map = {n: rng.choice(used) for n in names}
    weight_map["mtp.safetensors.tag"] = "mtp.safetensors"  # a needle in a value
    index = {"metadata": {"total_size": 12, "note": "mtp"}, "weight_map": weight_map}
    if rng.random() < 0.5:
        index = {"weight_map": weight_map, "metadata": index["metadata"]}
    return index


@pytest.mark.parametrize("seed", range(20))
def test_random_indexes_scan_as_they_parse(seed):
    rng = random.Random(seed)
    index = _random_index(rng, compact=seed % 2 == 0)
    separators = (",", ":") if seed % 2 == 0 else (", ", ": ")
    data = json.dumps(index, indent=None if seed % 2 == 0 else 2, separators=separators).encode()
    found = _scanned(data).member("weight_map")
    for needles in NEEDLES:
        assert found.entries(needles) == _flat_strings(index["weight_map"], needles)
    shards = [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)]
    rng.shuffle(shards)
    assert found.values_held(shards) == set(index["weight_map"].values()) & set(shards)


def test_a_needle_in_a_nested_object_or_a_value_is_no_entry():
    data = json.dumps(
        {"optional": {"mtp.x": "FLOAT"}, "a": "mtp.y", "mtp.z": "W8A8", "group_size": 0}
    ).encode()
    assert _scanned(data).entries(("mtp",)) == {"mtp.z": "W8A8"}


def test_a_wanted_name_with_no_string_value_is_not_answered():
    data = json.dumps({"mtp.fc.weight": 5, "x": "FLOAT"}).encode()
    with pytest.raises(NotScannable):
        _scanned(data).entries(("mtp",))


@pytest.mark.parametrize(
    "text",
    [
        '{"mtp.a\\u0062": "FLOAT"}',  # an escape: quotes no longer delimit every string
        '{"mtp.{a": "FLOAT"}',  # a brace inside a string
        '{"a": [{"b": "c"}]}',  # an object that is no key's value
        '{"a": "FLOAT"',  # no closing brace
        '{"a": "FLOAT"} {"b": "c"}',  # two texts
        "[1, 2]",
        "{" + ", ".join(f'"k{i}": {{}}' for i in range(70)) + "}",  # more than MAX_OBJECTS
    ],
)
def test_shapes_it_does_not_answer_for(text):
    assert scan_object(text.encode()) is None


def test_a_scalar_that_is_a_container_is_not_answered():
    with pytest.raises(NotScannable):
        _scanned(b'{"group_size": [32]}').scalar("group_size")
    assert _scanned(b'{"x": "group_size", "group_size": 32}').scalar("group_size") == 32
    assert _scanned(b'{"x": "y"}').scalar("group_size") is None


# -- the rules' needles: every name a rule accepts holds one (what the scan relies on)


def _rules():
    config = {"num_hidden_layers": 3}
    single = {"num_hidden_layers": 1}
    return [
        mtp_prefix(),
        nextn_layer(config),
        nextn_layer(single),
        nextn_layer_multimodal(config),
        nextn_layer({}),
        mtp_prefix().or_names(["model.embed_tokens.weight", "lm_head.weight"]),
    ]


def _names(rng: random.Random) -> list[str]:
    parts = ["model", "mtp", "layers", "0", "1", "3", "language_model", "embed_tokens", "lm_head"]
    parts += ["weight", "mlp", "experts", "shared_head", "eh_proj", "xmtpx", "model.layers.3"]
    return [".".join(rng.choice(parts) for _ in range(rng.randint(1, 6))) for _ in range(4000)]


def test_every_name_a_rule_accepts_holds_one_of_its_needles():
    names = _names(random.Random(0))
    for path in JSON_FILES:
        with open(path) as handle:
            raw = json.load(handle)
        names += list(raw.get("weight_map", raw))
    for rule in _rules():
        assert isinstance(rule, NameMatch)
        needles = needles_of(rule)
        assert needles is not None
        accepted = [n for n in names if rule(n)]
        assert all(any(needle in n for needle in needles) for n in accepted), rule
    assert needles_of(lambda name: True) is None
    assert any(_rules()[0](n) for n in names)  # the names do exercise the rules
