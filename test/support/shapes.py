"""Qwen3.5-27B's text dimensions and its MTP layer's projection shapes.

The benchmarks that size their tensors like the real model (``bench_dequant``,
``bench_per_rank``, ``bench_doctor``, ``bench_guard``) read them here, so the one table is
checked against the model's ``text_config`` once.
"""

from __future__ import annotations

#: Qwen3.5-27B ``text_config``: hidden size, MLP width, vocabulary, attention heads
HIDDEN, INTERMEDIATE, VOCAB = 5120, 17408, 248320
HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256

#: checkpoint name -> (out, in) of the MTP layer's quantized projections; q_proj is gated
#: (query and gate rows), so it is twice the heads
QWEN35_27B_MTP = {
    "mtp.layers.0.self_attn.q_proj.weight": (2 * HEADS * HEAD_DIM, HIDDEN),
    "mtp.layers.0.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "mtp.layers.0.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "mtp.layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    "mtp.layers.0.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "mtp.layers.0.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    "mtp.layers.0.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
}
