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

Then the write record (``guard.WriteRecorder``, what the guard's completeness audit reads) on
sglang's real DeepSeek-V3 NextN draft class with DeepSeek-V3's 256 routed experts (the tests'
tiny dimensions: the record's cost is per name and per loader call, not per byte): the class's
own ``load_weights`` on a float checkpoint of its layer, with and without the record (told each
draft name as the plugin's stream tells it, following the stream as the hook does). DeepSeek's
loader writes from its thread pool; CPU seconds of the process (every thread), the median of
``REPEATS`` alternated pairs of loads and of their differences.

On a GPU the guard runs where the parameters are; this measures the CPU only.
"""

from __future__ import annotations

import gc
import statistics
import time

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
import torch
from machine import describe

from sglang_mtp_dequant.serving.guard import WriteRecorder, inspect_parameters
from support.paths import fixture_dir
from support.shapes import HEAD_DIM, HIDDEN, QWEN35_27B_MTP

#: DeepSeek-V3's routed experts, for the write record's case
EXPERTS = 256
REPEATS = 20
#: the hidden size of the tests' NextN config (``support.draft_cases.nextn_config``)
HIDDEN_NEXTN = 64

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
    record = time_write_record()
    print(describe())
    print(f"{'case':<28}{'parameters':>12}{'guard s':>10}{'abs().amax() s':>16}{'flagged':>9}")
    for label, elements, guard, one_pass, flagged in results:
        print(f"{label:<28}{elements:>12,}{guard:>10.3f}{one_pass:>16.3f}{flagged:>9}")
    print(record)


def nextn_draft() -> tuple[torch.nn.Module, list[tuple[str, torch.Tensor]]]:
    """sglang's DeepSeek-V3 NextN draft built on the CPU with ``EXPERTS`` routed experts, and a
    float checkpoint of its layer in the tests' NextN naming (``support.draft_cases``), every
    expert a copy of the tests' first."""
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process
    from support.cpu_sglang import build_draft_class
    from support.draft_cases import CASES, nextn_checkpoint, nextn_config

    prepare_cpu_process(fixture_dir("q35_dense_w8a8_dynamic"))
    config = nextn_config("deepseek")
    config.n_routed_experts = EXPERTS
    model = build_draft_class(CASES["deepseek_v3"].class_path, config)
    layer = nextn_checkpoint(2, mla=True)
    weights = {
        name: (tensor.float() * 0.01).bfloat16() if not tensor.is_floating_point() else tensor
        for name, tensor in layer.tensors.items()
        if name.endswith(("weight", "bias")) and layer.desc.get(name) is not None
    }
    mlp = "model.layers.2.mlp"
    for e in range(EXPERTS):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            weights[f"{mlp}.experts.{e}.{proj}.weight"] = weights[
                f"{mlp}.experts.0.{proj}.weight"
            ].clone()  # one tensor per name, as sglang's file iterator hands them
    weights[f"{mlp}.gate.weight"] = torch.zeros(EXPERTS, HIDDEN_NEXTN)
    weights[f"{mlp}.gate.e_score_correction_bias"] = torch.zeros(EXPERTS)
    return model, sorted(weights.items())


def time_write_record() -> str:
    """The write record's cost on one real draft load, as a line of the table."""
    from sglang_mtp_dequant.serving.drafts import spec_for_class
    from sglang_mtp_dequant.serving.sglang_private import unwrapped

    model, weights = nextn_draft()
    spec = spec_for_class(type(model))
    assert spec is not None
    is_draft = spec.draft_names(model)
    load_weights = unwrapped(type(model).load_weights)  # sglang's own, the hook bypassed
    stock, recorded, differences = [], [], []
    for _ in range(REPEATS):
        started = time.process_time()  # CPU seconds, of every thread: the pool's too
        load_weights(model, iter(weights))
        stock.append(time.process_time() - started)
        started = time.process_time()
        with WriteRecorder(model, spec.from_target) as writes:
            load_weights(model, writes.follow(_observed(weights, is_draft, writes)))
        recorded.append(time.process_time() - started)
        differences.append(recorded[-1] - stock[-1])
        assert writes.unwritten() == {} and writes.skipped_names() == []
    calls = sum(len(parts) for parts in writes.written.values())
    names = sum(1 for name, _ in weights if is_draft(name))
    return (
        f"write record, DeepSeek-V3 NextN with {EXPERTS} experts ({names} draft names, "
        f"{len(writes.params)} parameters, {calls} parts written): load_weights "
        f"{statistics.median(stock):.3f} CPU s, recorded {statistics.median(recorded):.3f} CPU s, "
        f"the record {statistics.median(differences) * 1e3:.1f} CPU ms (medians of {REPEATS} pairs)"
    )


def _observed(weights, is_draft, writes):
    """The stream, telling the record each draft name it hands sglang, as the plugin's does."""
    for name, tensor in weights:
        if is_draft(name):
            writes.on_streamed(name, tensor)
        yield name, tensor


if __name__ == "__main__":
    main()
