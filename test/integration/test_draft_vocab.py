"""The draft's vocab-sized layers never allocated where sglang binds the target's (issue #50).

Real: each hooked sglang draft class built on the CPU through sglang's own code (its
constructor, reached through the ``__init__`` hook ``load_plugins()`` installed; Qwen3.5 and
GLM-5 through sglang's draft ``ModelConfig`` and ``DefaultModelLoader``), loaded from its
checkpoint through sglang's weight stream, and then given the target's embedding and head by
sglang's own ``EagleDraftWorker.init_lm_head`` (what its scheduler runs after sizing the KV
pool). Stood in: the worker object around that method (only the attributes it reads) and, for
the classes whose target is not built here, the target's side of the sharing
(``get_embed_and_head`` and ``lm_head``, as every sglang target answers them).

"Stock" below is the same build with ``SGLANG_MTP_DEQUANT_SHARE_VOCAB=off`` (the plugin's
decoding alone: stock sglang cannot load most of these ModelSlim checkpoints at all), and,
for the BF16 Qwen3.5 checkpoint, stock sglang itself (``plugin.bypassed``).
"""

from __future__ import annotations

import importlib
import logging
import os

import pytest
import torch

from support.draft_cases import CASES
from support.paths import E2E, fixture_dir
from support.vocab_sharing import TargetSide, share_as_sglang

#: one case per hooked draft class built from a hand-made config (Qwen3.5 and GLM-5 below)
CLASS_CASES = ("qwen3_next", "qwen4_exp", "qwen3_moe", "glm4_moe", "glm4_moe_lite", "deepseek_v3",
               "glm5_next")  # fmt: skip
TARGET = fixture_dir("q35_dense_w8a8_dynamic")
EAGLE = {"speculative_algorithm": "EAGLE"}
#: the hand-made MoE checkpoints hold no fused shared-expert slot (an EAGLE launch of sglang
#: 0.5.14 fuses the GLM NextN draft's shared expert into its routed experts)
UNFUSED = {"disable_shared_experts_fusion": True}
SWITCH = "SGLANG_MTP_DEQUANT_SHARE_VOCAB"
TAKEN = ("embed_tokens", "lm_head")
GLM5_CLASS = "GlmMoeDsaForCausalLMNextN"


@pytest.fixture
def context_restored(sglang_cpu):
    """Leave sglang's published context as the session set it (no EAGLE launch)."""
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context

    yield
    publish_context(TARGET)


def _vocab(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if set(n.split(".")) & set(TAKEN)}


def _vocab_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "never allocated" in r.getMessage()]


def _case_folder(draft_case, key: str):
    """The case's checkpoint written; its folder, its config and its tensors (a class this
    sglang release does not have is skipped, saying so: the release matrix runs these)."""
    from sglang_mtp_dequant.serving.releases import module_absent

    case = CASES[key]
    if module_absent(case.class_path.rsplit(".", 1)[0]):
        pytest.skip(f"this sglang has no {case.class_path}")
    ckpt, load = draft_case(case, dest=key)
    config = case.config()
    config.architectures = [case.architecture]
    return load.folder, config, ckpt.tensors


def _build(key: str, folder: str, config, monkeypatch, share: bool = True, **server_args):
    """The case's class built for an EAGLE launch (the switch ``share``) and loaded."""
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from support.cpu_sglang import build_draft_class, path_weights

    monkeypatch.setenv(SWITCH, "on" if share else "off")
    launch = {**EAGLE, **UNFUSED, "speculative_draft_model_path": folder, **server_args}
    publish_context(TARGET, **launch)
    model = build_draft_class(CASES[key].class_path, config)
    type(model).load_weights(model, path_weights(folder))
    return model


def _target_for(draft: torch.nn.Module) -> TargetSide:
    generator = torch.Generator().manual_seed(0)
    embed, head = draft.get_embed_and_head()
    return TargetSide(
        *(torch.randn(t.shape, generator=generator).to(t.dtype) for t in (embed, head))
    )


def _assert_same_draft(plugin: torch.nn.Module, stock: torch.nn.Module) -> None:
    """Every parameter of the two drafts the same tensor (shared with the target) or equal."""
    mine, theirs = dict(plugin.named_parameters()), dict(stock.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, param in mine.items():
        assert param.device.type != "meta", name
        assert param is theirs[name] or torch.equal(param, theirs[name]), name


def _check_held_back_then_shared(build, caplog) -> None:
    """``build(share)`` a draft for an EAGLE launch with the switch off and on: on, its
    embed_tokens / lm_head have no storage (what the KV pool is sized with), counted exactly as
    tools/draft_memory.vocab_copy_bytes counts them and said in one INFO line, every other
    parameter as with the switch off; after sglang's own sharing both drafts hold the target's
    tensors and are the same."""
    from sglang_mtp_dequant.tools.draft_memory import vocab_copy_bytes

    caplog.set_level(logging.INFO)
    from sglang_mtp_dequant.serving import releases

    try:
        stock = build(False)
    except Exception as exc:  # noqa: BLE001 - sglang itself cannot build it here: said below
        if releases.installed_version() == releases.NEWEST_TESTED:
            raise  # make test's sglang builds every class on the CPU: never skipped there
        pytest.skip(f"this sglang cannot build the class on a CPU: {type(exc).__name__}: {exc}")
    caplog.clear()
    plugin = build(True)
    vocab = _vocab(plugin)
    assert vocab and all(p.device.type == "meta" for p in vocab.values()), vocab.keys()
    from sglang_mtp_dequant.serving.draft_vocab import held_back  # (main has no such module)

    assert held_back(plugin) == vocab_copy_bytes(plugin) > 0
    (line,) = _vocab_lines(caplog)
    assert f"{held_back(plugin):,} bytes on this rank never allocated" in line, line
    assert held_back(stock) == 0
    assert all(p.device.type == "cpu" for p in stock.parameters())
    others = {n: p for n, p in plugin.named_parameters() if n not in vocab}
    assert all(torch.equal(p, stock.get_parameter(n)) for n, p in others.items())
    target = _target_for(stock)
    for draft in (plugin, stock):
        share_as_sglang(draft, target, TARGET)
        embed, head = draft.get_embed_and_head()
        assert embed is target.embed and head is target.lm_head.weight
    assert held_back(plugin) == 0
    _assert_same_draft(plugin, stock)


@pytest.mark.parametrize("key", CLASS_CASES)
def test_every_draft_class_holds_no_vocab_copy_until_sglang_binds_the_targets(
    draft_case, key, monkeypatch, caplog, context_restored
):
    """Each class built from its own tiny config and loaded from a ModelSlim checkpoint in its
    naming (``_check_held_back_then_shared``)."""
    folder, config, _ = _case_folder(draft_case, key)
    _check_held_back_then_shared(
        lambda share: _build(key, folder, config, monkeypatch, share), caplog
    )


def test_qwen35_draft_of_a_modelslim_export(monkeypatch, caplog, context_restored):
    """Qwen3.5's draft built from msmodelslim's W8A8_DYNAMIC export through sglang's draft
    ``ModelConfig`` and loaded through its stream (``_check_held_back_then_shared``)."""
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
        sglang_weights,
    )

    def build(share: bool) -> torch.nn.Module:
        monkeypatch.setenv(SWITCH, "on" if share else "off")
        publish_context(TARGET, **EAGLE)
        config = draft_model_config(TARGET)
        model = build_draft(config)
        type(model).load_weights(model, sglang_weights(config, model))
        return model

    _check_held_back_then_shared(build, caplog)


def _qwen35_draft(folder: str, **server_args) -> tuple[torch.nn.Module, object]:
    """Qwen3.5's draft and target from ``folder`` through sglang's draft and target
    ``ModelConfig`` and its whole ``DefaultModelLoader.load_model``."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.registry import ModelRegistry

    from sglang_mtp_dequant.serving import sglang_private
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, publish_context
    from support.cpu_sglang import load_model

    if "Qwen3_5ForCausalLM" not in ModelRegistry.get_supported_archs():
        pytest.skip("this sglang has no Qwen3_5ForCausalLM target")
    publish_context(folder, **server_args)
    target_config = ModelConfig.from_server_args(
        sglang_private.published_server_args(), model_path=folder
    )
    return load_model(draft_model_config(folder)), load_model(target_config)


def test_qwen35_draft_shares_the_real_targets_as_stock_does(monkeypatch, caplog, context_restored):
    """Qwen3.5 (the BF16 e2e checkpoint, whose load writes the checkpoint's embedding into the
    draft's copy): no storage behind embed_tokens / lm_head when sglang's loader returns;
    after sglang's sharing with the real target the draft is stock sglang's, tensor by tensor.
    Fails on main (the copies are allocated and written)."""
    from sglang_mtp_dequant.serving.plugin import bypassed

    caplog.set_level(logging.INFO)
    folder = os.path.join(E2E, "float")
    plugin, target = _qwen35_draft(folder, **EAGLE)
    assert type(plugin).__name__ == "Qwen3_5ForCausalLMMTP"
    assert {n for n, p in plugin.named_parameters() if p.device.type == "meta"} == {
        "model.embed_tokens.weight",
        "lm_head.weight",
    }
    from sglang_mtp_dequant.serving.draft_vocab import held_back  # (main has no such module)

    assert held_back(plugin) == 2 * 256 * 192 * 2  # vocab x hidden x bf16, twice
    assert len(_vocab_lines(caplog)) == 1
    with bypassed():
        stock, _ = _qwen35_draft(folder, **EAGLE)
    assert not any(p.device.type == "meta" for p in stock.parameters())
    for draft in (plugin, stock):
        share_as_sglang(draft, target, TARGET)
    assert plugin.model.embed_tokens.weight is target.model.embed_tokens.weight
    assert plugin.lm_head is target.lm_head  # set_lm_head_from_target: the target's module
    _assert_same_draft(plugin, stock)


def test_glm5_class_inheriting_deepseeks_constructor(caplog, context_restored):
    """GLM-5's GlmMoeDsaForCausalLMNextN inherits DeepSeek's hooked __init__: built through
    sglang's ModelConfig for an EAGLE launch, its copies are held back like DeepSeek's."""
    from sglang_mtp_dequant.serving.draft_vocab import held_back
    from sglang_mtp_dequant.tools.cpu_env import cuda_capability_answered
    from sglang_mtp_dequant.tools.cpu_sglang import build_draft, draft_model_config, publish_context
    from sglang_mtp_dequant.tools.draft_memory import vocab_copy_bytes

    caplog.set_level(logging.INFO)
    folder = fixture_dir("glm5_w8a8_mtp")
    try:
        has_glm5 = hasattr(importlib.import_module("sglang.srt.models.glm4_moe"), GLM5_CLASS)
    except ImportError as exc:  # sglang 0.5.15's module needs cutlass
        pytest.skip(f"sglang's glm4_moe does not import here: {exc}")
    if not has_glm5:
        pytest.skip(f"this sglang has no {GLM5_CLASS}")
    with cuda_capability_answered():  # ServerArgs of a DSA model asks for it (sglang 0.5.17)
        publish_context(folder, **EAGLE)
    model = build_draft(draft_model_config(folder))
    assert type(model).__name__ == GLM5_CLASS
    assert held_back(model) == vocab_copy_bytes(model) > 0
    assert f"{GLM5_CLASS} draft takes" in _vocab_lines(caplog)[0]


def test_a_last_pipeline_stage_draft_keeps_its_embedding_as_sglang_does(tmp_path):
    """Under pipeline parallelism the draft runs on the last stage, where the target's embedding
    is not, and keeps its own (sglang loads the checkpoint's into it): two real PP ranks on gloo,
    the last one building and loading Qwen3.5's draft as sglang's EAGLE worker does: with the
    plugin on, the same as with its switch off, every parameter allocated, nothing said."""
    import json
    import multiprocessing

    from sglang_mtp_dequant.tools.cpu_sglang import free_port
    from support.vocab_sharing import pp_last_stage

    spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    if not hasattr(spec_utils, "draft_pp_context"):
        pytest.skip("this sglang builds no last-stage draft under pipeline parallelism")
    folder, port = os.path.join(E2E, "float"), free_port()
    out = [str(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=pp_last_stage, args=(r, port, folder, out[r])) for r in (0, 1)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(600)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    with open(out[1]) as handle:
        found = json.load(handle)
    assert found["on"] == found["off"] and found["on"]["meta"] == [], found
    assert not [line for line in found["said"] if "never allocated" in line]


def test_a_standalone_draft_keeps_its_own_as_stock(monkeypatch, caplog, context_restored):
    """STANDALONE keeps the draft's own embedding and head (its worker shares nothing): built
    as stock sglang builds it, Qwen3.5's own embedding loaded with the checkpoint's where
    stock loads it (sglang 0.5.20 on)."""
    from safetensors.torch import load_file

    from sglang_mtp_dequant.serving.plugin import bypassed

    caplog.set_level(logging.INFO)
    folder = os.path.join(E2E, "float")
    launch = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": folder}
    plugin, _ = _qwen35_draft(folder, **launch)
    with bypassed():
        stock, _ = _qwen35_draft(folder, **launch)
    assert not any(p.device.type == "meta" for p in plugin.parameters())
    stored = load_file(os.path.join(folder, "model.safetensors"))["model.embed_tokens.weight"]
    loaded = [torch.equal(d.model.embed_tokens.weight, stored) for d in (plugin, stock)]
    assert loaded[0] == loaded[1], loaded
    assert not _vocab_lines(caplog)


def test_a_misspelt_switch_stops_the_build(monkeypatch, context_restored):
    """The switch is read the plugin's way (serving/settings.py): a typo stops the draft's
    build, naming the switch, instead of building as the user did not ask."""
    from sglang_mtp_dequant.errors import SettingError
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from support.cpu_sglang import build_draft_class

    case = CASES["qwen3_moe"]
    publish_context(TARGET, **EAGLE)
    monkeypatch.setenv(SWITCH, "of")
    with pytest.raises(SettingError, match=SWITCH):
        build_draft_class(case.class_path, case.config())


def test_a_class_that_builds_no_vocab_layer_of_its_own_is_left_alone(caplog, context_restored):
    """Where sglang binds the target's vocab layers at construction (a draft class building no
    vocab weight of its own, sglang #38147's way), the hook finds nothing to hold back and says
    nothing."""
    from sglang_mtp_dequant.serving.draft_vocab import held_back, make_build_hook
    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context

    publish_context(TARGET, **EAGLE)
    caplog.set_level(logging.INFO)
    target = torch.nn.Embedding(256, 64)

    def binds_the_targets(model: torch.nn.Module) -> None:
        torch.nn.Module.__init__(model)
        model.embed_tokens = target

    draft = torch.nn.Module.__new__(torch.nn.Module)
    make_build_hook(DRAFT_SPECS[0])(binds_the_targets, draft)
    assert draft.embed_tokens is target and held_back(draft) == 0
    assert not _vocab_lines(caplog)


def test_a_vocab_layer_the_draft_does_not_take_from_the_target_is_allocated(
    caplog, context_restored
):
    """A vocab layer a draft's constructor builds that sglang's worker does not replace (not
    embed_tokens / lm_head) gets storage where sglang builds it, its loader attributes kept, as
    sglang's torch.empty gives it; only the one taken from the target is held back."""
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from sglang_mtp_dequant.serving.draft_vocab import held_back, make_build_hook
    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context

    publish_context(TARGET, **EAGLE)
    caplog.set_level(logging.INFO)

    def builds_two(model: torch.nn.Module) -> None:
        torch.nn.Module.__init__(model)
        model.embed_tokens = VocabParallelEmbedding(256, 64)
        model.per_layer_embed = VocabParallelEmbedding(256, 64)

    draft = torch.nn.Module.__new__(torch.nn.Module)
    make_build_hook(DRAFT_SPECS[0])(builds_two, draft)
    assert draft.embed_tokens.weight.device.type == "meta"
    own = draft.per_layer_embed.weight
    assert own.device.type == "cpu" and own.shape == (256, 64)
    assert own.weight_loader == draft.per_layer_embed.weight_loader and own.output_dim == 0
    assert held_back(draft) == 256 * 64 * draft.embed_tokens.weight.element_size()
    assert "takes embed_tokens from the target" in _vocab_lines(caplog)[0]
