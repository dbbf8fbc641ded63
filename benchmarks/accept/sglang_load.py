"""Load the MTP draft three ways through sglang 0.5.23's real class, loader and plugin hook.

Each load: sglang's draft ``ModelConfig`` for the folder picks and builds
``Qwen3_5ForCausalLMMTP`` (bf16, CPU), sglang's own ``DefaultModelLoader`` resolves and streams
the folder's weights, and ``load_weights`` runs either hooked (the plugin, installed through
sglang's ``load_plugins()`` from this package's entry point, its completeness audit and guard
included) or unhooked (``__wrapped__``: stock sglang). The loaded parameters are then mapped
back onto ``model.MtpHead`` (q/k/v and gate/up are fused in sglang) so the simulation runs
exactly what sglang loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
import torch

from .model import MtpHead

HOOK_TARGET = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"


@dataclass
class LoadedDraft:
    label: str
    folder: str
    plugin: bool
    params: dict[str, torch.Tensor]  # sglang's parameter names, as loaded (bf16)
    log: list[str]

    def absmax(self, name: str) -> float:
        return float(self.params[name].float().abs().max())


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def prepare(first_folder: str) -> None:
    """Set the process up like sglang's scheduler and load plugins the way sglang does."""
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    prepare_cpu_process(first_folder)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_mtp_dequant.serving.context import registered_targets

    if HOOK_TARGET not in registered_targets():
        raise RuntimeError("sglang's load_plugins() did not run sglang_mtp_dequant's register()")


def load(label: str, folder: str, plugin: bool) -> LoadedDraft:
    """One draft load of ``folder`` (the folder is published as sglang's --model-path)."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights
    from support.cpu_sglang import new_draft

    config, model = new_draft(folder)
    if config.dtype != torch.bfloat16:
        raise RuntimeError(f"{folder}: sglang builds the draft in {config.dtype}, not bfloat16")
    method = type(model).load_weights
    if not plugin:
        method = method.__wrapped__  # sglang's own load_weights, without the hook
    handler = _Collect()
    plugin_logger = logging.getLogger("sglang_mtp_dequant")
    plugin_logger.addHandler(handler)
    previous = plugin_logger.level
    plugin_logger.setLevel(logging.INFO)
    try:
        method(model, sglang_weights(config, model))
    finally:
        plugin_logger.removeHandler(handler)
        plugin_logger.setLevel(previous)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return LoadedDraft(label, folder, plugin, params, handler.lines)


def unfused_state(draft: LoadedDraft, config) -> dict[str, torch.Tensor]:
    """sglang's loaded parameters under ``MtpHead``'s names (q/k/v and gate/up split)."""
    p = draft.params
    q_rows = config.num_attention_heads * config.head_dim * 2  # gated q_proj
    kv_rows = config.num_key_value_heads * config.head_dim
    q, k, v = p["model.layers.0.qkv_proj.weight"].split([q_rows, kv_rows, kv_rows])
    gate, up = p["model.layers.0.mlp.gate_up_proj.weight"].chunk(2)
    layer = "model.layers.0."
    return {
        "fc.weight": p["fc.weight"],
        "pre_fc_norm_embedding.weight": p["pre_fc_norm_embedding.weight"],
        "pre_fc_norm_hidden.weight": p["pre_fc_norm_hidden.weight"],
        "layers.0.self_attn.q_proj.weight": q,
        "layers.0.self_attn.k_proj.weight": k,
        "layers.0.self_attn.v_proj.weight": v,
        "layers.0.self_attn.o_proj.weight": p[layer + "o_proj.weight"],
        "layers.0.self_attn.q_norm.weight": p[layer + "q_norm.weight"],
        "layers.0.self_attn.k_norm.weight": p[layer + "k_norm.weight"],
        "layers.0.mlp.gate_proj.weight": gate,
        "layers.0.mlp.up_proj.weight": up,
        "layers.0.mlp.down_proj.weight": p[layer + "mlp.down_proj.weight"],
        "layers.0.input_layernorm.weight": p[layer + "input_layernorm.weight"],
        "layers.0.post_attention_layernorm.weight": p[layer + "post_attention_layernorm.weight"],
        "norm.weight": p["model.norm.weight"],
    }


def to_mtp_head(draft: LoadedDraft, config, dtype: torch.dtype = torch.float32) -> MtpHead:
    """An ``MtpHead`` holding exactly the parameters sglang loaded, computing in ``dtype``."""
    head = MtpHead(config)
    head.load_state_dict({k: v.to(dtype) for k, v in unfused_state(draft, config).items()})
    return head.to(dtype).eval()


def mtp_differences(draft: LoadedDraft, config, float_tensors: dict) -> list[str]:
    """``mtp.*`` tensors whose loaded value is not the checkpoint's bf16 value, bit for bit."""
    state = unfused_state(draft, config)
    return [
        name
        for name, tensor in float_tensors.items()
        if name.startswith("mtp.") and not torch.equal(state[name[len("mtp.") :]], tensor)
    ]
