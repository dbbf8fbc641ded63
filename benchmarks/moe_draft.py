"""A Qwen3.5-MoE W8A8_DYNAMIC checkpoint of any size (``bench_dequant.py``, ``bench_scaling.py``).

Usage::

    shape = MoeShape.qwen35_35b_a3b()                 # one real 35B-A3B MTP layer (256 experts)
    shape = MoeShape.tiny(experts=512)                # the test fixture's dimensions, N experts
    write_checkpoint(folder, shape)                   # config.json, one shard, description

Layout: what msmodelslim's V1 saver writes for the shipped Qwen3.5-MoE recipe with its ``mtp*``
excludes removed (``test/fixtures/modelslim/q35moe_w8a8_dynamic/RECIPE.md``): W8A8_DYNAMIC
(int8 codes, f32 ``weight_scale`` / zero ``weight_offset`` of shape (out, 1)) on the MTP
layer's self-attention q/k/v and on every routed expert (``mtp.layers.0.mlp.experts.N.
{gate,up,down}_proj``, one tensor per expert), everything else FLOAT in bf16, all in ONE
safetensors file with ``quant_model_description.json`` (the tests' writer,
``test/support/checkpoints.py``; the description entries as ``benchmarks/accept/export.py``
writes them for ``make accept``). ``config.json`` is the
fixture's ``Qwen3_5MoeForConditionalGeneration`` config with the sizes replaced, so sglang
builds its real ``Qwen3_5ForCausalLMMTP`` draft from it. Only the draft's tensors and the
target's embedding / lm_head are written: the backbone plays no part in loading the draft.
Codes and scales are random (seeded): loading cost does not depend on the values.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FIXTURE_CONFIG = os.path.join(
    REPO, "test", "fixtures", "modelslim", "q35moe_w8a8_dynamic", "config.json"
)
SHARD = "quant_model_weights.safetensors"  # V1 with part_file_size 0: one file, no index
LAYER = "mtp.layers.0"


@dataclass(frozen=True)
class MoeShape:
    """The sizes of one Qwen3.5-MoE MTP layer."""

    experts: int
    hidden: int
    moe_intermediate: int
    shared_intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def qwen35_35b_a3b(cls, experts: int = 256) -> MoeShape:
        """Qwen3.5-35B-A3B's text config (vocabulary cut to 1024: the embedding and lm_head
        come from the target at serve time and are not decoded)."""
        return cls(experts, 2048, 512, 512, 16, 2, 256, 1024)

    @classmethod
    def tiny(cls, experts: int) -> MoeShape:
        """The dimensions of the q35moe_w8a8_dynamic test fixture, with ``experts`` experts."""
        return cls(experts, 64, 32, 64, 4, 2, 32, 320)

    def quantized(self) -> dict[str, tuple[int, int]]:
        """W8A8_DYNAMIC weight name -> (out, in)."""
        h = self.hidden
        shapes = {
            f"{LAYER}.self_attn.q_proj.weight": (self.heads * self.head_dim * 2, h),  # gated q
            f"{LAYER}.self_attn.k_proj.weight": (self.kv_heads * self.head_dim, h),
            f"{LAYER}.self_attn.v_proj.weight": (self.kv_heads * self.head_dim, h),
        }
        for e in range(self.experts):
            prefix = f"{LAYER}.mlp.experts.{e}"
            shapes[f"{prefix}.gate_proj.weight"] = (self.moe_intermediate, h)
            shapes[f"{prefix}.up_proj.weight"] = (self.moe_intermediate, h)
            shapes[f"{prefix}.down_proj.weight"] = (h, self.moe_intermediate)
        return shapes

    def floats(self) -> dict[str, tuple[int, ...]]:
        """FLOAT (bf16) tensor name -> shape."""
        h, shared = self.hidden, self.shared_intermediate
        return {
            "model.language_model.embed_tokens.weight": (self.vocab, h),
            "lm_head.weight": (self.vocab, h),
            "mtp.fc.weight": (h, 2 * h),
            "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,),
            "mtp.norm.weight": (h,),
            f"{LAYER}.input_layernorm.weight": (h,),
            f"{LAYER}.post_attention_layernorm.weight": (h,),
            f"{LAYER}.self_attn.o_proj.weight": (h, self.heads * self.head_dim),
            f"{LAYER}.self_attn.q_norm.weight": (self.head_dim,),
            f"{LAYER}.self_attn.k_norm.weight": (self.head_dim,),
            f"{LAYER}.mlp.gate.weight": (self.experts, h),
            f"{LAYER}.mlp.shared_expert.gate_proj.weight": (shared, h),
            f"{LAYER}.mlp.shared_expert.up_proj.weight": (shared, h),
            f"{LAYER}.mlp.shared_expert.down_proj.weight": (h, shared),
            f"{LAYER}.mlp.shared_expert_gate.weight": (1, h),
        }

    def config(self) -> dict:
        with open(FIXTURE_CONFIG, encoding="utf-8") as handle:
            config = json.load(handle)
        rotary_half = int(self.head_dim * 0.25) // 2  # partial_rotary_factor 0.25
        sections = [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3]
        text = config["text_config"]
        text.update(
            hidden_size=self.hidden,
            num_experts=self.experts,
            moe_intermediate_size=self.moe_intermediate,
            shared_expert_intermediate_size=self.shared_intermediate,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab,
        )
        text["rope_parameters"]["mrope_section"] = sections
        config["vision_config"]["out_hidden_size"] = self.hidden
        return config


def write_checkpoint(folder: str, shape: MoeShape, seed: int = 0) -> dict:
    """Write the checkpoint into ``folder``; returns counts for the caller's report."""
    import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
    from accept.export import DESCRIPTION_GLOBALS, add_w8a8_dynamic

    from support.checkpoints import write_modelslim_checkpoint

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    description: dict = {}
    for name, dims in shape.floats().items():
        value = torch.randn(dims, generator=gen) * 0.02 if len(dims) == 2 else torch.zeros(dims)
        tensors[name] = value.to(torch.bfloat16)
        description[name] = "FLOAT"
    codes = 0
    for name, (out, inp) in shape.quantized().items():
        q = torch.randint(-128, 128, (out, inp), dtype=torch.int8, generator=gen)
        scale = torch.rand((out, 1), generator=gen) * 1e-3 + 1e-5
        parts = {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}
        add_w8a8_dynamic(tensors, description, name[: -len(".weight")], parts)
        codes += q.numel()
    description.update(DESCRIPTION_GLOBALS)
    write_modelslim_checkpoint(folder, tensors, description, shard=SHARD, config=shape.config())
    expert_codes = 3 * shape.experts * shape.moe_intermediate * shape.hidden
    return {"tensors": len(tensors), "codes": codes, "expert_codes": expert_codes}
