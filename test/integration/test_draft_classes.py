"""Every draft class sglang can build unquantized from a quantized checkpoint, hooked and loaded.

Real: each sglang 0.5.23 draft class (built on CPU with a tiny config of its own config class),
its own ``load_weights`` reached through the hook ``load_plugins()`` installed, the lazy weight
stream of sglang's ``DefaultModelLoader`` for the checkpoint folder
(``support.cpu_sglang.path_weights``), and msmodelslim 26.1.0's int8 codes.

Qwen3-Next's and Qwen4-Exp's MTP layer has the Qwen3.5-MoE shapes, so they load the tool's
``q35moe_w8a8_dynamic`` tensors as written (Qwen3-Next also with the attention of the static
W8A8 and the W4A8 fixtures: every companion kind). The other classes need other names and
shapes: their checkpoints are laid out here in each architecture's naming
(``mtp.*`` or ``model.layers.<num_hidden_layers>.*``), with every quantized weight a run of rows
of the tool's W8A8_DYNAMIC codes (per-channel codes stay valid when rows are taken apart).

Every class builds on CPU, so none is tested by name handling alone. Each good load also passes
the plugin's completeness audit and value guard in their default (error) mode: the zero-false-
positive check of every hooked class at TP=1 (``test_completeness.py`` breaks these checkpoints).
"""

from __future__ import annotations

import pkgutil

import pytest
import torch

from support.draft_cases import CASES, MODELS, expected, spec_of

# -- the hooks -----------------------------------------------------------------------------------

HOOKED_CLASSES = {
    f"{MODELS}.qwen3_5_mtp.Qwen3_5ForCausalLMMTP",
    f"{MODELS}.qwen3_next_mtp.Qwen3NextForCausalLMMTP",
    f"{MODELS}.qwen3_moe_mtp.Qwen3MoeForCausalLMMTP",
    f"{MODELS}.glm4_moe_nextn.Glm4MoeForCausalLMNextN",
    f"{MODELS}.glm4_moe_lite_nextn.Glm4MoeLiteForCausalLMNextN",
    f"{MODELS}.deepseek_nextn.DeepseekV3ForCausalLMNextN",
    f"{MODELS}.glm5_next_nextn.Glm5NextForConditionalGenerationNextN",
}
INHERITING_CLASSES = {f"{MODELS}.qwen4_exp_mtp.Qwen4ExpForCausalLMMTP"}


def test_every_draft_class_has_its_load_weights_hooked_once(sglang_cpu):
    from sglang_mtp_dequant.serving.context import registered_targets
    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS

    specs = {spec.target.rsplit(".", 1)[0]: spec for spec in DRAFT_SPECS}
    assert set(specs) == HOOKED_CLASSES
    assert {c for spec in DRAFT_SPECS for c in spec.inherited_by} == INHERITING_CLASSES
    for path, spec in specs.items():
        assert spec.target in registered_targets()
        installed = pkgutil.resolve_name(path).__dict__["load_weights"]
        original = installed.__wrapped__  # sglang's HookRegistry wrapper around the original
        assert not hasattr(original, "__wrapped__"), f"{path}: wrapped more than once"
        assert original.__module__ == path.rsplit(".", 1)[0], f"{path}: wraps a foreign method"
        for sub_path in spec.inherited_by:
            sub = pkgutil.resolve_name(sub_path)
            assert "load_weights" not in sub.__dict__, f"{sub_path} got a second wrapper"
            assert sub.load_weights is installed


def test_glm5_reaches_the_deepseek_hook_through_super(sglang_cpu):
    """GLM-5's NextN overrides load_weights only to pre-process, then calls super()."""
    import inspect

    glm5 = pkgutil.resolve_name(f"{MODELS}.glm4_moe.GlmMoeDsaForCausalLMNextN")
    deepseek = pkgutil.resolve_name(f"{MODELS}.deepseek_nextn.DeepseekV3ForCausalLMNextN")
    assert issubclass(glm5, deepseek)
    assert "super().load_weights(weights)" in inspect.getsource(glm5.load_weights)
    assert hasattr(deepseek.__dict__["load_weights"], "__wrapped__")


@pytest.mark.parametrize("case_id", list(CASES))
def test_draft_class_loads_dequantized(draft_case, audits, case_id, caplog, monkeypatch):
    """Bit-exact dequantization through each class's own loaders, and the guard's zero false
    positives on it (TP=1): the completeness audit and the value guard ran (mode error, the
    default), found every audited parameter written and raised nothing; the NaN the class was
    filled with before the load is gone from every audited parameter, so
    "complete" is true, not just claimed. Only the declared target-shared parameters (embedding,
    lm_head: ``DraftSpec.from_target``) are left out of the audit, and only they keep NaN."""
    from sglang_mtp_dequant.serving.guard import MODE_ENV

    monkeypatch.delenv(MODE_ENV, raising=False)
    case = CASES[case_id]
    ckpt, load = draft_case(case)
    params = load(nan=True)
    (audit,) = audits
    assert audit["class"] == spec_of(case).class_name
    shared = {n for n in audit["all"] if {"embed_tokens", "lm_head"} & set(n.split("."))}
    assert shared and audit["audited"] == audit["all"] - shared, case_id
    assert audit["written"] == audit["audited"], audit["audited"] - audit["written"]
    assert audit["unwritten"] == {} and audit["findings"] == []
    unfilled = {n for n, p in params.items() if p.is_floating_point() and p.isnan().any()}
    assert unfilled <= shared, unfilled - shared
    for param, parts in case.params.items():
        want = torch.cat([expected(ckpt.tensors, ckpt.desc, n) for n in parts])
        assert torch.equal(params[param].detach(), want), f"{case_id}: {param}"
    source, module = case.experts
    for e in range(4):
        gate, up, down = (
            expected(ckpt.tensors, ckpt.desc, f"{source}.{e}.{p}_proj.weight")
            for p in ("gate", "up", "down")
        )
        assert torch.equal(params[f"{module}.w13_weight"][e], torch.cat([gate, up])), f"w13[{e}]"
        assert torch.equal(params[f"{module}.w2_weight"][e], down), f"w2[{e}]"
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert len(lines) == 1 and f"dequantized {case.dequantized} tensors" in lines[0], lines
    assert not [r for r in caplog.records if "not found in params_dict" in r.getMessage()]


@pytest.mark.parametrize("case_id", list(CASES))
def test_good_load_skips_no_name_and_credits_every_source(draft_case, audits, case_id):
    """On a complete checkpoint no streamed draft name is reported as skipped, and each
    stacked parameter is credited to exactly the checkpoint tensors stacked into it: the names
    the guard's messages and the doctor print must be the true ones."""
    case = CASES[case_id]
    _, load = draft_case(case)
    load()
    (audit,) = audits
    assert audit["skipped"] == []
    for param, parts in case.params.items():
        assert sorted(audit["fed_by"][param]) == sorted(parts), param


@pytest.mark.parametrize("case_id", list(CASES))
def test_stock_sglang_fails_or_loads_raw_codes(draft_case, case_id):
    """What each class does without the plugin: stops (Qwen3-Next on any companion, DeepSeek
    on a shared-expert companion) or copies the int8 codes into bf16 silently."""
    case = CASES[case_id]
    ckpt, load = draft_case(case)
    if case.stock is not None:
        with pytest.raises(case.stock):
            load(plugin=False)
        return
    params = load(plugin=False)
    module = case.experts[1]
    quantized = [p for p, parts in case.params.items() if ckpt.desc[parts[0]] != "FLOAT"]
    for param in [f"{module}.w13_weight", f"{module}.w2_weight", *quantized]:
        assert params[param].detach().abs().max() >= 100, f"{case_id}: {param}"
