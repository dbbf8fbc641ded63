"""Checkpoint layouts users have: V1 shards + index, V1 single file, V0 names, split shards.

Each layout is built from the real msmodelslim fixture by renaming or re-splitting its files
(the tensors are byte-for-byte the tool's), then loaded through sglang's draft class.
Where users keep them (a Hugging Face or ModelScope cache, by hub id, --download-dir,
--revision): ``test_real_paths.py``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from support.reference import DENSE_PROJECTIONS, dequantize_fp32, description, load_all

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


@pytest.mark.parametrize(
    "name, read",
    [
        ("q35_dense_w8a8_dynamic", ("weight_scale", "weight_offset")),
        ("q35_dense_w8a8_static", ("deq_scale", "input_scale")),
    ],
)
def test_plan_reads_headers_and_companions_only(
    sglang_cpu, copy_checkpoint, monkeypatch, name, read
):
    """No weight bytes are read twice: opening reads each file's header once, planning reads
    the companions its formulas use (never a weight), each file opened once however many
    companions it holds (here spread over two shards: weight_scale / deq_scale in one, the
    other companions with the weights in the other)."""
    import sglang_mtp_dequant.formats.checkpoint as checkpoint
    from sglang_mtp_dequant.formats.plan import DequantPlan
    from support.checkpoints import open_checkpoint

    folder = copy_checkpoint(name)
    resplit(folder, lambda n: n.endswith(("weight_scale", "deq_scale")))
    opened: list[str] = []
    read_names: list[str] = []
    real_open, real_read_many = checkpoint.safe_open, checkpoint.Checkpoint.read_many

    def counting_open(path, *args, **kwargs):
        opened.append(path)
        return real_open(path, *args, **kwargs)

    def recording_read_many(self, infos):
        infos = list(infos)
        read_names.extend(info.name for info in infos)
        return real_read_many(self, infos)

    monkeypatch.setattr(checkpoint, "safe_open", counting_open)
    monkeypatch.setattr(checkpoint.Checkpoint, "read_many", recording_read_many)
    ckpt = open_checkpoint(folder)
    shards = [os.path.join(folder, f) for f in shard_names(folder)]
    assert sorted(opened) == sorted(ckpt.files) == shards  # headers: each file once
    opened.clear()
    plan = DequantPlan.build(ckpt)
    assert len(plan.to_dequantize) == 7
    assert sorted(opened) == shards  # companions: each file once, though 14 are read from two
    bases = [w[: -len("weight")] for w in plan.to_dequantize]
    assert sorted(read_names) == sorted(b + suffix for b in bases for suffix in read)
