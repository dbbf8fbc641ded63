"""The draft streams only the files that hold its tensors, and never less than its class needs.

Every load here is sglang 0.5.23's own ``DefaultModelLoader.load_model`` of the draft's
``ModelConfig`` (``support.cpu_sglang.load_model``: sglang's file resolution, weight stream, the
real draft class and its ``load_weights``, hooked by ``load_plugins()``), from msmodelslim's own
fixtures rewritten as sharded V1 exports (``support/sharded.py``): the draft's names spread
over several shards (the embedding in the first, the MTP layer split across two, a weight and
its scale in different shards), shards of target tensors the draft never reads, every name in
``quant_model_weights.safetensors.index.json``.

What must hold:
- the plugin's load streams exactly the shards holding a name the class keeps (and the
  embedding the Qwen3.5 class loads besides its ``mtp.*`` names), in sglang's order, and its
  parameters equal, bit for bit, the plugin's load of the unsharded fixture (itself checked
  against the independent fp32 formula here and in ``test_real_layouts.py``);
- a draft built quantized (``--speculative-draft-model-quantization modelslim``) is narrowed
  too, and loads exactly what stock sglang loads;
- an index that is wrong about a draft tensor (the tensor in a shard the index gives only
  target names) is refused loudly, never served with a parameter missing;
- the doctor counts what each load walks, and finds the wrong index before the server does.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.guard import MisloadedDraftError
from sglang_mtp_dequant.serving.narrowing import NARROW_ENV
from support.paths import fixture_dir
from support.reference import DENSE_PROJECTIONS, dequantize_fp32, description, load_all
from support.sharded import write_sharded

DENSE = "q35_dense_w8a8_dynamic"
DSV3 = "deepseek_v3_w8a8_dynamic_mix_mtp"
#: never loaded from the checkpoint by the draft (sglang's EAGLE worker shares them after)
NOT_LOADED = {
    DENSE: {"lm_head.weight"},
    DSV3: {"lm_head.weight", "model.embed_tokens.weight"},
    "glm4_moe": {"lm_head.weight", "model.embed_tokens.weight"},
}


#: the MTP names written to shard 4 (the rest of the MTP layer is in shard 3)
QWEN35_LATE = {
    "mtp.layers.0.mlp.down_proj.weight_scale",
    "mtp.layers.0.mlp.down_proj.weight_offset",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.norm.weight",
}


def qwen35_shard(name: str) -> int:
    """The embedding and target layer 0 first; target layers 1-3 alone in shard 2; the MTP
    layer over shards 3 and 4, ``down_proj.weight`` in 3 and its scale and offset in 4."""
    if name.startswith("mtp."):
        return 4 if name in QWEN35_LATE else 3
    if name == "model.language_model.embed_tokens.weight" or ".layers.0." in name:
        return 1
    return 2 if name.startswith("model.language_model.layers.") else 4


def deepseek_shard(name: str) -> int:
    """Target layer 0 and the embedding first, layer 1 in shard 2; the NextN layer 2 over
    shards 3 and 4 (``q_a_proj`` and ``kv_a_proj_with_mqa``, which sglang fuses, apart)."""
    if name == "model.embed_tokens.weight" or name.startswith("model.layers.0."):
        return 1
    if name.startswith("model.layers.1."):
        return 2
    if name.startswith("model.layers.2.") and (
        ".q_a_proj" in name or ".experts.0." in name or name.endswith("experts.1.up_proj.weight")
    ):
        return 3
    return 4


LAYOUTS = {
    # fixture: (shard rule, filler prefix, shards the draft needs)
    DENSE: (qwen35_shard, "model.language_model.layers.1.mlp.experts", (1, 3, 4)),
    DSV3: (deepseek_shard, "model.layers.1.mlp.experts", (3, 4)),
}


@pytest.fixture(autouse=True)
def narrowing_on(monkeypatch):
    monkeypatch.delenv(NARROW_ENV, raising=False)


@pytest.fixture
def load(sglang_cpu, caplog):
    """sglang's ``DefaultModelLoader.load_model`` of the draft; ``plugin=False`` is stock sglang
    (the hook bypassed). Returns the parameters sglang's load wrote."""
    import logging

    from sglang_mtp_dequant.serving.plugin import bypassed
    from sglang_mtp_dequant.tools.cpu_env import npu_quantization_rule
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, publish_context
    from support.cpu_sglang import load_model

    caplog.set_level(logging.INFO)

    def run(
        folder: str, name: str, *, plugin: bool = True, npu=False, download_dir=None, **server_args
    ):
        publish_context(folder, download_dir=download_dir, **server_args)
        config = draft_model_config(folder)
        platform = npu_quantization_rule() if npu else contextlib.nullcontext()
        with platform, contextlib.nullcontext() if plugin else bypassed():
            model = load_model(config, download_dir=download_dir)
        return {
            n: p.detach().clone() for n, p in model.named_parameters() if n not in NOT_LOADED[name]
        }

    return run


def sharded(tmp_path, name: str, **kwargs) -> tuple[str, list[str]]:
    rule, prefix, _ = LAYOUTS[name]
    folder = str(tmp_path / f"{name}-sharded")
    files = write_sharded(
        fixture_dir(name), folder, rule, filler={2: 900}, filler_prefix=prefix, **kwargs
    )
    return folder, files


def streamed_files(stock_of: str | None = None) -> tuple[str, ...]:
    """The files the newest plugin load streamed, as sglang's loader resolved them inside it;
    with ``stock_of``, those stock sglang (the hook bypassed) resolved for that folder."""
    from sglang_mtp_dequant.serving.context import resolution_of
    from sglang_mtp_dequant.serving.load import last_draft_load

    source = resolution_of(stock_of) if stock_of else last_draft_load().resolutions[-1]
    return source.files


def plugin_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]


def assert_same_bits(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_draft_over_several_shards_streams_its_shards_and_loads_bit_for_bit(
    load, tmp_path, caplog, name
):
    folder, files = sharded(tmp_path, name)
    whole = load(fixture_dir(name), name)
    caplog.clear()
    got = load(folder, name)
    needed = LAYOUTS[name][2]
    assert streamed_files() == tuple(files[i - 1] for i in needed)
    assert_same_bits(got, whole)
    (line,) = [line for line in plugin_lines(caplog) if "dequantized" in line]
    skipped = len(files) - len(needed)
    assert line.endswith(
        f"; streamed {len(needed)} of {len(files)} weight files, skipped {skipped} holding no "
        "draft tensor by quant_model_weights.safetensors.index.json"
    ), line


def test_the_embedding_the_qwen35_class_loads_is_streamed_from_the_first_shard(load, tmp_path):
    """Qwen3.5's draft loads the target's embedding into its own copy (kept by a last-stage
    draft under PP); its shard holds no ``mtp`` name but must be streamed, and the projections
    equal the fp32 formula on the checkpoint's own tensors."""
    folder, files = sharded(tmp_path, DENSE)
    got = load(folder, DENSE)
    tensors, desc = load_all(fixture_dir(DENSE)), description(fixture_dir(DENSE))
    embed = tensors["model.language_model.embed_tokens.weight"]
    assert files[0] in streamed_files()
    assert torch.equal(got["model.embed_tokens.weight"], embed.to(torch.bfloat16))
    for param, parts in DENSE_PROJECTIONS.items():
        want = torch.cat([dequantize_fp32(tensors, p, desc[p]) for p in parts])
        assert torch.equal(got[param], want.to(torch.bfloat16)), param


def test_a_draft_built_quantized_is_narrowed_and_loads_what_stock_loads(
    load, tmp_path, caplog, rmsnorm_restored
):
    """``--speculative-draft-model-quantization modelslim``, built as on NPU (sglang's
    packed-module mapping applied, ``npu_quantization_rule`` of ``tools/cpu_env.py``): sglang's
    own quantized layers, on the narrowed files."""
    folder, files = sharded(tmp_path, DENSE)
    quantized = {"speculative_draft_model_quantization": "modelslim", "npu": True}
    stock = load(folder, DENSE, plugin=False, **quantized)
    assert streamed_files(stock_of=folder) == tuple(files)
    caplog.clear()
    plugin = load(folder, DENSE, **quantized)
    assert streamed_files() == (files[0], files[2], files[3])
    for layer in ("o_proj", "qkv_proj"):  # sglang's own quantized layers, the fused one too
        assert plugin[f"model.layers.0.{layer}.weight"].dtype == torch.int8, layer
    assert_same_bits(plugin, stock)
    lines = plugin_lines(caplog)
    assert lines == [
        f"sglang-mtp-dequant: Qwen3_5ForCausalLMMTP draft from {folder}: streamed 3 of 4 "
        "weight files, skipped 1 holding no draft tensor by "
        "quant_model_weights.safetensors.index.json"
    ], lines


def test_where_sglang_dequantizes_the_draft_itself_its_file_list_is_left_alone(
    load, tmp_path, caplog, monkeypatch
):
    """An sglang that decodes its drafts itself (the patched tree, a later release): the plugin
    steps aside for the class and leaves sglang's resolved file list exactly as it is (no
    narrowing: no guard judges such a load), so the draft loads what stock loads. What is
    stood in: the step-aside decision (``plugin.sglang_dequantizes_drafts`` answers yes, as it
    does over the patched tree, ``test_upstream_series.py``); the code under test is what the
    hook does after it."""
    from sglang_mtp_dequant.serving import context, plugin

    folder, files = sharded(tmp_path, DENSE)
    stock = load(folder, DENSE, plugin=False)
    assert streamed_files(stock_of=folder) == tuple(files)
    monkeypatch.setattr(plugin, "sglang_dequantizes_drafts", lambda *args, **kwargs: True)
    monkeypatch.setattr(context, "_resolved_outside", {})  # forget the stock load's list
    caplog.clear()
    stepped_aside = load(folder, DENSE)
    # resolved outside any plugin load, as sglang resolved it: all 4 files
    source = context.resolution_of(folder)
    assert source is not None and source.files == tuple(files), source
    assert_same_bits(stepped_aside, stock)
    (line,) = plugin_lines(caplog)
    assert "the plugin leaves the Qwen3_5ForCausalLMMTP draft load to it" in line, line


def test_a_float_draft_says_what_it_skipped(load, tmp_path, caplog):
    """Nothing to decode, but files skipped: one INFO line, and the float weights as stock."""
    float_folder = str(tmp_path / "float-sharded")
    write_sharded(fixture_dir("q35_dense_float_mtp"), float_folder, qwen35_shard, filler={2: 90})
    stock = load(float_folder, DENSE, plugin=False)
    caplog.clear()
    plugin = load(float_folder, DENSE)
    assert_same_bits(plugin, stock)
    (line,) = plugin_lines(caplog)
    assert "streamed 3 of 4 weight files, skipped 1" in line


def write_glm_with_out_of_index_mtp(tmp_path) -> tuple[str, str]:
    """GLM-4.5's NextN draft (``support/draft_cases.py``) as the packaging bug sglang's
    ``maybe_add_mtp_safetensors`` works around: the target in indexed shards of
    ``model.safetensors.index.json``, the whole draft layer in ``mtp.safetensors``, which the
    index does not list. Returns (the checkpoint, the same tensors in one plain file)."""
    import json

    from safetensors.torch import save_file

    from support.checkpoints import write_modelslim_checkpoint
    from support.draft_cases import CASES
    from support.sharded import filler_tensors, shard_name

    case = CASES["glm4_moe"]
    ckpt, config = case.checkpoint(), case.config()
    config.architectures = [case.architecture]
    plain = write_modelslim_checkpoint(str(tmp_path / "glm-plain"), ckpt.tensors, ckpt.desc)
    folder = write_modelslim_checkpoint(str(tmp_path / "glm-mtp-file"), {}, ckpt.desc)
    os.remove(os.path.join(folder, "quant_model_weights.safetensors"))
    for where in (plain, folder):
        config.to_json_file(os.path.join(where, "config.json"))
    draft = {n: t for n, t in ckpt.tensors.items() if n.startswith("model.layers.2.")}
    target = {n: t for n, t in ckpt.tensors.items() if n not in draft}
    save_file(draft, os.path.join(folder, "mtp.safetensors"))
    weight_map = {}
    for number, start in ((1, 0), (2, 450)):
        shard = shard_name(number, 2, "model")
        content = dict(filler_tensors(450, "model.layers.1.mlp.experts", start))
        content.update(target if number == 1 else {})
        save_file(content, os.path.join(folder, shard))
        weight_map.update({n: shard for n in content})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return folder, plain


def test_the_out_of_index_mtp_file_sglang_adds_is_all_a_glm_draft_streams(load, tmp_path):
    """sglang drops ``mtp.safetensors`` (not in ``model.safetensors.index.json``) and adds it
    back for a GLM NextN draft; the index lists no draft tensor, so both target shards go and
    the draft streams that one file."""
    folder, plain = write_glm_with_out_of_index_mtp(tmp_path)
    whole = load(plain, "glm4_moe")
    got = load(folder, "glm4_moe")
    assert streamed_files() == (os.path.join(folder, "mtp.safetensors"),)
    assert_same_bits(got, whole)


# -- never less than the class needs -------------------------------------------------------


def test_a_draft_tensor_the_index_places_wrongly_is_refused_not_served(load, tmp_path, monkeypatch):
    """``mtp.fc.weight`` written into the target-only shard 2 while the index keeps it in 3:
    the narrowed load skips shard 2, and the guard refuses the draft, naming the parameter, the
    skipped file and the way out; with the narrowing off the same checkpoint loads right."""
    folder, files = sharded(tmp_path, DENSE, misplaced={"mtp.fc.weight": 2})
    with pytest.raises(MisloadedDraftError) as caught:
        load(folder, DENSE)
    error = caught.value
    assert {f.parameter: f.unwritten for f in error.findings} == {"fc.weight": "no write at all"}
    message = str(error)
    assert "skipped 1 holding no draft tensor by quant_model_weights" in message
    assert os.path.basename(files[1]) in message and f"{NARROW_ENV}=off" in message
    monkeypatch.setenv(NARROW_ENV, "off")
    every_file = load(folder, DENSE)
    assert streamed_files() == tuple(files)
    assert_same_bits(every_file, load(fixture_dir(DENSE), DENSE))


def test_a_scale_the_index_places_wrongly_stops_the_plan(load, tmp_path):
    """A companion in a skipped shard: the plan finds the weight without its scale, before
    sglang's loaders write anything."""
    moved = "mtp.layers.0.mlp.down_proj.weight_scale"
    folder, _ = sharded(tmp_path, DENSE, misplaced={moved: 2})
    with pytest.raises(DraftWeightError, match="mtp.layers.0.mlp.down_proj.weight"):
        load(folder, DENSE)


# -- the doctor ------------------------------------------------------------------------------


def test_doctor_counts_what_each_load_walks(sglang_cpu, tmp_path):
    from sglang_mtp_dequant.tools.doctor import diagnose, render_text

    folder, files = sharded(tmp_path, DENSE)
    report = diagnose(folder)
    counts = {os.path.basename(f): len(load_all_names(f)) for f in files}
    walk = report.to_json()["draft_load_walk"]
    assert walk["stock"] == {"files": 4, "tensors": sum(counts.values())}
    kept = [os.path.basename(files[i]) for i in (0, 2, 3)]
    assert walk["plugin"] == {"files": 3, "tensors": sum(counts[f] for f in kept)}
    assert walk["skipped_files"] == [os.path.basename(files[1])]
    assert walk["draft_tensors_in_skipped_files"] == {}
    assert report.verdict == "ok", report.problems
    line = (
        f"  draft load walks: stock {sum(counts.values()):,} tensors in 4 files; with the plugin "
        f"{sum(counts[f] for f in kept):,} in 3 (1 files skipped: no draft tensor in them by "
        "quant_model_weights.safetensors.index.json)"
    )
    assert line in render_text(report).splitlines()


def test_doctor_finds_a_draft_tensor_the_index_places_wrongly(sglang_cpu, tmp_path):
    from sglang_mtp_dequant.tools.doctor import diagnose

    folder, files = sharded(tmp_path, DENSE, misplaced={"mtp.fc.weight": 2})
    report = diagnose(folder)
    assert report.verdict == "error"
    walk = report.to_json()["draft_load_walk"]
    assert walk["draft_tensors_in_skipped_files"] == {files[1]: "mtp.fc.weight"}
    (problem,) = [p for p in report.problems if "mtp.fc.weight" in p]
    assert problem.startswith(f"{files[1]} holds the draft tensor 'mtp.fc.weight'"), problem


def test_doctor_on_an_unsharded_fixture_walks_the_same_either_way(sglang_cpu):
    from sglang_mtp_dequant.tools.doctor import diagnose

    walk = diagnose(fixture_dir(DENSE)).to_json()["draft_load_walk"]
    assert walk["stock"] == walk["plugin"] and walk["skipped_files"] == []


def load_all_names(path: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        return list(handle.keys())
