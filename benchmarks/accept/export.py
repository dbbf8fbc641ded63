"""Write the trained model as checkpoints: float (Hugging Face layout) and ModelSlim W8A8_DYNAMIC.

The quantized checkpoint is what msmodelslim 26.1.0's shipped Qwen3.5 dense recipe
(``--quant_type w8a8``, config_id Qwen3_5_dense_w8a8) writes: every linear layer whose
module name matches ``*self_attn*`` or ``*mlp*`` (backbone AND MTP) becomes W8A8_DYNAMIC,
everything else stays FLOAT in the model dtype. The tests' ``quantize_w8a8_dynamic``
(``test/support/reference.py``) repeats msmodelslim's arithmetic operation for operation, in
the layer's own dtype (bf16), which is why its rounding error reaches 0.75 of a step and not 0.5.
``writer_proof`` checks the output byte for byte against msmodelslim's on a shared fixture.

Files (V1 engine, one shard): ``quant_model_weights-00001-of-00001.safetensors``,
``quant_model_weights.safetensors.index.json``, ``quant_model_description.json``,
``config.json``.

A MoE model (``TinySpec.num_experts``) is written the way Qwen3.5-MoE releases and
msmodelslim lay it out: the float checkpoint keeps the backbone's routed experts fused
(``model.layers.L.mlp.experts.gate_up_proj`` (E, 2I, H) / ``down_proj`` (E, H, I), as
transformers holds them) and stores the MTP layer's one tensor per expert
(``mtp.layers.0.mlp.experts.N.{gate,up,down}_proj.weight``); msmodelslim writes every expert
per expert, so the ModelSlim export splits the backbone's too. The same ``*self_attn*`` /
``*mlp*`` rule then quantizes every linear of the MoE layers (q/k/v/o, each routed expert,
the shared expert and its gate) in the backbone and the MTP layer; the router ``mlp.gate``
is not an nn.Linear in msmodelslim's model and stays FLOAT, as msmodelslim 26.1.0 left it with
this rule (``test/fixtures/modelslim/_gen/cfg/q35moe_w8a8_dynamic_all.yaml``). msmodelslim's
shipped Qwen3.5-MoE recipe would exclude ``mtp*`` altogether.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
import torch
from safetensors.torch import save_file

from support.checkpoints import write_modelslim_checkpoint
from support.reference import quantize_w8a8_dynamic

from .model import FULL, LINEAR, TinyQwen35

INCLUDE = ("*self_attn*", "*mlp*")
EXCLUDE = ("*visual*",)
#: a MoE layer's router: a gate module of its own in msmodelslim's model, not an nn.Linear, so
#: ``linear_quant`` leaves it FLOAT (dense layers have no module of this name)
ROUTER = ".mlp.gate"
SHARD = "quant_model_weights-00001-of-00001.safetensors"
INDEX = "quant_model_weights.safetensors.index.json"
DESCRIPTION = "quant_model_description.json"


def config_json(model: TinyQwen35) -> dict:
    """config.json of the text-only checkpoint (sglang reads the same fields)."""
    raw = model.config.to_dict()
    raw["architectures"] = ["Qwen3_5MoeForCausalLM" if model.spec.is_moe else "Qwen3_5ForCausalLM"]
    # sglang 0.5.23 reads the layer pattern from this key, not from ``layer_types``
    raw["full_attention_interval"] = full_attention_interval(model.spec.layer_types)
    raw["dtype"] = "bfloat16"
    for key in ("id2label", "label2id", "_name_or_path", "transformers_version"):
        raw.pop(key, None)
    return raw


def full_attention_interval(layer_types: tuple[str, ...]) -> int:
    """The period of ``layer_types``' full-attention layers (4 for Qwen3.5's 3:1, 1 for all).

    Raises ValueError for a pattern sglang's ``(layer + 1) % interval == 0`` rule cannot express.
    """
    interval = layer_types.index(FULL) + 1
    expected = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(len(layer_types)))
    if expected != tuple(layer_types):
        raise ValueError(f"layer pattern {layer_types} has no full_attention_interval")
    return interval


def float_state_dict(model: TinyQwen35, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Checkpoint names -> tensors: the target's own names plus ``mtp.*`` (as Qwen3.5 ships)."""
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.target.state_dict().items()}
    for name, value in model.mtp.state_dict().items():
        tensors[f"mtp.{name}"] = value.detach().to(dtype).contiguous()
    if model.spec.is_moe:  # the MTP layer's experts one per tensor, as Qwen3.5-MoE ships them
        tensors = per_expert_tensors(tensors, prefix="mtp.")
    return tensors


FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"


def per_expert_tensors(tensors: dict, prefix: str = "") -> dict:
    """``tensors`` with each fused routed-expert tensor under ``prefix`` split per expert.

    ``...mlp.experts.gate_up_proj`` (E, 2I, H) becomes ``...mlp.experts.N.gate_proj.weight``
    (its first I rows: transformers' ``Qwen3_5MoeExperts`` chunks gate before up) and
    ``...up_proj.weight``; ``...mlp.experts.down_proj`` (E, H, I) becomes
    ``...mlp.experts.N.down_proj.weight``. Other tensors are kept as they are, in order.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        fused = name.startswith(prefix) and name.endswith((FUSED_GATE_UP, FUSED_DOWN))
        if not fused:
            out[name] = value
            continue
        base = name[: -len("gate_up_proj" if name.endswith(FUSED_GATE_UP) else "down_proj")]
        for expert in range(value.shape[0]):
            if name.endswith(FUSED_GATE_UP):
                gate, up = value[expert].chunk(2, dim=0)
                out[f"{base}{expert}.gate_proj.weight"] = gate.contiguous()
                out[f"{base}{expert}.up_proj.weight"] = up.contiguous()
            else:
                out[f"{base}{expert}.down_proj.weight"] = value[expert].contiguous()
    return out


def _write_config(folder: str, model: TinyQwen35) -> None:
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config_json(model), handle, indent=2)


def write_float_checkpoint(model: TinyQwen35, folder: str) -> dict:
    """The release-style float checkpoint (bf16 ``model.safetensors``); returns its tensors."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tensors = float_state_dict(model)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    _write_config(folder, model)
    return tensors


def is_quantized_linear(name: str, tensor: torch.Tensor) -> bool:
    """The recipe's selection: a linear weight under ``*self_attn*`` / ``*mlp*``, not visual,
    not a MoE router."""
    if not name.endswith(".weight") or tensor.ndim != 2:
        return False
    module = name[: -len(".weight")]
    if module.endswith(ROUTER):
        return False
    included = any(fnmatch.fnmatchcase(module, p) for p in INCLUDE)
    return included and not any(fnmatch.fnmatchcase(module, p) for p in EXCLUDE)


#: the description's global entries msmodelslim 26.1.0's ascendv1 saver writes for W8A8_DYNAMIC
DESCRIPTION_GLOBALS = {
    "version": "1.0.0",
    "model_quant_type": "W8A8_DYNAMIC",
    "metadata": {},
    "group_size": 0,
    "optional": {},
}


def add_w8a8_dynamic(tensors: dict, description: dict, base: str, parts: dict) -> None:
    """One W8A8_DYNAMIC linear ``base``: its codes and companions (``weight``, ``weight_scale``,
    ``weight_offset``), each described as such."""
    for suffix, tensor in parts.items():
        tensors[f"{base}.{suffix}"] = tensor
        description[f"{base}.{suffix}"] = "W8A8_DYNAMIC"


def modelslim_tensors(float_tensors: dict) -> tuple[dict, dict]:
    """(tensors, description) of the W8A8_DYNAMIC export of a float checkpoint's tensors."""
    tensors: dict[str, torch.Tensor] = {}
    description: dict[str, object] = {}
    # msmodelslim writes every routed expert per expert (a dense model has none to split)
    for name, value in per_expert_tensors(float_tensors).items():
        if is_quantized_linear(name, value):
            add_w8a8_dynamic(
                tensors, description, name[: -len(".weight")], quantize_w8a8_dynamic(value)
            )
        else:
            tensors[name] = value
            description[name] = "FLOAT"
    description.update(DESCRIPTION_GLOBALS)
    return tensors, description


def export_modelslim(model: TinyQwen35, float_tensors: dict, folder: str) -> dict:
    """The ModelSlim V1 folder sglang is given on an Ascend server; returns its description."""
    shutil.rmtree(folder, ignore_errors=True)
    tensors, description = modelslim_tensors(float_tensors)
    write_modelslim_checkpoint(folder, tensors, description, shard=SHARD, index=True, indent=4)
    _write_config(folder, model)
    return description
