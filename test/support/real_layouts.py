"""Header-faithful replicas of published ModelSlim checkpoints' MTP layers, at any scale.

Usage::

    layout = glm51_w8a8(scale=1)                 # full GLM-5.1-w8a8 shapes (MTP layer 78)
    write_checkpoint(folder, layout, sparse=True)    # real headers, holes for weights
    layout = glm51_w8a8(scale=64, experts=4)     # a small replica with the same names/dtypes
    write_checkpoint(folder, layout, sparse=False)   # real values (codes, scales, floats)

Names, dtypes and shape patterns follow the published GLM-5.1-w8a8 tensor inventory of its
MTP layer 78: MLA + DSA indexer attention in static W8A8 (int8
``weight``, f32 ``deq_scale`` [out], f32 ``input_scale`` / ``input_offset`` [1] with a non-zero
offset, int32 ``quant_bias`` [out]), routed and shared experts in W8A8_DYNAMIC (f32
``weight_scale`` / ``weight_offset`` [out, 1]), float32 norms, bf16 ``kv_b_proj``,
``indexer.wk``, ``indexer.weights_proj``, router, ``eh_proj``, ``enorm``, ``hnorm``, in-layer
``embed_tokens``, ``shared_head``; ``e_score_correction_bias`` f32; ``rot.safetensors`` holding
``rot.weight`` and ``"is_rot_used": true`` in the description (QuaRot). The config is
transformers' ``GlmMoeDsaConfig`` fields at GLM-5's sizes (hidden 6144, 64 heads of 192 + 64,
v 256, q_lora 2048, kv_lora 512, indexer 32 x 128, 256 experts of 2048, vocab 154880), divided
by ``scale``. ``rot.weight``'s dtype is not in the inventory: bf16 here.

Values (``sparse=False``): codes uniform in [-128, 127], weight scales ~0.001 (``deq_scale`` =
``input_scale`` 0.05 x a weight scale, as the saver computes it), input offset 3, norms near 1,
floats ~0.02; deterministic (seed 0).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from support.checkpoints import DESCRIPTION, write_index

DTYPE_BYTES = {"I8": 1, "I32": 4, "BF16": 2, "F32": 4, "I64": 8}
_NUMPY = {"I8": np.int8, "I32": np.int32, "F32": np.float32, "I64": np.int64}


@dataclass
class Layout:
    """A checkpoint to write: (name, dtype tag, shape) per tensor, description, config, files."""

    tensors: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    description: dict[str, object] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)
    #: tensor name -> file name (default: ``quant_model_weights-00001-of-00001.safetensors``)
    files: dict[str, str] = field(default_factory=dict)
    extra_files: dict[str, list[tuple[str, str, tuple[int, ...]]]] = field(default_factory=dict)

    def add(self, name: str, dtype: str, shape: tuple[int, ...], desc: str, file: str = ""):
        self.tensors.append((name, dtype, shape))
        self.description[name] = desc
        if file:
            self.files[name] = file

    def static_w8a8(self, prefix: str, out: int, inp: int, file: str = "") -> None:
        self.add(f"{prefix}.weight", "I8", (out, inp), "W8A8", file)
        self.add(f"{prefix}.deq_scale", "F32", (out,), "W8A8", file)
        self.add(f"{prefix}.input_scale", "F32", (1,), "W8A8", file)
        self.add(f"{prefix}.input_offset", "F32", (1,), "W8A8", file)
        self.add(f"{prefix}.quant_bias", "I32", (out,), "W8A8", file)

    def dynamic_w8a8(self, prefix: str, out: int, inp: int, file: str = "") -> None:
        self.add(f"{prefix}.weight", "I8", (out, inp), "W8A8_DYNAMIC", file)
        self.add(f"{prefix}.weight_scale", "F32", (out, 1), "W8A8_DYNAMIC", file)
        self.add(f"{prefix}.weight_offset", "F32", (out, 1), "W8A8_DYNAMIC", file)

    def float(self, name: str, shape: tuple[int, ...], dtype: str = "BF16", file: str = ""):
        self.add(name, dtype, shape, "FLOAT", file)


GLM5 = dict(
    hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048,
    num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512,
    qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, index_head_dim=128,
    index_n_heads=32, vocab_size=154880,
)  # fmt: skip


def glm5_config(scale: int = 1, experts: int = 256, layers: int = 78) -> dict:
    """GLM-5.1's config.json (``GlmMoeDsaForCausalLM``), its sizes divided by ``scale``."""
    sizes = {k: max(1, v // scale) for k, v in GLM5.items()}
    sizes["num_attention_heads"] = sizes["num_key_value_heads"] = max(2, 64 // scale)
    sizes["index_n_heads"] = max(1, 32 // scale)
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        **sizes,
        "num_hidden_layers": layers,
        "first_k_dense_replace": 3,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": min(8, experts),
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "index_topk": max(16, 2048 // scale),
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 202752,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "rope_interleave": True,
        "indexer_rope_interleave": True,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


DEEPSEEK_V32 = dict(
    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_head_dim=128,
    index_n_heads=64, vocab_size=129280,
)  # fmt: skip


def deepseek_v32_config(scale: int = 1, experts: int = 256) -> dict:
    """DeepSeek-V3.2's config.json (``DeepseekV32ForCausalLM``, 61 layers, yarn rope), its
    sizes divided by ``scale``, in GLM-5's layout of keys."""
    config = glm5_config(scale, experts, layers=61)
    config.update({k: max(1, v // scale) for k, v in DEEPSEEK_V32.items()})
    config["num_attention_heads"] = config["num_key_value_heads"] = max(2, 128 // scale)
    config["index_n_heads"] = max(1, 64 // scale)
    config.update(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32")
    config["rope_scaling"] = {
        "type": "yarn", "rope_type": "deepseek_yarn", "factor": 40, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    }  # fmt: skip
    config["rope_theta"] = 10000
    config.pop("rope_parameters")
    config["max_position_embeddings"] = 163840
    return config


def glm51_w8a8(
    scale: int = 1, experts: int = 256, target_layers: int = 0, config: dict | None = None
) -> Layout:
    """GLM-5.1-w8a8's MTP layer (``model.layers.78`` at full size), the target's embedding,
    final norm and lm_head, and ``target_layers`` dense target layers (shape-only stand-ins).
    ``config``: another DSA model's config in the same layout (``deepseek_v32_config``)."""
    config = config or glm5_config(scale, experts)
    c = {k: config[k] for k in GLM5}
    hidden, heads, ih, ihd = (
        c["hidden_size"], c["num_attention_heads"], c["index_n_heads"], c["index_head_dim"]
    )  # fmt: skip
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    layout = Layout(config=config)
    layout.description.update(
        {"model_quant_type": "W8A8", "version": "1.0.0", "group_size": 0, "is_rot_used": True}
    )
    n = config["num_hidden_layers"]
    mtp = "quant_model_weights-00002-of-00002.safetensors"
    target = "quant_model_weights-00001-of-00002.safetensors"
    layout.float("model.embed_tokens.weight", (c["vocab_size"], hidden), file=target)
    layout.float("model.norm.weight", (hidden,), file=target)
    layout.float("lm_head.weight", (c["vocab_size"], hidden), file=target)
    for i in range(target_layers):
        p = f"model.layers.{i}"
        layout.dynamic_w8a8(f"{p}.mlp.gate_proj", c["intermediate_size"], hidden, target)
        layout.float(f"{p}.input_layernorm.weight", (hidden,), "F32", target)
    p = f"model.layers.{n}"
    a = f"{p}.self_attn"
    layout.static_w8a8(f"{a}.q_a_proj", c["q_lora_rank"], hidden, mtp)
    layout.static_w8a8(f"{a}.q_b_proj", heads * (nope + rope), c["q_lora_rank"], mtp)
    layout.static_w8a8(f"{a}.kv_a_proj_with_mqa", c["kv_lora_rank"] + rope, hidden, mtp)
    layout.static_w8a8(f"{a}.o_proj", hidden, heads * v, mtp)
    layout.static_w8a8(f"{a}.indexer.wq_b", ih * ihd, c["q_lora_rank"], mtp)
    layout.float(f"{a}.kv_b_proj.weight", (heads * (nope + v), c["kv_lora_rank"]), file=mtp)
    layout.float(f"{a}.indexer.wk.weight", (ihd, hidden), file=mtp)
    layout.float(f"{a}.indexer.weights_proj.weight", (ih, hidden), file=mtp)
    layout.float(f"{a}.indexer.k_norm.weight", (ihd,), "F32", mtp)
    layout.float(f"{a}.indexer.k_norm.bias", (ihd,), "F32", mtp)
    layout.float(f"{a}.q_a_layernorm.weight", (c["q_lora_rank"],), "F32", mtp)
    layout.float(f"{a}.kv_a_layernorm.weight", (c["kv_lora_rank"],), "F32", mtp)
    layout.float(f"{p}.input_layernorm.weight", (hidden,), "F32", mtp)
    layout.float(f"{p}.post_attention_layernorm.weight", (hidden,), "F32", mtp)
    inter = c["moe_intermediate_size"]
    for e in range(experts):
        layout.dynamic_w8a8(f"{p}.mlp.experts.{e}.gate_proj", inter, hidden, mtp)
        layout.dynamic_w8a8(f"{p}.mlp.experts.{e}.up_proj", inter, hidden, mtp)
        layout.dynamic_w8a8(f"{p}.mlp.experts.{e}.down_proj", hidden, inter, mtp)
    for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden))):
        layout.dynamic_w8a8(f"{p}.mlp.shared_experts.{proj}", *shape, mtp)
    layout.dynamic_w8a8(f"{p}.mlp.shared_experts.down_proj", hidden, inter, mtp)
    layout.float(f"{p}.mlp.gate.weight", (experts, hidden), file=mtp)
    layout.float(f"{p}.mlp.gate.e_score_correction_bias", (experts,), "F32", mtp)
    layout.float(f"{p}.eh_proj.weight", (hidden, 2 * hidden), file=mtp)
    layout.float(f"{p}.enorm.weight", (hidden,), file=mtp)
    layout.float(f"{p}.hnorm.weight", (hidden,), file=mtp)
    layout.float(f"{p}.embed_tokens.weight", (c["vocab_size"], hidden), file=mtp)
    layout.float(f"{p}.shared_head.head.weight", (c["vocab_size"], hidden), file=mtp)
    layout.float(f"{p}.shared_head.norm.weight", (hidden,), file=mtp)
    layout.extra_files["rot.safetensors"] = [("rot.weight", "BF16", (hidden, hidden))]
    return layout


def draft_rows(layout: Layout) -> int:
    """How many rows the doctor lists for the draft: weights and floats, not companions."""
    layer = f"model.layers.{layout.config['num_hidden_layers']}."
    companions = ("deq_scale", "input_scale", "input_offset", "quant_bias", "weight_scale",
                  "weight_offset")  # fmt: skip
    return sum(
        1 for name, _, _ in layout.tensors
        if name.startswith(layer) and name.rpartition(".")[2] not in companions
    )  # fmt: skip


def write_checkpoint(folder: str, layout: Layout, *, sparse: bool, index: bool = False) -> int:
    """Write ``layout`` into ``folder``; returns the apparent bytes written.

    ``sparse``: headers are real, weights are holes that read as zeros, and the small
    companions (scales, offsets, biases) hold real values, so a plan can be built. Otherwise
    every tensor holds values (see the module docstring). ``index`` adds
    ``quant_model_weights.safetensors.index.json``.

    A writer beside ``support.checkpoints.write_modelslim_checkpoint`` because it starts from
    (name, dtype tag, shape) and writes each header first and then seeks: a checkpoint at a
    published model's real size (tens of GB apparent) costs a few KB of disk and no tensor in
    memory."""
    os.makedirs(folder, exist_ok=True)
    default = "quant_model_weights-00001-of-00001.safetensors"
    by_file: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}
    for name, dtype, shape in layout.tensors:
        by_file.setdefault(layout.files.get(name, default), []).append((name, dtype, shape))
    by_file.update(layout.extra_files)
    rng = np.random.default_rng(0)
    apparent = 0
    for file, tensors in by_file.items():
        apparent += _write_file(os.path.join(folder, file), sorted(tensors), sparse, rng)
    if index:
        weight_map = {name: file for file, entries in by_file.items() for name, _, _ in entries}
        write_index(folder, weight_map, None)
    with open(os.path.join(folder, DESCRIPTION), "w") as handle:
        json.dump(layout.description, handle)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(layout.config, handle)
    return apparent


def _values(name: str, dtype: str, shape: tuple[int, ...], rng) -> bytes:
    count = int(np.prod(shape))
    last = name.rpartition(".")[2]
    if dtype == "I8":
        return rng.integers(-128, 128, count, dtype=np.int8).tobytes()
    if last == "quant_bias":
        return rng.integers(-1000, 1000, count, dtype=np.int32).tobytes()
    if last == "input_scale":
        values = np.full(count, INPUT_SCALE)
    elif last == "deq_scale":  # input_scale * weight_scale, as msmodelslim's saver writes it
        values = INPUT_SCALE * rng.uniform(0.0005, 0.0015, count)
    elif last == "weight_scale":
        values = rng.uniform(0.0005, 0.0015, count)
    elif last == "input_offset":
        values = np.full(count, 3.0)
    elif last == "weight_offset":
        values = np.zeros(count)
    elif "norm" in name:
        values = 1.0 + 0.05 * rng.standard_normal(count)
    else:
        values = 0.02 * rng.standard_normal(count)
    f32 = values.astype(np.float32)
    if dtype == "BF16":
        return (f32.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return f32.astype(_NUMPY[dtype]).tobytes()


INPUT_SCALE = 0.05

_SMALL = ("weight_scale", "weight_offset", "deq_scale", "input_scale", "input_offset",
          "quant_bias")  # fmt: skip


def _write_file(path: str, tensors, sparse: bool, rng) -> int:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, filled = 0, []
    for name, dtype, shape in tensors:
        size = int(np.prod(shape)) * DTYPE_BYTES[dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        if not sparse or name.rpartition(".")[2] in _SMALL:
            filled.append((offset, name, dtype, shape))
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(blob)) + blob)
        base = handle.tell()
        for start, name, dtype, shape in filled:
            handle.seek(base + start)
            handle.write(_values(name, dtype, shape, rng))
        handle.truncate(base + offset)
    return base + offset
