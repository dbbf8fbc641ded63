"""Checkpoint layouts users have: V1 shards + index, V1 single file, V0 names, split shards.

Each layout is built from the real msmodelslim fixture by renaming or re-splitting its files
(the tensors are byte-for-byte the tool's), then loaded through sglang's draft class.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference import DENSE_PROJECTIONS, dequantize_fp32, description, load_all

NAME = "q35_dense_w8a8_dynamic"


def assert_dequantized(model, source_folder: str) -> None:
    tensors, desc = load_all(source_folder), description(source_folder)
    params = dict(model.named_parameters())
    for param, parts in DENSE_PROJECTIONS.items():
        want = torch.cat([dequantize_fp32(tensors, n, desc[n]).bfloat16() for n in parts])
        assert torch.equal(params[param].detach(), want), param


def shard_names(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def test_v1_shards_with_index(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    assert "quant_model_weights.safetensors.index.json" in os.listdir(folder)
    assert_dequantized(load_draft(folder), folder)


def test_v1_single_file_without_index(load_draft, copy_checkpoint):
    folder = copy_checkpoint(NAME)
    os.remove(os.path.join(folder, "quant_model_weights.safetensors.index.json"))
    os.rename(
        os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors"),
        os.path.join(folder, "quant_model_weights.safetensors"),
    )
    assert_dequantized(load_draft(folder), folder)


def test_v0_file_names(load_draft, copy_checkpoint):
    """V0 engine: quant_model_weight_<type>-*.safetensors with its own index name."""
    folder = copy_checkpoint(NAME)
    os.rename(
        os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors"),
        os.path.join(folder, "quant_model_weight_w8a8_dynamic-00001-of-00001.safetensors"),
    )
    index_path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"] = {
        k: "quant_model_weight_w8a8_dynamic-00001-of-00001.safetensors" for k in index["weight_map"]
    }
    os.remove(index_path)
    with open(
        os.path.join(folder, "quant_model_weight_w8a8_dynamic.safetensors.index.json"), "w"
    ) as h:
        json.dump(index, h)
    assert_dequantized(load_draft(folder), folder)


def resplit(folder: str, first: callable) -> None:
    """Rewrite the single shard as two: names where ``first(name)`` go to shard 1."""
    path = os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors")
    tensors = load_file(path)
    os.remove(path)
    one = {k: v for k, v in tensors.items() if first(k)}
    two = {k: v for k, v in tensors.items() if not first(k)}
    names = [
        "quant_model_weights-00001-of-00002.safetensors",
        "quant_model_weights-00002-of-00002.safetensors",
    ]
    save_file(one, os.path.join(folder, names[0]), metadata={"format": "pt"})
    save_file(two, os.path.join(folder, names[1]), metadata={"format": "pt"})
    index_path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"] = {k: names[0] if first(k) else names[1] for k in tensors}
    with open(index_path, "w") as handle:
        json.dump(index, handle)


@pytest.mark.parametrize("scales_first", [True, False], ids=["scales-first", "weights-first"])
def test_weight_and_scale_in_different_shards(load_draft, copy_checkpoint, scales_first):
    folder = copy_checkpoint(NAME)
    is_companion = lambda name: name.endswith(("weight_scale", "weight_offset"))  # noqa: E731
    resplit(folder, is_companion if scales_first else (lambda n: not is_companion(n)))
    files = [os.path.join(folder, f) for f in shard_names(folder)]
    assert len(files) == 2
    order = [load_file(f) for f in files]
    assert ("mtp.layers.0.mlp.up_proj.weight_scale" in order[0]) == scales_first
    assert_dequantized(load_draft(folder), folder)


def test_found_as_draft_path(load_draft, copy_checkpoint):
    """--speculative-draft-model-path points at the quantized folder; the target elsewhere."""
    folder = copy_checkpoint(NAME)
    target = copy_checkpoint("q35_dense_float_mtp", dest="target")
    assert_dequantized(load_draft(folder, target_path=target, draft_path=folder), folder)


def test_found_as_target_path(load_draft, copy_checkpoint):
    """No draft path: sglang loads the draft from the target checkpoint (the usual MTP case)."""
    folder = copy_checkpoint(NAME)
    assert_dequantized(load_draft(folder, target_path=folder, draft_path=None), folder)


def test_plan_reads_headers_and_companions_only(monkeypatch):
    """No weight bytes are read twice: planning reads companion tensors, never a weight."""
    from sglang_mtp_dequant.checkpoint import Checkpoint
    from sglang_mtp_dequant.plan import DequantPlan

    read_names: list[str] = []
    real_read = Checkpoint.read

    def recording_read(self, info):
        read_names.append(info.name)
        return real_read(self, info)

    monkeypatch.setattr(Checkpoint, "read", recording_read)
    from conftest import fixture_dir

    for name in ("q35_dense_w8a8_dynamic", "q35_dense_w8a8_static"):
        plan = DequantPlan.build(Checkpoint.open(fixture_dir(name), wanted=lambda n: "mtp" in n))
        assert len(plan.to_dequantize) == 7
    assert read_names and not [n for n in read_names if n.endswith(".weight")]
    assert all(
        n.endswith(("weight_scale", "weight_offset", "deq_scale", "input_scale"))
        for n in read_names
    )


def test_hub_id_resolves_to_its_local_snapshot(tmp_path, monkeypatch):
    """sglang downloads a hub model before loading it; the plugin finds that snapshot offline."""
    import shutil

    import huggingface_hub.constants

    from conftest import fixture_dir
    from sglang_mtp_dequant.plugin import _hub_snapshot

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--acme--tiny-q35-w8a8"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(fixture_dir(NAME), repo / "snapshots" / revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert _hub_snapshot("acme/tiny-q35-w8a8") == str(repo / "snapshots" / revision)
    assert _hub_snapshot("acme/not-downloaded") is None  # local_files_only: no network
