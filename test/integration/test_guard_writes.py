"""The write record (``guard/writes.py``) on sglang's own draft classes and loaders.

A write is credited to the parameter whose ``weight_loader`` sglang called and to the checkpoint
name sglang was processing when it read that loader. What that needs of sglang, each tested on
its real code: every parameter's loader attribute is left exactly as sglang built it; DeepSeek's
NextN calls its loaders from a thread pool; GLM-5's DSA indexer on CUDA is written without a
loader. ``test_draft_classes.py`` checks the crediting itself on every class (every stacked
parameter credited to exactly its checkpoint tensors, no name skipped).
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
from safetensors.torch import load_file

from sglang_mtp_dequant.serving.guard import MODE_ENV, MisloadedDraftError
from support.draft_cases import CASES
from support.paths import fixture_dir

GLM5 = "glm5_w8a8_mtp"
INDEXER = "model.layers.2.self_attn.indexer"  # the fixture's draft layer is its third


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)


def _attributes(model: torch.nn.Module) -> dict[str, dict[str, object]]:
    """Every parameter's own attributes (sglang's ``weight_loader`` among them), by name."""
    return {name: dict(vars(param)) for name, param in model.named_parameters()}


@pytest.mark.parametrize("case_id", list(CASES))
def test_the_load_leaves_every_loader_attribute_as_sglang_built_it(draft_case, case_id):
    """After the hooked load, each parameter holds the same attributes as before, each the same
    object: the loaders sglang set (bound methods, closures), no attribute where it had none
    (those sglang reads as ``default_weight_loader``), nothing of the recorder left."""
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from support.cpu_sglang import build_draft_class, path_weights

    case = CASES[case_id]
    _, load = draft_case(case)
    config = case.config()
    config.architectures = [case.architecture]
    publish_context(fixture_dir("q35_dense_w8a8_dynamic"), draft_path=load.folder)
    model = build_draft_class(case.class_path, config)
    before = _attributes(model)
    type(model).load_weights(model, path_weights(load.folder))
    after = _attributes(model)
    assert after.keys() == before.keys()
    for name, attrs in before.items():
        assert after[name].keys() == attrs.keys(), name
        changed = [k for k, v in attrs.items() if after[name][k] is not v]
        assert not changed, f"{name}: {changed}"


def test_deepseek_pool_writes_are_credited_to_their_names(draft_case, audits, monkeypatch):
    """DeepSeek's NextN loader submits its loader calls to a thread pool (CPU tensors:
    ``should_async_load``); they run after sglang has moved on to later names, and each is still
    credited to the name sglang read the loader for: the experts one by one, the deferred
    ``fused_qkv_a_proj_with_mqa`` to both of its halves."""
    submitted = []
    submit = concurrent.futures.ThreadPoolExecutor.submit

    def counting_submit(self, fn, *args, **kwargs):
        submitted.append(fn)
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", counting_submit)
    case = CASES["deepseek_v3"]
    _, load = draft_case(case)
    load()
    (audit,) = audits
    assert len(submitted) >= 20, "the loads did not go through sglang's thread pool"
    assert audit["unwritten"] == {} and audit["skipped"] == []
    source, module = case.experts
    assert sorted(audit["fed_by"][f"{module}.w13_weight"]) == sorted(
        f"{source}.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up")
    )
    assert sorted(audit["fed_by"][f"{module}.w2_weight"]) == sorted(
        f"{source}.{e}.down_proj.weight" for e in range(4)
    )
    fused = "model.decoder.self_attn.fused_qkv_a_proj_with_mqa.weight"
    assert sorted(audit["fed_by"][fused]) == sorted(case.params[fused])


def _glm5_with_fused_indexer():
    """GLM-5's draft as sglang builds it on CUDA, here on the CPU: the DSA indexer's ``wk`` and
    ``weights_proj`` replaced by the one bf16 ``wk_weights_proj`` that ``Indexer.__init__``
    builds when ``use_dsa_indexer_fusion`` (CUDA only: ``_is_cuda``, which this machine cannot
    answer True without the CUDA calls that follow it), with sglang's own ``ReplicatedLinear``."""
    from sglang.srt.layers.linear import ReplicatedLinear

    from support.cpu_sglang import new_draft

    config, model = new_draft(fixture_dir(GLM5))
    indexer = model.model.decoder.self_attn.indexer
    del indexer.wk, indexer.weights_proj
    indexer.wk_weights_proj = ReplicatedLinear(
        indexer.hidden_size,
        indexer.head_dim + indexer.n_heads,
        bias=False,
        params_dtype=torch.bfloat16,
        prefix="model.decoder.self_attn.indexer.wk_weights_proj",
    )
    return config, model


def test_indexer_written_without_a_loader_is_credited_by_name(sglang_cpu, audits):
    """sglang copies ``indexer.wk`` and ``indexer.weights_proj`` into the rows of the fused
    parameter with ``param.data[...].copy_`` (``_load_fused_indexer_wk``), calling no loader: the
    record credits both names to it by name, and the load passes the guard with the rows equal
    to the checkpoint's."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights

    config, model = _glm5_with_fused_indexer()
    type(model).load_weights(model, sglang_weights(config, model))
    (audit,) = audits
    fused = "model.decoder.self_attn.indexer.wk_weights_proj.weight"
    assert audit["unwritten"] == {} and audit["findings"] == []
    # the export's own copies of the target's embedding and head, which the NextN loader skips
    assert audit["skipped"] == [
        f"model.layers.2.{n}.weight" for n in ("embed_tokens", "shared_head.head")
    ]
    assert sorted(audit["fed_by"][fused]) == [
        f"{INDEXER}.{p}.weight" for p in ("weights_proj", "wk")
    ]
    tensors = load_file(f"{fixture_dir(GLM5)}/quant_model_weights-00001-of-00001.safetensors")
    want = torch.cat([tensors[f"{INDEXER}.wk.weight"], tensors[f"{INDEXER}.weights_proj.weight"]])
    assert torch.equal(dict(model.named_parameters())[fused], want.bfloat16())


def test_indexer_part_missing_is_refused(sglang_cpu):
    """Without ``indexer.weights_proj`` in the stream its rows stay as built; the guard names
    them."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights

    config, model = _glm5_with_fused_indexer()
    weights = (
        (n, t) for n, t in sglang_weights(config, model) if n != f"{INDEXER}.weights_proj.weight"
    )
    with pytest.raises(MisloadedDraftError) as caught:
        type(model).load_weights(model, weights)
    (finding,) = [f for f in caught.value.findings if f.unwritten is not None]
    assert finding.parameter == "model.decoder.self_attn.indexer.wk_weights_proj.weight"
    assert finding.unwritten == "rows of 'weights_proj' of 2"
