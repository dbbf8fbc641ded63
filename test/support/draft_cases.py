"""Checkpoints and loads of every hooked draft class, shared by the tests that load them.

Real: each sglang 0.5.23 draft class (built on CPU with a tiny config of its own config class),
its own ``load_weights`` reached through the hook ``load_plugins()`` installed, the lazy weight
stream of sglang's ``DefaultModelLoader`` for the checkpoint folder
(``support.cpu_sglang.path_weights``), and msmodelslim 26.1.0's int8 codes. The checkpoints are
laid out in each architecture's naming (``mtp.*`` or ``model.layers.<num_hidden_layers>.*``),
with every quantized weight a run of rows of the tool's W8A8_DYNAMIC codes (per-channel codes
stay valid when rows are taken apart).

Used by ``test_draft_classes.py`` (every class loads right) and ``test_completeness.py`` (every
class refuses what is missing); the fixtures ``draft_case`` and ``audits`` reach the tests
through ``conftest.py``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from support.paths import fixture_dir
from support.reference import dequantize_fp32, dequantize_int4_fp32, description, load_all

MODELS = "sglang.srt.models"
MOE = "q35moe_w8a8_dynamic"


# -- checkpoints in each architecture's naming -------------------------------------------------


class CodeBank:
    """The tool's W8A8_DYNAMIC codes (with their per-row scale/offset), served as row runs."""

    def __init__(self) -> None:
        rows: dict[int, list[tuple[torch.Tensor, ...]]] = defaultdict(list)
        for name in (MOE, "q35_dense_w8a8_dynamic"):
            tensors, desc = load_all(fixture_dir(name)), description(fixture_dir(name))
            for key in sorted(k for k, t in desc.items() if t == "W8A8_DYNAMIC"):
                if key.endswith(".weight") and key.startswith("mtp."):
                    base = key[: -len(".weight")]
                    parts = (tensors[key], tensors[base + ".weight_scale"])
                    rows[tensors[key].shape[1]].append(parts + (tensors[base + ".weight_offset"],))
        self.pool = {
            width: [torch.cat(p) for p in zip(*runs, strict=True)] for width, runs in rows.items()
        }
        self.cursor: dict[int, int] = defaultdict(int)

    def take(self, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
        codes, scale, offset = self.pool[in_features]
        start = self.cursor[in_features]
        index = (torch.arange(out_features) + start) % codes.shape[0]
        self.cursor[in_features] = start + out_features
        return {
            "weight": codes[index],
            "weight_scale": scale[index],
            "weight_offset": offset[index],
        }


@dataclass
class Layout:
    """A checkpoint being written: tensors plus their description entries."""

    bank: CodeBank
    tensors: dict[str, torch.Tensor]
    desc: dict[str, str]
    generator: torch.Generator

    def quantized(self, name: str, out_features: int, in_features: int) -> None:
        for suffix, value in self.bank.take(out_features, in_features).items():
            self.tensors[f"{name}.{suffix}"] = value
            self.desc[f"{name}.{suffix}"] = "W8A8_DYNAMIC"

    def float(self, name: str, *shape: int, dtype=torch.bfloat16, around: float = 0.0) -> None:
        value = around + 0.05 * torch.randn(*shape, generator=self.generator)
        self.tensors[name] = value.to(dtype)
        self.desc[name] = "FLOAT"


def new_layout() -> Layout:
    return Layout(CodeBank(), {}, {}, torch.Generator().manual_seed(0))


def moe_block(ckpt: Layout, prefix: str, shared: str, experts=4, hidden=64, inter=32) -> None:
    """Routed experts (per expert, as msmodelslim writes them), router, shared expert."""
    for e in range(experts):
        ckpt.quantized(f"{prefix}.experts.{e}.gate_proj", inter, hidden)
        ckpt.quantized(f"{prefix}.experts.{e}.up_proj", inter, hidden)
        ckpt.quantized(f"{prefix}.experts.{e}.down_proj", hidden, inter)
    ckpt.float(f"{prefix}.gate.weight", experts, hidden)
    if shared:
        ckpt.quantized(f"{prefix}.{shared}.gate_proj", 64, hidden)
        ckpt.quantized(f"{prefix}.{shared}.up_proj", 64, hidden)
        ckpt.quantized(f"{prefix}.{shared}.down_proj", hidden, 64)


def qwen3_moe_checkpoint() -> Layout:
    ckpt = new_layout()
    ckpt.float("mtp.fc.weight", 64, 128)
    for norm in ("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.norm"):
        ckpt.float(f"{norm}.weight", 64, around=1.0)
    layer = "mtp.layers.0"
    for proj, out in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64)):
        ckpt.quantized(f"{layer}.self_attn.{proj}", out, 64)
    ckpt.quantized(f"{layer}.self_attn.o_proj", 64, 128)
    ckpt.float(f"{layer}.self_attn.q_norm.weight", 32, around=1.0)
    ckpt.float(f"{layer}.self_attn.k_norm.weight", 32, around=1.0)
    for norm in ("input_layernorm", "post_attention_layernorm"):
        ckpt.float(f"{layer}.{norm}.weight", 64, around=1.0)
    moe_block(ckpt, f"{layer}.mlp", shared="")
    ckpt.quantized("model.layers.0.self_attn.q_proj", 128, 64)  # the target's: not the draft
    return ckpt


def nextn_checkpoint(
    layer_id: int, mla: bool, layers: str = "model.layers", nope: int = 16, rope: int = 16
) -> Layout:
    """DeepSeek-V3 / GLM NextN: the draft is ``<layers>.<num_hidden_layers>`` (``layers``
    is ``model.language_model.layers`` in GLM-5-Next's multimodal naming; its attention has
    no rotary part: ``nope`` 32, ``rope`` 0)."""
    ckpt = new_layout()
    layer = f"{layers}.{layer_id}"
    ckpt.float(f"{layer}.eh_proj.weight", 64, 128)
    for norm in (
        "enorm",
        "hnorm",
        "shared_head.norm",
        "input_layernorm",
        "post_attention_layernorm",
    ):
        ckpt.float(f"{layer}.{norm}.weight", 64, around=1.0)
    attn = f"{layer}.self_attn"
    if mla:  # q_lora_rank 64, kv_lora_rank 64, 4 heads of nope + rope, v 16
        ckpt.quantized(f"{attn}.q_a_proj", 64, 64)
        ckpt.quantized(f"{attn}.kv_a_proj_with_mqa", 64 + rope, 64)
        ckpt.quantized(f"{attn}.q_b_proj", 4 * (nope + rope), 64)
        ckpt.quantized(f"{attn}.kv_b_proj", 4 * (nope + 16), 64)
        ckpt.quantized(f"{attn}.o_proj", 64, 64)
        ckpt.float(f"{attn}.q_a_layernorm.weight", 64, around=1.0)
        ckpt.float(f"{attn}.kv_a_layernorm.weight", 64, around=1.0)
    else:  # GLM-4.5: 4 heads of 32, kv 2, q/k/v biases (FLOAT f32 in ModelSlim exports)
        for proj, out in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64)):
            ckpt.quantized(f"{attn}.{proj}", out, 64)
            ckpt.float(f"{attn}.{proj}.bias", out, dtype=torch.float32)
        ckpt.quantized(f"{attn}.o_proj", 64, 128)
    moe_block(ckpt, f"{layer}.mlp", shared="shared_experts")
    ckpt.float(f"{layer}.mlp.gate.e_score_correction_bias", 4, dtype=torch.float32)
    ckpt.quantized("model.layers.0.self_attn.o_proj", 64, 128 if not mla else 64)  # target's
    return ckpt


def fixture_mtp(*sources: tuple[str, Callable[[str], bool]]) -> Layout:
    """The tool's own ``mtp.*`` tensors, each taken from the first source that selects it."""
    ckpt = new_layout()
    for name, select in sources:
        tensors, desc = load_all(fixture_dir(name)), description(fixture_dir(name))
        for key, value in tensors.items():
            if key.startswith("mtp.") and select(key) and key not in ckpt.tensors:
                ckpt.tensors[key], ckpt.desc[key] = value, desc[key]
    return ckpt


def is_attention(name: str) -> bool:
    return ".self_attn." in name and "_norm" not in name


def not_attention(name: str) -> bool:
    return not is_attention(name)


def qwen4_exp_checkpoint() -> Layout:
    """The MoE fixture's MTP layer, plus Qwen4-Exp's own float parts (hyper-connections with
    hc_count 2, lowrank 16; fc split into fc_embedding / fc_hidden)."""
    # Qwen4-Exp's hyper-connection norms replace the final and the per-layer RMSNorms
    own = ("mtp.fc.", "mtp.pre_fc_norm_hidden.", "mtp.norm.", "mtp.layers.0.input_layernorm.",
           "mtp.layers.0.post_attention_layernorm.")  # fmt: skip
    ckpt = fixture_mtp((MOE, lambda n: not n.startswith(own)))
    ckpt.float("mtp.fc_embedding.weight", 64, 64)
    ckpt.float("mtp.fc_hidden.weight", 64, 64)
    ckpt.float("mtp.pre_fc_norm_hidden.weight", 128, around=1.0)
    for block in ("layers.0.attn_hyper_connection", "layers.0.mlp_hyper_connection",
                  "hyper_connection_mixer"):  # fmt: skip
        ckpt.float(f"mtp.{block}.hc_norm.weight", 128, around=1.0)
        ckpt.float(f"mtp.{block}.input_mix_weight_down.weight", 16, 128)
        ckpt.float(f"mtp.{block}.input_mix_weight_up.weight", 128, 16)
        if block != "hyper_connection_mixer":
            ckpt.float(f"mtp.{block}.block_inject_weight.weight", 2, 128)
    return ckpt


# -- tiny configs of each class's own config type ------------------------------------------------


def qwen3_next_config():
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    return Qwen3NextConfig(**moe_text_config(), decoder_sparse_step=1, mlp_only_layers=[])


def moe_text_config() -> dict:
    """The MoE fixture's text_config fields the Qwen3-Next/Qwen4-Exp configs take."""
    import json
    import os

    with open(os.path.join(fixture_dir(MOE), "config.json")) as handle:
        text = json.load(handle)["text_config"]
    keys = (
        "vocab_size hidden_size num_attention_heads num_key_value_heads head_dim num_experts "
        "num_experts_per_tok moe_intermediate_size shared_expert_intermediate_size rms_norm_eps "
        "linear_num_value_heads linear_num_key_heads linear_key_head_dim linear_value_head_dim "
        "linear_conv_kernel_dim partial_rotary_factor"
    ).split()
    return {k: text[k] for k in keys} | {"num_hidden_layers": 2, "full_attention_interval": 2}


def qwen4_exp_config():
    from sglang.srt.configs.qwen4_exp import Qwen4ExpTextConfig

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    fields = moe_text_config() | {"num_hidden_layers": 1, "full_attention_interval": 1}
    return Qwen4ExpTextConfig(
        hc_count=2, hc_lowrank=16, layer_types=["full_attention"], rope_parameters=rope, **fields
    )


def qwen3_moe_config():
    import transformers

    return transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip


YARN = {
    "type": "yarn", "rope_type": "yarn", "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
    "original_max_position_embeddings": 2048, "mscale": 1.0, "mscale_all_dim": 1.0,
}  # fmt: skip


def nextn_config(kind: str):
    import transformers

    common = dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=2, first_k_dense_replace=0, num_nextn_predict_layers=1,
        n_group=1, topk_group=1,
    )  # fmt: skip
    mla = dict(
        q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=16,
        v_head_dim=16, num_key_value_heads=4,
    )  # fmt: skip
    if kind == "glm4":
        return transformers.Glm4MoeConfig(
            **common, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5,
            attention_bias=True, use_qk_norm=False,
        )  # fmt: skip
    if kind == "glm4_lite":
        return transformers.Glm4MoeLiteConfig(**common, **mla)
    config = transformers.DeepseekV3Config(
        **common, **mla, rope_scaling=dict(YARN), max_position_embeddings=2048
    )
    # sglang reads DeepSeek keys transformers' class no longer defines
    config.topk_method, config.moe_layer_freq = "noaux_tc", 1
    config.scoring_func, config.norm_topk_prob, config.routed_scaling_factor = "sigmoid", True, 1.0
    return config


def glm5_next_config():
    """sglang's own Glm5NextConfig, its text config shaped like the DeepSeek case's."""
    from sglang.srt.configs.glm5_next import Glm5NextConfig

    deepseek = nextn_config("deepseek")
    keys = (
        "vocab_size hidden_size num_hidden_layers num_attention_heads n_routed_experts "
        "num_experts_per_tok moe_intermediate_size n_shared_experts first_k_dense_replace "
        "num_nextn_predict_layers n_group topk_group q_lora_rank kv_lora_rank "
        "qk_nope_head_dim qk_rope_head_dim v_head_dim num_key_value_heads "
        "max_position_embeddings"
    ).split()
    text = {k: getattr(deepseek, k) for k in keys}
    text.update(qk_nope_head_dim=32, qk_rope_head_dim=0)  # GLM-5-Next's DSA layers are NoPE
    # config.json is read back by sglang (through transformers' strict validation), which
    # refuses the class's own None defaults for the indexer sizes
    strict = {
        "index_topk": 16, "index_head_dim": 16, "index_n_heads": 1, "head_dim": 32,
        "swiglu_limit": 10.0, "linear_lower_bound": 0.0, "gate_lower_bound": 0.0,
        "index_topk_pattern": "", "index_skip_topk_offset": 0,
    }  # fmt: skip
    return Glm5NextConfig(text_config={**text, **strict, "rope_scaling": dict(YARN)})


# -- the cases -------------------------------------------------------------------------------


def qwen_style_params(attn: str, layer="mtp.layers.0") -> dict[str, list[str]]:
    """Parameter -> checkpoint tensors stacked into it, for the Qwen MTP loaders."""
    a = f"{layer}.self_attn"
    return {
        f"model.layers.0.{attn}qkv_proj.weight": [f"{a}.{p}_proj.weight" for p in "qkv"],
        f"model.layers.0.{attn}o_proj.weight": [f"{a}.o_proj.weight"],
    }


def nextn_params(layer: str, mla: bool) -> dict[str, list[str]]:
    a, d = f"{layer}.self_attn", "model.decoder"
    params = {
        f"{d}.mlp.shared_experts.down_proj.weight": [f"{layer}.mlp.shared_experts.down_proj.weight"]
    }
    params[f"{d}.mlp.shared_experts.gate_up_proj.weight"] = [
        f"{layer}.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up")
    ]
    params[f"{d}.self_attn.o_proj.weight"] = [f"{a}.o_proj.weight"]
    if mla:
        params[f"{d}.self_attn.fused_qkv_a_proj_with_mqa.weight"] = [
            f"{a}.q_a_proj.weight",
            f"{a}.kv_a_proj_with_mqa.weight",
        ]
        params[f"{d}.self_attn.q_b_proj.weight"] = [f"{a}.q_b_proj.weight"]
        params[f"{d}.self_attn.kv_b_proj.weight"] = [f"{a}.kv_b_proj.weight"]
    else:
        params[f"{d}.self_attn.qkv_proj.weight"] = [f"{a}.{p}_proj.weight" for p in "qkv"]
    return params


@dataclass
class Case:
    class_path: str
    config: Callable[[], object]
    checkpoint: Callable[[], Layout]
    params: dict[str, list[str]]  # stacked / plain parameters
    experts: tuple[str, str]  # (checkpoint prefix of the routed experts, module of FusedMoE)
    stock: type[BaseException] | None  # what stock sglang raises; None = silent raw codes
    dequantized: int  # tensors the plugin decodes for this draft
    architecture: str  # config.json's, i.e. the target's (sglang rewrites it for the draft)


CASES = {
    "qwen3_next": Case(
        f"{MODELS}.qwen3_next_mtp.Qwen3NextForCausalLMMTP",
        qwen3_next_config,
        lambda: fixture_mtp((MOE, lambda n: True)),
        qwen_style_params(""),
        ("mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"),
        KeyError,  # 'model.layers.0.mlp.experts.w2_weight_offset': the first companion streamed
        15,
        "Qwen3NextForCausalLM",
    ),
    "qwen3_next_static_w8a8_attention": Case(
        f"{MODELS}.qwen3_next_mtp.Qwen3NextForCausalLMMTP",
        qwen3_next_config,
        lambda: fixture_mtp(("q35_dense_w8a8_static", is_attention), (MOE, not_attention)),
        qwen_style_params(""),
        ("mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"),
        KeyError,
        16,
        "Qwen3NextForCausalLM",
    ),
    "qwen3_next_w4a8_attention": Case(
        f"{MODELS}.qwen3_next_mtp.Qwen3NextForCausalLMMTP",
        qwen3_next_config,
        lambda: fixture_mtp(("q35_dense_w4a8_dynamic", is_attention), (MOE, not_attention)),
        qwen_style_params(""),
        ("mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"),
        KeyError,
        16,
        "Qwen3NextForCausalLM",
    ),
    "qwen4_exp": Case(
        f"{MODELS}.qwen4_exp_mtp.Qwen4ExpForCausalLMMTP",
        qwen4_exp_config,
        qwen4_exp_checkpoint,
        qwen_style_params(""),
        ("mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"),
        None,
        15,
        "Qwen4ExpForConditionalGeneration",
    ),
    "qwen3_moe": Case(
        f"{MODELS}.qwen3_moe_mtp.Qwen3MoeForCausalLMMTP",
        qwen3_moe_config,
        qwen3_moe_checkpoint,
        qwen_style_params("self_attn."),
        ("mtp.layers.0.mlp.experts", "model.layers.0.mlp.experts"),
        None,
        16,
        "Qwen3MoeForCausalLM",
    ),
    "glm4_moe": Case(
        f"{MODELS}.glm4_moe_nextn.Glm4MoeForCausalLMNextN",
        lambda: nextn_config("glm4"),
        lambda: nextn_checkpoint(2, mla=False),
        nextn_params("model.layers.2", mla=False),
        ("model.layers.2.mlp.experts", "model.decoder.mlp.experts"),
        None,
        19,
        "Glm4MoeForCausalLM",
    ),
    "glm4_moe_lite": Case(
        f"{MODELS}.glm4_moe_lite_nextn.Glm4MoeLiteForCausalLMNextN",
        lambda: nextn_config("glm4_lite"),
        lambda: nextn_checkpoint(2, mla=True),
        nextn_params("model.layers.2", mla=True),
        ("model.layers.2.mlp.experts", "model.decoder.mlp.experts"),
        None,
        20,
        "Glm4MoeLiteForCausalLM",
    ),
    "deepseek_v3": Case(
        f"{MODELS}.deepseek_nextn.DeepseekV3ForCausalLMNextN",
        lambda: nextn_config("deepseek"),
        lambda: nextn_checkpoint(2, mla=True),
        nextn_params("model.layers.2", mla=True),
        ("model.layers.2.mlp.experts", "model.decoder.mlp.experts"),
        KeyError,  # 'model.decoder.mlp.shared_experts.gate_up_proj.weight_offset'
        20,
        "DeepseekV3ForCausalLM",
    ),
    "glm5_next": Case(
        f"{MODELS}.glm5_next_nextn.Glm5NextForConditionalGenerationNextN",
        glm5_next_config,
        lambda: nextn_checkpoint(2, True, "model.language_model.layers", nope=32, rope=0),
        nextn_params("model.language_model.layers.2", mla=True),
        ("model.language_model.layers.2.mlp.experts", "model.decoder.mlp.experts"),
        None,
        20,
        "Glm5NextForConditionalGeneration",
    ),
}


def spec_of(case: Case):
    """The hooked spec whose ``load_weights`` runs for the case's class."""
    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS

    return next(
        s for s in DRAFT_SPECS if case.class_path in (s.target.rsplit(".", 1)[0], *s.inherited_by)
    )


def expected(tensors: dict, desc: dict, name: str) -> torch.Tensor:
    scheme = desc[name]
    if scheme == "FLOAT":
        return tensors[name].bfloat16()
    if scheme.startswith("W4"):
        return dequantize_int4_fp32(tensors, name, scheme, "1.0.0").bfloat16()
    return dequantize_fp32(tensors, name, scheme).bfloat16()


def poison(model: torch.nn.Module) -> None:
    """Fill every floating parameter with NaN before the load: whatever sglang's loaders do
    not write stays NaN, so what the load left unwritten is visible without the audit."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))


@pytest.fixture
def draft_case(sglang_cpu, tmp_path, caplog):
    """Write the case's checkpoint, point sglang's context at it, build the real class.

    ``make(case, edit=None, dest="ckpt")``: ``edit(layout)`` changes the checkpoint before it is
    written (a tensor dropped, renamed, re-laid out); each ``dest`` is its own folder (sglang
    caches configs by path, so a changed checkpoint never reuses a path). ``load(plugin=True,
    nan=False)`` builds the class, NaN-fills it when asked, and streams the folder through
    sglang's ``DefaultModelLoader`` iterator into the hooked (or, ``plugin=False``, the
    unwrapped stock) ``load_weights``; it returns the named parameters.
    """
    import logging

    from sglang_mtp_dequant.serving.sglang_private import unwrapped
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from support.checkpoints import write_modelslim_checkpoint
    from support.cpu_sglang import build_draft_class, path_weights

    caplog.set_level(logging.INFO)

    def make(case: Case, edit: Callable[[Layout], None] | None = None, dest: str = "ckpt"):
        ckpt = case.checkpoint()
        if edit is not None:
            edit(ckpt)
        folder = write_modelslim_checkpoint(str(tmp_path / dest), ckpt.tensors, ckpt.desc)
        config = case.config()
        config.architectures = [case.architecture]
        config.to_json_file(os.path.join(folder, "config.json"))

        def load(plugin: bool = True, nan: bool = False):
            # the hook reads the draft path (the target path is any valid model folder)
            publish_context(fixture_dir("q35_dense_w8a8_dynamic"), draft_path=folder)
            model = build_draft_class(case.class_path, config)
            if nan:
                poison(model)
            method = type(model).load_weights
            (method if plugin else unwrapped(method))(model, path_weights(folder))
            return dict(model.named_parameters())

        load.folder = folder  # type: ignore[attr-defined]
        return ckpt, load

    return make


@pytest.fixture
def audits(monkeypatch):
    """Every guard check the hook runs, with the write record it judged: proof that the
    completeness audit and the value guard ran on a load, and what they saw."""
    from sglang_mtp_dequant.serving import load as draft_load

    seen: list[dict] = []
    original = draft_load.check_loaded_draft

    def spy(model, load):
        writes = load.writes
        record = {
            "class": load.class_name,
            "unwritten": writes.unwritten(),
            "skipped": writes.skipped_names(),
            "audited": set(writes.params),
            "written": writes.written_parameters(),
            "fed_by": {name: list(names) for name, names in writes.fed_by.items()},
            "all": {n for n, _ in model.named_parameters()},
        }
        seen.append(record)
        record["findings"] = original(model, load)
        return record["findings"]

    monkeypatch.setattr(draft_load, "check_loaded_draft", spy)
    return seen
