"""What the misload guard costs on a Qwen3.5-27B-sized MTP draft, on this CPU.

Usage::

    .venv/bin/python benchmarks/bench_guard.py            # prints a table of seconds

The tensors have the exact shapes sglang 0.5.23 builds for the Qwen3.5-27B MTP draft
(``Qwen3_5ForCausalLMMTP`` on the meta device: fc, qkv_proj, o_proj, gate_up_proj, down_proj
and the norms; 425 M parameters, the embedding and lm_head excluded because the guard skips
them). Three cases, each timed with the value checks the guard runs on every written float
parameter (``guard.inspect_parameters``: the integer, fp4 and float8 grids, NaN rows):

- a float draft (bf16 ``normal(0, 0.02)``): what every healthy start-up pays;
- the same draft with the five projections holding int8 codes: the refusal path;
- for scale, one plain pass over the same parameters (``abs().amax()`` on each).

On a GPU the guard runs where the parameters are; this measures the CPU only.
"""

from __future__ import annotations

import gc
import time

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
import torch
from machine import describe

from sglang_mtp_dequant.serving.guard import inspect_parameters
from support.shapes import HEAD_DIM, HIDDEN, QWEN35_27B_MTP

_MTP = {name.split(".")[-2]: shape for name, shape in QWEN35_27B_MTP.items()}

# (name, shape) of every parameter the guard inspects in sglang's Qwen3.5-27B MTP draft
QWEN35_27B_DRAFT = [
    ("fc.weight", (HIDDEN, 2 * HIDDEN)),
    ("pre_fc_norm_embedding.weight", (HIDDEN,)),
    ("pre_fc_norm_hidden.weight", (HIDDEN,)),
    # sglang fuses q, k, v and gate, up into one parameter each
    (
        "model.layers.0.qkv_proj.weight",
        (sum(_MTP[p][0] for p in ("q_proj", "k_proj", "v_proj")), HIDDEN),
    ),
    ("model.layers.0.o_proj.weight", _MTP["o_proj"]),
    ("model.layers.0.mlp.gate_up_proj.weight", (_MTP["gate_proj"][0] + _MTP["up_proj"][0], HIDDEN)),
    ("model.layers.0.mlp.down_proj.weight", _MTP["down_proj"]),
    ("model.layers.0.input_layernorm.weight", (HIDDEN,)),
    ("model.layers.0.post_attention_layernorm.weight", (HIDDEN,)),
    ("model.layers.0.q_norm.weight", (HEAD_DIM,)),
    ("model.layers.0.k_norm.weight", (HEAD_DIM,)),
    ("model.norm.weight", (HIDDEN,)),
]
PROJECTIONS = {n for n, s in QWEN35_27B_DRAFT if len(s) == 2}


def build(codes: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = {}
    for name, shape in QWEN35_27B_DRAFT:
        if len(shape) == 1:
            params[name] = torch.zeros(shape, dtype=torch.bfloat16)  # Gemma norms start at 0
        elif codes:
            params[name] = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8).to(
                torch.bfloat16
            )
        else:
            params[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    return params


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    torch.set_num_threads(torch.get_num_threads())
    results = []
    for label, codes in (("float draft", False), ("int8 codes in projections", True)):
        params = build(codes)
        elements = sum(p.numel() for p in params.values())
        found = [f.parameter for f in inspect_parameters(params)]
        assert set(found) == (PROJECTIONS if codes else set()), found
        guard = timed(lambda params=params: inspect_parameters(params))
        one_pass = timed(lambda params=params: [p.abs().amax() for p in params.values()])
        results.append((label, elements, guard, one_pass, len(found)))
        del params
        gc.collect()
    print(describe())
    print(f"{'case':<28}{'parameters':>12}{'guard s':>10}{'abs().amax() s':>16}{'flagged':>9}")
    for label, elements, guard, one_pass, flagged in results:
        print(f"{label:<28}{elements:>12,}{guard:>10.3f}{one_pass:>16.3f}{flagged:>9}")


if __name__ == "__main__":
    main()
