"""The completeness audit: a draft parameter sglang's loaders never wrote stops the load, by name.

sglang's per-model ``load_weights`` skip checkpoint names they do not know (a log line at best)
and never check that every draft parameter was written, so a checkpoint missing one projection,
one expert or ``mtp.fc``, or naming a tensor the class does not expect, starts a server whose
draft holds uninitialised memory. Every case here goes through a real sglang draft class and
its real loaders, hooked by ``load_plugins()``, streamed by sglang's ``DefaultModelLoader``:

- Qwen3.5 dense and MoE: msmodelslim's own fixtures (quantized and FLOAT), with a tensor
  dropped or renamed, loaded with ``load_draft`` (sglang's ``ModelConfig`` picks the class);
- GLM-4.5 NextN, Qwen3-MoE MTP and DeepSeek-V3 NextN: the checkpoints of
  ``test_draft_classes.py`` (each architecture's naming), changed before they are written.

Each refusal names the parameter and which part of it is missing (a q/k/v or gate/up shard,
the experts this rank keeps) and lists the checkpoint names the class skipped; the doctor's dry
run on the same folder (headers only) must report the same parameters and names.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.serving.guard import MODE_ENV, MisloadedDraftError
from support.checkpoints import edit_description
from support.draft_cases import CASES, Layout, expected
from support.paths import fixture_dir

DENSE = "q35_dense_w8a8_dynamic"
FLOAT = "q35_dense_float_mtp"
MOE = "q35moe_w8a8_dynamic"
ATTN = "mtp.layers.0.self_attn"
MLP = "mtp.layers.0.mlp"
QUANT_SUFFIXES = ("weight", "weight_scale", "weight_offset")


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    """Every test starts in the default mode (error), whatever the environment says."""
    monkeypatch.delenv(MODE_ENV, raising=False)


# -- changing a fixture checkpoint ------------------------------------------------------------


def edit_checkpoint(folder: str, drop=(), rename=None, add=None) -> str:
    """Drop, rename or add tensors of a copied fixture, in its safetensors file, its index and
    its description alike (an index naming a tensor the file lacks is another error)."""
    drop, rename, add = set(drop), dict(rename or {}), dict(add or {})
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    for i, path in enumerate(files):
        tensors = load_file(path)
        missing = drop - set(tensors) if len(files) == 1 else set()
        assert not missing, f"not in the checkpoint: {missing}"
        kept = {rename.get(n, n): t for n, t in tensors.items() if n not in drop}
        if i == 0:
            kept.update(add)
        os.chmod(path, 0o644)
        save_file(kept, path, metadata={"format": "pt"})
    first = os.path.basename(files[0])
    for path in glob.glob(os.path.join(folder, "*.index.json")):
        with open(path) as handle:
            index = json.load(handle)
        weight_map = {rename.get(n, n): f for n, f in index["weight_map"].items() if n not in drop}
        index["weight_map"] = weight_map | {n: first for n in add}
        os.chmod(path, 0o644)
        with open(path, "w") as handle:
            json.dump(index, handle)

    def renamed(desc: dict) -> dict:
        desc = {rename.get(n, n): t for n, t in desc.items() if n not in drop}
        return desc | {n: "FLOAT" for n in add if n not in desc}

    edit_description(folder, renamed)
    return folder


def quantized(name: str) -> list[str]:
    """A W8A8_DYNAMIC weight and its companions (what goes when a projection is missing)."""
    return [f"{name}.{suffix}" for suffix in QUANT_SUFFIXES]


def unwritten(error: MisloadedDraftError) -> dict[str, str]:
    return {f.parameter: f.unwritten for f in error.findings if f.unwritten is not None}


def refused_load(load, *args, **kwargs) -> MisloadedDraftError:
    with pytest.raises(MisloadedDraftError) as caught:
        load(*args, **kwargs)
    return caught.value


def assert_doctor_agrees(folder: str, error: MisloadedDraftError) -> None:
    """The doctor's dry run (headers only, the class on the meta device) finds what the load
    found: the same unfilled parameters with the same parts, the same skipped names."""
    from sglang_mtp_dequant.tools.doctor import diagnose

    report = diagnose(folder)
    assert "on the meta device, through the plugin's stream" in report.dry_run, report.dry_run
    assert report.verdict == "error"
    assert report.unfilled == unwritten(error)
    assert report.skipped == error.skipped


# -- Qwen3.5 dense: the real fixtures, quantized and float ---------------------------------------

DENSE_BREAKS = {
    # id: (what goes, what is renamed, parameter -> the parts left unwritten)
    "k_proj": (
        [f"{ATTN}.k_proj.weight"],
        {},
        {"model.layers.0.qkv_proj.weight": "shard 'k' of 3"},
    ),
    "q_and_v_proj": (
        [f"{ATTN}.q_proj.weight", f"{ATTN}.v_proj.weight"],
        {},
        {"model.layers.0.qkv_proj.weight": "shard 'q', 'v' of 3"},
    ),
    "gate_proj": (
        [f"{MLP}.gate_proj.weight"],
        {},
        {"model.layers.0.mlp.gate_up_proj.weight": "shard 0 of 2"},
    ),
    "up_proj": (
        [f"{MLP}.up_proj.weight"],
        {},
        {"model.layers.0.mlp.gate_up_proj.weight": "shard 1 of 2"},
    ),
    "o_proj": ([f"{ATTN}.o_proj.weight"], {}, {"model.layers.0.o_proj.weight": "no write at all"}),
    "fc": (["mtp.fc.weight"], {}, {"fc.weight": "no write at all"}),
    "norm": (["mtp.norm.weight"], {}, {"model.norm.weight": "no write at all"}),
}


def _dense_break(folder: str, fixture: str, drop: list[str], rename: dict) -> None:
    """Drop whole tensors: a quantized projection goes with its companions."""
    quant = fixture != FLOAT
    gone = [
        n
        for name in drop
        for n in (quantized(name[: -len(".weight")]) if quant and "proj" in name else [name])
    ]
    edit_checkpoint(folder, drop=gone, rename=rename)


@pytest.mark.parametrize("fixture", (DENSE, FLOAT))
@pytest.mark.parametrize("break_id", list(DENSE_BREAKS))
def test_dense_draft_missing_a_tensor_is_refused_naming_the_part(
    load_draft, copy_checkpoint, fixture, break_id
):
    """Quantized (the plugin dequantizes the rest) and FLOAT (nothing to dequantize: the audit
    still runs) alike. The sources named are the tensors that did write the parameter."""
    drop, rename, parts = DENSE_BREAKS[break_id]
    folder = copy_checkpoint(fixture)
    _dense_break(folder, fixture, drop, rename)
    load_draft(folder, plugin=False)  # stock sglang: no complaint at all
    error = refused_load(load_draft, folder)
    assert unwritten(error) == parts
    assert error.skipped == []
    message = str(error)
    assert "parts no checkpoint tensor wrote" in message and f"loaded from {folder}" in message
    for parameter, what in parts.items():
        assert f"{parameter} [bfloat16 " in message
        assert f"never written by sglang's loaders ({what})" in message
    if break_id == "k_proj":
        (finding,) = error.findings
        names = [s.name for s in finding.sources]
        assert names == [f"{ATTN}.q_proj.weight", f"{ATTN}.v_proj.weight"]
        assert all(s.dequantized == (fixture == DENSE) for s in finding.sources)
    assert_doctor_agrees(folder, error)


def test_dense_draft_missing_a_weight_lists_its_leftover_companions_as_skipped(
    load_draft, copy_checkpoint
):
    """The weight is gone, its scale and offset stay: nothing consumes them, sglang's loader
    skips them, and the error lists them beside the unwritten shard."""
    folder = edit_checkpoint(copy_checkpoint(DENSE), drop=[f"{ATTN}.k_proj.weight"])
    error = refused_load(load_draft, folder)
    assert unwritten(error) == {"model.layers.0.qkv_proj.weight": "shard 'k' of 3"}
    assert sorted(error.skipped) == [f"{ATTN}.k_proj.weight_offset", f"{ATTN}.k_proj.weight_scale"]
    assert "checkpoint tensors sglang's loaders skipped: " in str(error)
    assert_doctor_agrees(folder, error)


@pytest.mark.parametrize("fixture", (DENSE, FLOAT))
def test_renamed_tensor_the_class_skips_is_refused_listing_the_name(
    load_draft, copy_checkpoint, fixture
):
    """``mtp.fc.weight_packed`` (a compressed-tensors name, here holding the float weight):
    Qwen3.5's loader logs 'not found in params_dict, skip loading'; the plugin refuses the
    draft, naming ``fc.weight`` and the skipped checkpoint name."""
    folder = edit_checkpoint(
        copy_checkpoint(fixture), rename={"mtp.fc.weight": "mtp.fc.weight_packed"}
    )
    error = refused_load(load_draft, folder)
    assert unwritten(error) == {"fc.weight": "no write at all"}
    assert error.skipped == ["mtp.fc.weight_packed"]
    message = str(error)
    assert "fc.weight [bfloat16 [64, 128]]: never written by sglang's loaders" in message
    assert "checkpoint tensors sglang's loaders skipped: mtp.fc.weight_packed" in message
    assert_doctor_agrees(folder, error)


def test_compressed_tensors_packed_projection_is_refused_before_any_write(
    load_draft, copy_checkpoint
):
    """A compressed-tensors W4A16 projection (int32 ``weight_packed``, ``weight_scale``,
    int64 ``weight_shape``) in an unquantized draft: integer tensors nobody can decode are
    refused when the plan is made, naming the tensor; the doctor refuses the same tensor."""
    from sglang_mtp_dequant.tools.doctor import diagnose

    o = f"{ATTN}.o_proj"
    folder = edit_checkpoint(
        copy_checkpoint(FLOAT),
        drop=[f"{o}.weight"],
        add={
            f"{o}.weight_packed": torch.zeros(64, 16, dtype=torch.int32),
            f"{o}.weight_scale": torch.ones(64, 1, dtype=torch.bfloat16),
            f"{o}.weight_shape": torch.tensor([64, 128]),
        },
    )
    with pytest.raises(DraftWeightError) as caught:
        load_draft(folder)
    assert type(caught.value) is DraftWeightError  # the plan's refusal, before any write
    assert f"draft tensor '{o}.weight_packed'" in str(caught.value)
    assert "is stored as compressed-tensors pack-quantized (int32" in str(caught.value)
    report = diagnose(folder)
    assert report.verdict == "error"
    assert {t.name for t in report.tensors if t.action == "error"} >= {f"{o}.weight_packed"}


# -- Qwen3.5 MoE: the real fixture ----------------------------------------------------------------

W13 = "model.layers.0.mlp.experts.w13_weight"
W2 = "model.layers.0.mlp.experts.w2_weight"
MOE_BREAKS = {
    "expert_2_up": (
        quantized(f"{MLP}.experts.2.up_proj"),
        {W13: "1 of 8 expert shards (local experts 2)"},
    ),
    "expert_1_gate_and_3_up": (
        quantized(f"{MLP}.experts.1.gate_proj") + quantized(f"{MLP}.experts.3.up_proj"),
        {W13: "2 of 8 expert shards (local experts 1, 3)"},
    ),
    "expert_3_down": (
        quantized(f"{MLP}.experts.3.down_proj"),
        {W2: "1 of 4 expert shards (local experts 3)"},
    ),
    "expert_0_all": (
        [n for p in ("gate", "up", "down") for n in quantized(f"{MLP}.experts.0.{p}_proj")],
        {
            W13: "2 of 8 expert shards (local experts 0)",
            W2: "1 of 4 expert shards (local experts 0)",
        },
    ),
    "shared_expert_gate_proj": (
        [f"{MLP}.shared_expert.gate_proj.weight"],
        {"model.layers.0.mlp.shared_expert.gate_up_proj.weight": "shard 0 of 2"},
    ),
    "router": ([f"{MLP}.gate.weight"], {"model.layers.0.mlp.gate.weight": "no write at all"}),
    "v_proj": (quantized(f"{ATTN}.v_proj"), {"model.layers.0.qkv_proj.weight": "shard 'v' of 3"}),
}


@pytest.mark.parametrize("break_id", list(MOE_BREAKS))
def test_moe_draft_missing_an_expert_or_shard_is_refused(load_draft, copy_checkpoint, break_id):
    drop, parts = MOE_BREAKS[break_id]
    folder = edit_checkpoint(copy_checkpoint(MOE), drop=drop)
    load_draft(folder, plugin=False)  # stock sglang: no complaint at all
    error = refused_load(load_draft, folder)
    assert unwritten(error) == parts
    assert error.skipped == []
    for parameter, what in parts.items():
        assert f"{parameter} [bfloat16 " in str(error) and f"({what})" in str(error)
    assert_doctor_agrees(folder, error)


# -- the policy -------------------------------------------------------------------------------


def _float_draft_without_k_proj(copy_checkpoint) -> str:
    return edit_checkpoint(copy_checkpoint(FLOAT), drop=[f"{ATTN}.k_proj.weight"])


def test_warn_mode_logs_one_warning_and_loads(load_draft, copy_checkpoint, monkeypatch, caplog):
    folder = _float_draft_without_k_proj(copy_checkpoint)
    monkeypatch.setenv(MODE_ENV, "warn")
    model = load_draft(folder)
    ours = [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert [r.levelname for r in ours] == ["WARNING"]
    message = ours[0].getMessage()
    assert "model.layers.0.qkv_proj.weight" in message and "shard 'k' of 3" in message
    assert message.endswith(f"(continuing: {MODE_ENV}=warn)")
    q = dict(model.named_parameters())["model.layers.0.qkv_proj.weight"][:256]
    want = load_file(glob.glob(os.path.join(fixture_dir(FLOAT), "*.safetensors"))[0])
    assert torch.equal(q, want[f"{ATTN}.q_proj.weight"])  # loaded as asked


def test_off_mode_says_nothing_and_loads(load_draft, copy_checkpoint, monkeypatch, caplog):
    folder = _float_draft_without_k_proj(copy_checkpoint)
    monkeypatch.setenv(MODE_ENV, "off")
    load_draft(folder)
    assert not [r for r in caplog.records if r.name == "sglang_mtp_dequant"]


def test_error_is_the_default_and_explicit_mode(load_draft, copy_checkpoint, monkeypatch):
    folder = _float_draft_without_k_proj(copy_checkpoint)
    refused_load(load_draft, folder)
    monkeypatch.setenv(MODE_ENV, " Error ")
    refused_load(load_draft, folder)


# -- parameters the draft takes from the target ---------------------------------------------------


def test_target_shared_parameters_are_declared_not_reported(load_draft, copy_checkpoint):
    """Qwen3.5's draft never loads ``lm_head`` (the EAGLE worker sets the target's): a broken
    draft's error names only what is really missing, and a complete draft passes."""
    folder = edit_checkpoint(copy_checkpoint(FLOAT), drop=["mtp.fc.weight", "lm_head.weight"])
    error = refused_load(load_draft, folder)
    assert unwritten(error) == {"fc.weight": "no write at all"}
    shared = {"lm_head", "embed_tokens"}
    assert not [f for f in error.findings if shared & set(f.parameter.split("."))]
    load_draft(fixture_dir(FLOAT))


def test_the_declaration_is_what_leaves_lm_head_out(sglang_cpu):
    """The same complete load recorded with and without the declared ``from_target``:
    without it, ``lm_head.weight`` is reported as never written (it really is not), so the
    declaration, not luck, keeps it out of the audit."""
    from sglang_mtp_dequant.serving.drafts import spec_for_architecture
    from sglang_mtp_dequant.serving.guard import WriteRecorder
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    folder = fixture_dir(FLOAT)
    spec = spec_for_architecture("Qwen3_5ForConditionalGeneration")
    assert spec.from_target == ("embed_tokens", "lm_head")
    for from_target, want in (((), {"lm_head.weight": "no write at all"}), (spec.from_target, {})):
        config, model = new_draft(folder)
        stock = type(model).load_weights.__wrapped__
        with WriteRecorder(model, from_target) as writes:
            stock(model, sglang_weights(config, model))
        assert writes.unwritten() == want


# -- NextN and other hand-built classes ---------------------------------------------------------

GLM_LAYER = "model.layers.2"
GLM_D = "model.decoder"


def _drop(*names: str):
    def edit(ckpt: Layout) -> None:
        for name in names:
            del ckpt.tensors[name]
            del ckpt.desc[name]

    return edit


def _drop_quantized(*bases: str):
    return _drop(*(n for b in bases for n in quantized(b)))


GLM_BREAKS = {
    "k_proj": (
        _drop_quantized(f"{GLM_LAYER}.self_attn.k_proj"),
        {f"{GLM_D}.self_attn.qkv_proj.weight": "shard 'k' of 3"},
    ),
    "v_bias": (
        _drop(f"{GLM_LAYER}.self_attn.v_proj.bias"),
        {f"{GLM_D}.self_attn.qkv_proj.bias": "shard 'v' of 3"},
    ),
    "e_score_correction_bias": (
        _drop(f"{GLM_LAYER}.mlp.gate.e_score_correction_bias"),
        {f"{GLM_D}.mlp.gate.e_score_correction_bias": "no write at all"},
    ),
    "expert_1_gate": (
        _drop_quantized(f"{GLM_LAYER}.mlp.experts.1.gate_proj"),
        {f"{GLM_D}.mlp.experts.w13_weight": "1 of 8 expert shards (local experts 1)"},
    ),
    "expert_2_down": (
        _drop_quantized(f"{GLM_LAYER}.mlp.experts.2.down_proj"),
        {f"{GLM_D}.mlp.experts.w2_weight": "1 of 4 expert shards (local experts 2)"},
    ),
    "shared_experts_up": (
        _drop_quantized(f"{GLM_LAYER}.mlp.shared_experts.up_proj"),
        {f"{GLM_D}.mlp.shared_experts.gate_up_proj.weight": "shard 1 of 2"},
    ),
    "eh_proj": (_drop(f"{GLM_LAYER}.eh_proj.weight"), {"model.eh_proj.weight": "no write at all"}),
}


@pytest.mark.parametrize("break_id", list(GLM_BREAKS))
def test_glm45_nextn_missing_a_tensor_is_refused(draft_case, break_id):
    """GLM-4.5's loader skips unknown and missing names silently (no log at all)."""
    edit, parts = GLM_BREAKS[break_id]
    _, load = draft_case(CASES["glm4_moe"], edit=edit)
    load(plugin=False)  # stock sglang: no complaint at all
    error = refused_load(load)
    assert unwritten(error) == parts
    assert error.skipped == []
    assert "Glm4MoeForCausalLMNextN draft" in str(error)
    assert_doctor_agrees(load.folder, error)


def fuse_experts(prefix: str):
    """Replace the per-expert tensors under ``prefix`` (``...mlp.experts``) with the fused
    layout (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I], no
    ``.weight``), holding the float weights the per-expert codes stand for."""

    def edit(ckpt: Layout) -> None:
        gate_up, down = [], []
        for e in range(4):
            weights = {
                p: expected(ckpt.tensors, ckpt.desc, f"{prefix}.{e}.{p}_proj.weight")
                for p in ("gate", "up", "down")
            }
            gate_up.append(torch.cat([weights["gate"], weights["up"]]))
            down.append(weights["down"])
            for p in ("gate", "up", "down"):
                _drop_quantized(f"{prefix}.{e}.{p}_proj")(ckpt)
        for name, value in (("gate_up_proj", gate_up), ("down_proj", down)):
            ckpt.tensors[f"{prefix}.{name}"] = torch.stack(value)
            ckpt.desc[f"{prefix}.{name}"] = "FLOAT"

    return edit


@pytest.mark.parametrize("case_id", ("glm4_moe", "qwen3_moe"))
def test_fused_experts_layout_the_class_ignores_is_refused(draft_case, case_id):
    """GLM-4.5's and Qwen3-MoE's loaders drop ``experts.gate_up_proj`` / ``experts.down_proj``
    without a word (research: w13/w2 stay as built); the audit names both expert parameters,
    every expert shard missing, and the two fused names as skipped."""
    case = CASES[case_id]
    source, module = case.experts
    _, load = draft_case(case, edit=fuse_experts(source))
    load(plugin=False)  # stock sglang: no complaint at all
    error = refused_load(load)
    assert unwritten(error) == {
        f"{module}.w13_weight": "8 of 8 expert shards (local experts 0, 1, 2, 3)",
        f"{module}.w2_weight": "4 of 4 expert shards (local experts 0, 1, 2, 3)",
    }
    assert sorted(error.skipped) == [f"{source}.down_proj", f"{source}.gate_up_proj"]
    assert_doctor_agrees(load.folder, error)


def test_fused_experts_layout_deepseek_loads_is_accepted(draft_case, audits):
    """The same layout where the class does load it (DeepSeek's ``_load_fused_expert_tensor``):
    every expert written, bit for bit, no complaint; the fused names fed the parameters."""
    case = CASES["deepseek_v3"]
    source, module = case.experts
    ckpt, load = draft_case(case, edit=fuse_experts(source))
    params = load(nan=True)
    (audit,) = audits
    assert audit["unwritten"] == {} and audit["findings"] == []
    assert f"{source}.gate_up_proj" not in audit["skipped"]
    assert audit["fed_by"][f"{module}.w13_weight"] == [f"{source}.gate_up_proj"]
    assert audit["fed_by"][f"{module}.w2_weight"] == [f"{source}.down_proj"]
    assert torch.equal(params[f"{module}.w13_weight"], ckpt.tensors[f"{source}.gate_up_proj"])
    assert torch.equal(params[f"{module}.w2_weight"], ckpt.tensors[f"{source}.down_proj"])


def test_nextn_missing_expert_is_refused_for_deepseek(draft_case):
    """DeepSeek writes experts from a thread pool: the record still sees every write."""
    case = CASES["deepseek_v3"]
    source, module = case.experts
    _, load = draft_case(case, edit=_drop_quantized(f"{source}.3.up_proj"))
    error = refused_load(load)
    assert unwritten(error) == {f"{module}.w13_weight": "1 of 8 expert shards (local experts 3)"}


def test_nextn_shared_names_in_the_layer_are_not_reported(draft_case, audits):
    """Real NextN checkpoints carry their own ``embed_tokens`` and ``shared_head.head`` copies
    in the draft layer; GLM's loader skips them (the target's are used): the draft loads with
    no finding, and neither parameter is reported though neither was written."""

    def add_shared(ckpt: Layout) -> None:
        ckpt.float(f"{GLM_LAYER}.embed_tokens.weight", 256, 64)
        ckpt.float(f"{GLM_LAYER}.shared_head.head.weight", 256, 64)

    _, load = draft_case(CASES["glm4_moe"], edit=add_shared)
    params = load(nan=True)
    (audit,) = audits
    assert audit["unwritten"] == {} and audit["findings"] == []
    for shared in ("model.embed_tokens.weight", "lm_head.weight"):
        assert shared in params and shared not in audit["audited"]
        assert params[shared].isnan().all()  # never written, by design


@pytest.mark.parametrize("case_id", ("glm4_moe", "deepseek_v3"))
def test_anti_outlier_norm_biases_of_a_modelslim_target_are_not_reported(
    draft_case, audits, rmsnorm_restored, case_id
):
    """The product's own case: the target is served with --quantization modelslim and its
    description lists norm biases (static W8A8 anti-outlier), the draft runs unquantized.
    sglang's ModelSlimConfig then gives every RMSNorm built afterwards, the draft's included, a
    zero ``bias`` the draft's checkpoint need not hold: loads without a complaint."""
    from sglang.srt.layers.quantization.modelslim.modelslim import ModelSlimConfig

    ModelSlimConfig({"model.layers.0.input_layernorm.bias": "FLOAT"})  # sglang's real patch
    _, load = draft_case(CASES[case_id])
    params = load()
    biases = [n for n in params if n.endswith("norm.bias")]
    assert biases, "sglang's patch gave the draft's norms no bias: the case is not exercised"
    (audit,) = audits
    assert audit["unwritten"] == {} and not set(biases) & audit["audited"]
    assert all(float(params[n].abs().max()) == 0.0 for n in biases)
