"""The tiny Qwen3.5-shaped target and its MTP head, built from transformers' Qwen3.5 modules.

Target: transformers' ``Qwen3_5ForCausalLM`` (text model), 4 layers in Qwen3.5's 3:1 layout
(three Gated DeltaNet linear-attention layers, then one gated full-attention layer), q/k
norms, partial rotary, zero-centred RMSNorm, untied lm_head: the shapes and code paths of
Qwen3.5-27B at 1/25 the width.

MTP head: transformers has no Qwen3.5 MTP module (it drops ``mtp.*`` on load), so ``MtpHead``
is assembled from transformers' own ``Qwen3_5RMSNorm``, ``Qwen3_5DecoderLayer`` (a full-
attention layer) and ``Qwen3_5TextRotaryEmbedding``, wired the way sglang's
``Qwen3_5ForCausalLMMTP.forward`` wires its copy (read in sglang 0.5.23)::

    g_t = norm(layer(fc(cat[pre_fc_norm_embedding(embed(x_{t+1})),
                            pre_fc_norm_hidden(h_t)])))        # logits = lm_head(g_t)

where ``h_t`` is the target's last hidden state after its final norm, and ``embed`` /
``lm_head`` are the target's (sglang shares them with the draft). Its parameter names, with
``mtp.`` in front, are exactly the checkpoint names Qwen3.5 releases use, so the same module
is trained, exported, and (with the parameters sglang loaded) run in the simulation.

MoE variant (``TinySpec(num_experts=N, ...)``, the end-to-end MoE fixture): the same model
built from transformers' Qwen3.5-MoE modules (``Qwen3_5MoeForCausalLM``,
``Qwen3_5MoeDecoderLayer``: a top-k softmax router over N routed experts, a shared expert and
its sigmoid gate in every layer, the MTP layer included), as Qwen3.5-35B-A3B is built. A dense
``TinySpec`` (``num_experts=0``) builds exactly what it built before, under the same cache key.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class TinySpec:
    """Every size of the model; part of the training cache key."""

    vocab_size: int = 256
    hidden_size: int = 192
    intermediate_size: int = 512
    layer_types: tuple[str, ...] = (LINEAR, LINEAR, LINEAR, FULL)
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    partial_rotary_factor: float = 0.25
    # sums to head_dim * partial_rotary_factor / 2 rotary frequencies (transformers' default
    # [11, 11, 10] is Qwen3.5-27B's and has the wrong size here)
    mrope_section: tuple[int, int, int] = (4, 2, 2)
    # Qwen3.5-MoE: routed experts per layer (0: the dense model), experts per token, each
    # routed expert's and the shared expert's intermediate size
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 256

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def as_dict(self) -> dict:
        """The sizes (the cache key's part); a dense spec's without the MoE fields, so the
        dense model keeps the key it had before they existed."""
        sizes = asdict(self)
        if not self.is_moe:
            for name in MOE_FIELDS:
                del sizes[name]
        return sizes


MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
#: a MoE layer's parameters that are not nn.Linear weights and need an initial value
MOE_INIT_NORMAL = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight")


def text_config(spec: TinySpec):
    """transformers' ``Qwen3_5TextConfig`` (``Qwen3_5MoeTextConfig`` for a MoE spec) for
    ``spec`` (also what config.json holds)."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    # the dense model's MLP size, or the MoE model's sizes (its config has no dense MLP)
    config_class, mlp = Qwen3_5TextConfig, {"intermediate_size": spec.intermediate_size}
    if spec.is_moe:
        config_class = Qwen3_5MoeTextConfig
        mlp = {name: getattr(spec, name) for name in MOE_FIELDS}
    config = config_class(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        **mlp,
        num_hidden_layers=len(spec.layer_types),
        layer_types=list(spec.layer_types),
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_conv_kernel_dim=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": spec.partial_rotary_factor,
            "mrope_section": list(spec.mrope_section),
            "mrope_interleaved": True,
        },
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        mtp_num_hidden_layers=1,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"
    return config


def is_moe_config(config) -> bool:
    return config.model_type == "qwen3_5_moe_text"


def _building_blocks(config):
    """transformers' (decoder layer, RMSNorm, rotary embedding) classes of ``config``'s model."""
    if is_moe_config(config):
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as moe

        return moe.Qwen3_5MoeDecoderLayer, moe.Qwen3_5MoeRMSNorm, moe.Qwen3_5MoeTextRotaryEmbedding
    from transformers.models.qwen3_5 import modeling_qwen3_5 as dense

    return dense.Qwen3_5DecoderLayer, dense.Qwen3_5RMSNorm, dense.Qwen3_5TextRotaryEmbedding


class MtpHead(nn.Module):
    """Qwen3.5's MTP module (one full-attention layer) from transformers' building blocks."""

    def __init__(self, config) -> None:
        super().__init__()
        Qwen3_5DecoderLayer, Qwen3_5RMSNorm, Qwen3_5TextRotaryEmbedding = _building_blocks(config)
        mtp_config = copy.deepcopy(config)
        mtp_config.num_hidden_layers = 1
        mtp_config.layer_types = [FULL]
        hidden = config.hidden_size
        eps = config.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(mtp_config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        self.rotary_emb = Qwen3_5TextRotaryEmbedding(config=mtp_config)

    def forward(
        self,
        token_embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows ``(embed(x_{t+1}), h_t)`` in, normed MTP states out (B, T, H).

        ``attention_mask`` None means causal over the rows; otherwise a (B, 1, T, T) bool
        mask (True = may attend), used by the simulation to run several draft steps at once.
        """
        x = self.fc(
            torch.cat(
                [self.pre_fc_norm_embedding(token_embeds), self.pre_fc_norm_hidden(hidden)], -1
            )
        )
        batch, rows = x.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(rows).expand(batch, rows)
        position_embeddings = self.rotary_emb(x, position_ids)
        x = self.layers[0](
            x, position_embeddings=position_embeddings, attention_mask=attention_mask
        )
        return self.norm(x)


class TinyQwen35(nn.Module):
    """Target + MTP head, and the joint training loss."""

    def __init__(self, spec: TinySpec) -> None:
        super().__init__()
        from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

        self.spec = spec
        self.config = text_config(spec)
        target_class = Qwen3_5MoeForCausalLM if spec.is_moe else Qwen3_5ForCausalLM
        self.target = target_class(self.config)
        self.mtp = MtpHead(self.config)
        # same initialisation scale for the head as transformers gives the target
        std = self.config.initializer_range
        for module in self.mtp.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
        if spec.is_moe:
            # the routed experts (3-D parameters) and the router are not nn.Linear modules;
            # transformers' own initialisation of the target draws them from the same normal
            for name, parameter in self.mtp.named_parameters():
                if name.endswith(MOE_INIT_NORMAL):
                    nn.init.normal_(parameter, std=std)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.target.model.embed_tokens(tokens)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's last hidden states after its final norm (what sglang hands the MTP)."""
        return self.target.model(input_ids=tokens, use_cache=False).last_hidden_state

    def losses(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token loss of the target and next-next-token loss of the MTP head.

        ``window`` is (B, T+1): the target reads x_0..x_{T-1} and predicts x_1..x_T; MTP row t
        reads (x_{t+1}, h_t) and predicts x_{t+2}, the DeepSeek-V3 / Qwen3.5 MTP objective
        (gradients of both losses reach the shared trunk, embedding and lm_head).
        """
        inputs = window[:, :-1]
        hidden = self.hidden_states(inputs)
        vocab = self.spec.vocab_size
        target_loss = F.cross_entropy(
            self.lm_head(hidden).reshape(-1, vocab), window[:, 1:].reshape(-1)
        )
        mtp_out = self.mtp(self.embed(window[:, 1:-1]), hidden[:, :-1])
        mtp_loss = F.cross_entropy(
            self.lm_head(mtp_out).reshape(-1, vocab), window[:, 2:].reshape(-1)
        )
        return target_loss, mtp_loss
