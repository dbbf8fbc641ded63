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

    def as_dict(self) -> dict:
        return asdict(self)


def text_config(spec: TinySpec):
    """transformers' ``Qwen3_5TextConfig`` for ``spec`` (also what config.json holds)."""
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
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


class MtpHead(nn.Module):
    """Qwen3.5's MTP module (one full-attention layer) from transformers' building blocks."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

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
        from transformers import Qwen3_5ForCausalLM

        self.spec = spec
        self.config = text_config(spec)
        self.target = Qwen3_5ForCausalLM(self.config)
        self.mtp = MtpHead(self.config)
        # same initialisation scale for the head as transformers gives the target
        std = self.config.initializer_range
        for module in self.mtp.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)

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
