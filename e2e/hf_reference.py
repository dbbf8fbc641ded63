"""transformers' own greedy decode of a float checkpoint: the reference no sglang code computes.

Usage::

    ids = greedy_tokens("/models/hybrid_float", prompts, new_tokens=32)   # one list per prompt

For the hybrid family, sglang's Gated DeltaNet layers run its own Triton kernels under the
interpreter with environment fixes (``site/e2e_shim_gdn.py``); the float target's tokens are
checked against transformers' implementation of the same model (its torch Gated DeltaNet),
in float32, one prompt at a time, greedy, EOS ignored (the bundled config has none).
"""

from __future__ import annotations


def greedy_tokens(folder: str, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The ``new_tokens`` greedy continuation of each prompt by transformers."""
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            generated = generate_greedy(model, prompt, new_tokens)
            out.append(generated[0, len(prompt) :].tolist())
    return out


def generate_greedy(model, prompt: list[int], new_tokens: int, **extra):
    """transformers' ``generate`` of exactly ``new_tokens`` greedy tokens after ``prompt``
    (EOS ignored); ``extra`` goes to ``generate`` (e.g. ``output_logits=True``)."""
    import torch

    ids = torch.tensor([prompt])
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        **extra,
    )
