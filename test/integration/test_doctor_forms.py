"""The doctor's answer for each launch form (F1-F4), per sglang release, and the draft's memory.

Against sglang 0.5.23's own resolution and draft classes built on the meta device: the MoE
W8A8_DYNAMIC e2e fixture (``moe_w8a8``), a copy of it whose MTP routed experts only are FLOAT
(``support.float_experts``), and one with experts part FLOAT. NPU kernels cannot run here: the
quantized MoE layers look theirs up while built, answered by placeholders
(``cpu_env.npu_kernels_looked_up``); no kernel is called. Where stock sglang cannot build the
draft under F2 / F4, the doctor builds it with the serving hook itself
(``float_layers.builds_as_the_plugin``): ``test_the_doctors_quantized_build_is_the_serving_hooks``.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from sglang_mtp_dequant.serving.context import sglang_version
from sglang_mtp_dequant.tools.doctor import diagnose
from sglang_mtp_dequant.tools.forms import (
    FORMS,
    RULES,
    draft_quantization,
    form_of,
    rule_for,
)
from sglang_mtp_dequant.tools.launch import parse_launch
from support.checkpoints import edit_description
from support.float_experts import float_experts_copy
from support.paths import E2E

MOE = os.path.join(E2E, "moe_w8a8")
EXPERTS = "mtp.layers.0.mlp.experts"
SGLANG_ERROR = f"Unsupported ModelSlim MoE schemes for layer {EXPERTS}: W13='FLOAT', W2='FLOAT'"


@pytest.fixture(scope="module")
def float_experts(tmp_path_factory) -> str:
    return float_experts_copy(str(tmp_path_factory.mktemp("export") / "moe_float_experts"))


def doctor(folder: str, key: str, forms: bool = False):
    launch = parse_launch(folder, [*FORMS[key].flags, "--speculative-algorithm", "EAGLE"])
    return diagnose(folder, launch=launch, forms=forms)


# -- the forms on moe_w8a8 -------------------------------------------------------------------


@pytest.mark.parametrize("key", ("F1", "F3"))
def test_unquantized_forms_are_answered_unquantized_garbage_stock_and_ok_with_the_plugin(key):
    report = doctor(MOE, key)
    assert report.form.startswith(f"{key} (")
    assert report.built_quantized is None and "is built unquantized" in report.built
    assert report.stock_serves is False and "raw codes" in report.stock_outcome
    assert report.verdict == "ok", report.unchecked
    assert report.counts()["dequantize"] == 32


@pytest.mark.parametrize("key", ("F2", "F4"))
def test_quantized_forms_are_answered_quantized_and_checked_without_npu_kernels(key):
    """Before this change the doctor built nothing here (npu_dynamic_quant is missing on the
    CPU), ended 'unchecked' and called the draft unquantized garbage (issue 45, finding 2)."""
    report = doctor(MOE, key)
    assert report.built_quantized == "modelslim" and "built quantized (modelslim)" in report.built
    assert "unquantized" not in report.built
    assert report.verdict == "ok" and report.unchecked == []
    assert report.dry_run.endswith("built quantized (modelslim), through the plugin's stream")
    assert any("npu_dynamic_quant" in note for note in report.notes)  # the stand-in, said
    # sglang's quantized layers take every code; only the plain nn.Linear gate needs decoding
    assert [t.name for t in report.tensors if t.action == "dequantize"] == [
        "mtp.layers.0.mlp.shared_expert_gate.weight"
    ]
    assert report.stock_serves is False  # stock copies that gate's codes, its scale dropped
    why = "copied to the unset draft quantization" if key == "F2" else "given"
    assert why in report.built


def test_the_built_line_cites_where_the_release_takes_the_draft_quantization():
    report = doctor(MOE, "F2")
    assert f"(sglang {sglang_version()} arg_groups/serving_hook.py:685-690)" in report.built
    report = doctor(MOE, "F1")
    assert "never for the draft (sglang 0.5.23 configs/model_config.py:1825)" in report.built


# -- a description marking the MTP experts FLOAT ---------------------------------------------


@pytest.mark.parametrize("key", ("F2", "F4"))
def test_float_experts_under_a_quantized_build_stock_stops_and_the_plugin_builds_them_float(
    float_experts, key
):
    report = doctor(float_experts, key)
    assert report.startup_error == f"ValueError: {SGLANG_ERROR}"  # sglang's own, quoted
    assert report.stock_serves is False and report.stock_outcome.startswith("does not start")
    assert report.built_quantized == "modelslim" and EXPERTS in report.plugin_builds
    assert report.verdict == "ok" and report.unfilled == {}
    rows = {t.name: t for t in report.tensors}
    assert rows[f"{EXPERTS}.0.gate_proj.weight"].action == "keep"  # bf16, loaded as stored


@pytest.mark.parametrize("key", ("F1", "F3"))
def test_float_experts_unquantized_forms_dequantize_the_rest(float_experts, key):
    report = doctor(float_experts, key)
    assert report.built_quantized is None and report.startup_error == ""
    assert report.verdict == "ok" and report.counts()["dequantize"] == 8  # attention, shared


def test_experts_part_float_part_quantized_stop_naming_the_layer_and_the_form_that_works(
    tmp_path,
):
    folder = str(tmp_path / "moe_part_float")
    shutil.copytree(MOE, folder)
    expert0 = {
        f"{EXPERTS}.0.{proj}.weight": "FLOAT" for proj in ("gate_proj", "up_proj", "down_proj")
    }
    edit_description(folder, lambda d: d.update(expert0))
    report = doctor(folder, "F2")
    assert report.verdict == "error" and report.startup_error
    (problem,) = report.problems
    assert problem.startswith(
        f"the plugin stops the start-up: sglang-mtp-dequant: MoE layer {EXPERTS}: "
    )
    assert (
        "F1 (no quantization flag) or F3 (--speculative-draft-model-quantization unquant)"
        in problem
    )


def test_the_doctors_quantized_build_is_the_serving_hooks(float_experts, monkeypatch):
    """The doctor asks the serving hook itself (``float_layers.quant_method``), not a copy of
    its rule: with the hook answering as sglang does, the plugin's build stops where stock's
    does, and the doctor says so (naming the launch that serves)."""
    from sglang_mtp_dequant.serving import float_layers

    def as_sglang(original, quant_config, layer, prefix, *args, **kwargs):
        return original(quant_config, layer, prefix, *args, **kwargs)

    assert doctor(float_experts, "F2").verdict == "ok"
    monkeypatch.setattr(float_layers, "quant_method", as_sglang)
    report = doctor(float_experts, "F2")
    assert report.verdict == "error" and report.built_quantized is None
    (problem,) = report.problems
    assert problem.startswith("with the plugin too sglang stops at start-up (as stock does): ")
    assert "F1 (no quantization flag) or F3" in problem


# -- every form, and the recommendation ------------------------------------------------------


def test_every_form_is_answered_and_the_cheapest_that_serves_recommended(float_experts):
    report = doctor(float_experts, "F1", forms=True)
    answers = {a.key: a for a in report.forms}
    assert list(answers) == ["F1", "F2", "F3", "F4"]
    assert all(a.plugin_serves for a in answers.values())
    assert answers["F1"].draft_bytes == answers["F3"].draft_bytes
    assert answers["F2"].draft_bytes == answers["F4"].draft_bytes < answers["F1"].draft_bytes
    saved = answers["F1"].draft_bytes - answers["F2"].draft_bytes
    assert report.recommended.startswith("F2 (--quantization modelslim) or F4 (")
    assert f"({saved:,} B, {100 * saved / answers['F1'].draft_bytes:.1f}%) less than F1/F3" in (
        report.recommended
    )
    assert answers["F2"].stock.startswith("does not start (ValueError: Unsupported ModelSlim")
    assert answers["F2"].stock_error.startswith("ValueError: Unsupported ModelSlim MoE schemes")


def test_a_target_with_float_experts_stops_stock_in_every_form_and_the_plugin_serves_each():
    """The bundled ``moe_float_experts`` export: its backbone's routed experts are FLOAT too,
    and the target is built with ModelSlim in every form (auto-detected in F1/F3), so stock
    sglang stops at the target's first MoE layer whatever the draft flags (as its server did:
    docs/results.md); with the plugin every form serves. The top answer says the same."""
    report = doctor(os.path.join(E2E, "moe_float_experts"), "F1", forms=True)
    answers = {a.key: a for a in report.forms}
    assert list(answers) == ["F1", "F2", "F3", "F4"]
    for answer in answers.values():
        assert answer.stock == "does not start (at the target)"
        assert answer.target.startswith("stock does not start at model.layers.0.mlp.experts and")
        assert answer.stock_serves is False and answer.plugin_serves
    assert report.stock.startswith(
        f"stock sglang {sglang_version()} does not start: the target's model.layers.0.mlp.experts"
    )
    assert report.recommended.startswith("F2 (--quantization modelslim) or F4 (")


# -- the per-release rule ----------------------------------------------------------------------


@pytest.mark.parametrize("release", sorted(RULES))
def test_each_release_gives_an_unset_draft_quantization_the_target_flag(release):
    expected = {"F1": None, "F2": "modelslim", "F3": None, "F4": "modelslim"}
    for form in FORMS.values():
        assert form_of(form.quantization, form.draft) == form
        assert draft_quantization(form.quantization, form.draft) == expected[form.key], form
        assert form.draft_built == expected[form.key]
    assert rule_for(release).release == release == rule_for(f"{release}.post1").release
    assert rule_for("0.9.0").release == "0.5.23"  # newer than read: the newest read


def test_the_rule_agrees_with_the_installed_sglangs_resolution_and_its_cited_lines():
    """sglang's own resolution (its ServerArgs published as a scheduler does, then the draft's
    ModelConfig), for each form, gives the draft the quantization the rule says; and the lines
    the rule cites for the installed release hold that code."""
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, prepare_cpu_process

    for form in FORMS.values():
        q, d = form.quantization, form.draft
        prepare_cpu_process(MOE, quantization=q, speculative_draft_model_quantization=d)
        assert draft_model_config(MOE).quantization == draft_quantization(q, d), form
    import sglang  # imported (torchvision repaired) by prepare_cpu_process above

    rule = rule_for(sglang_version())
    root = os.path.join(os.path.dirname(sglang.__file__), "srt")
    path, lines = rule.draft_default_at.split(":")
    first, last = (int(n) for n in lines.split("-"))
    with open(os.path.join(root, path)) as handle:
        cited = "".join(handle.readlines()[first - 1 : last])
    assert re.search(r"speculative_draft_model_quantization\s*=\s*cfg\.quantization", cited)
    path, line = rule.no_autodetect_at.split(":")
    with open(os.path.join(root, path)) as handle:
        assert handle.readlines()[int(line) - 1].strip() == "if self.is_draft_model:"


# -- the memory numbers against config arithmetic -----------------------------------------------


def test_the_meta_builds_bytes_equal_config_arithmetic_on_moe_w8a8():
    """Qwen3.5-MoE MTP layer of moe_w8a8's config.json (hidden 192, 4 heads / 2 KV heads of 64
    (q gated: twice the heads), 8 experts of 64, shared expert 128), counted by hand: bf16 for
    F1; for F2 int8 codes for every ModelSlim linear, a per-output-channel scale and offset
    (bf16 on the dense linears, fp32 on the experts, as sglang's W8A8 schemes create them)."""
    h, heads, kv, d, e, moe, shared = 192, 4, 2, 64, 8, 64, 128
    qkv, o = (2 * heads * d + 2 * kv * d) * h, h * heads * d
    w13, w2, sh_gu, sh_down = e * 2 * moe * h, e * h * moe, 2 * shared * h, h * shared
    plain = 2 * h * h + 5 * h + 2 * d + e * h + h  # fc, norms, q/k norm, router, shared gate
    f1 = 2 * (qkv + o + w13 + w2 + sh_gu + sh_down + plain)
    dense_rows = (2 * heads * d + 2 * kv * d) + h + 2 * shared + h
    f2 = (qkv + o + w13 + w2 + sh_gu + sh_down) + 2 * plain
    f2 += 2 * 2 * dense_rows + 4 * 2 * (e * 2 * moe + e * h)
    assert doctor(MOE, "F1").draft_bytes == f1 == 1_283_584
    assert doctor(MOE, "F2").draft_bytes == f2


def test_full_size_qwen35_27b_tp2_per_rank_bytes_equal_config_arithmetic(tmp_path):
    """benchmarks/draft_memory.py's build (every rank in one process, sglang's parallel
    context overridden per rank) at Qwen3.5-27B's full shapes, TP 2, against the shapes."""
    import draft_memory

    from support.shapes import HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, KV_HEADS

    folder = str(tmp_path / "q35_27b")
    draft_memory.write_model("qwen3.5-27b", folder)
    ranks = draft_memory.in_process(folder, tp=2, ep=1)
    sharded = ((2 * HEADS + 2 * KV_HEADS) * HEAD_DIM * HIDDEN + HIDDEN * HEADS * HEAD_DIM
               + 3 * INTERMEDIATE * HIDDEN) // 2  # fmt: skip
    plain = 2 * HIDDEN * HIDDEN + 5 * HIDDEN + 2 * HEAD_DIM  # fc (replicated), norms
    rows = ((2 * HEADS + 2 * KV_HEADS) * HEAD_DIM + 2 * INTERMEDIATE) // 2 + 2 * HIDDEN
    for rank in ranks:
        assert rank["F1"]["bytes"] == rank["F3"]["bytes"] == 2 * (sharded + plain)
        assert rank["F2"]["bytes"] == rank["F4"]["bytes"] == sharded + 2 * plain + 2 * 2 * rows
        assert rank["F2"]["by_dtype"]["int8"] == sharded


def test_the_in_process_ranks_equal_a_real_gloo_worlds_ranks(tmp_path):
    """The benchmark's per-rank override against two processes, each a rank of a real gloo
    world (TP 2, EP 2) joined by sglang's own init: the same bytes on each rank and form."""
    import draft_memory

    model = draft_memory.Model("moe", "moe_w8a8", 2, 2)
    real = draft_memory.in_processes(MOE, model, str(tmp_path))
    mine = draft_memory.in_process(MOE, tp=2, ep=2)
    assert [{k: r[k]["bytes"] for k in r} for r in real] == [
        {k: r[k]["bytes"] for k in r} for r in mine
    ]
    assert real[0]["F1"]["bytes"] != real[0]["F2"]["bytes"]


def test_the_cli_prints_the_form_every_forms_line_and_the_recommendation(capsys, tmp_path):
    """The command of issue 45's finding 2, as a user types it."""
    from sglang_mtp_dequant.tools.cli import main

    flags = ["--quantization", "modelslim", "--speculative-algorithm", "EAGLE"]
    code = main(["doctor", MOE, *flags, "--log", str(tmp_path / "sglang.log")])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1].startswith("verdict: ok - sglang builds the draft quantized")
    assert "  form: F2 (--quantization modelslim)" in out
    forms = [line.strip() for line in out if re.match(r"    F[1-4] ", line)]
    assert [line[:2] for line in forms] == ["F1", "F2", "F3", "F4"]
    assert "draft built quantized (modelslim)" in forms[1] and "(744,448 B) with the" in forms[1]
    assert "draft built unquantized (bfloat16)" in forms[0] and "(1,283,584 B) with" in forms[0]
    (recommended,) = [line for line in out if line.startswith("  recommended: ")]
    assert "(539,136 B, 42.0%) less than F1/F3" in recommended
    assert not any("unchecked" in line for line in out)
