"""Accept length of a trained tiny Qwen3.5's MTP draft: float vs ModelSlim int8, stock vs plugin.

Usage (``make accept`` runs the first line)::

    .venv/bin/python benchmarks/accept_length.py --plot docs/accept_length.png
    .venv/bin/python benchmarks/accept_length.py --prompts 16 --new-tokens 48   # quicker look

What it does, end to end, on the CPU:

1. trains (or takes from ``.cache/accept/``) a 4-layer Qwen3.5-shaped byte-level model with
   its MTP head on sglang 0.5.23's own source files (``accept/train.py``);
2. writes it as a float bf16 checkpoint and as a ModelSlim W8A8_DYNAMIC checkpoint (MTP
   included) with a writer that is re-proven byte-identical to msmodelslim 26.1.0 on the
   shared fixture in every run (``accept/export.py``, ``accept/writer_proof.py``);
3. loads the MTP draft through sglang's real ``Qwen3_5ForCausalLMMTP`` + its safetensors
   iterator three ways: float checkpoint, quantized checkpoint with stock sglang, quantized
   checkpoint with the plugin (``accept/sglang_load.py``);
4. simulates greedy MTP speculative decoding (num-steps 3, topk 1, 4 draft tokens, the
   target verifying) with those parameters over 48 held-out prompts, plus a figure loops
   cannot inflate: one verification cycle from each of 256 windows of held-out text
   (``accept/speculate.py``).

The target and the draft run transformers 5.19's Qwen3.5 modules in fp32 on the bf16 weights
(the draft: the parameters sglang loaded). Ends with
``accept_length float=<F> plugin=<P> stock=<S>``; exits 1 if the issue's bars are missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

from accept import env  # noqa: E402

env.prepare()

import torch  # noqa: E402
from accept import report, sglang_load, speculate  # noqa: E402
from accept.export import export_modelslim, write_float_checkpoint  # noqa: E402
from accept.model import TinySpec  # noqa: E402
from accept.train import TrainRecipe, train  # noqa: E402
from accept.writer_proof import prove  # noqa: E402
from e2e.checks import ACCEPT_SHARE as PLUGIN_SHARE_BAR  # noqa: E402
from e2e.checks import FLOAT_MIN as FLOAT_BAR  # noqa: E402
from e2e.checks import STOCK_MAX as STOCK_BAR  # noqa: E402
from e2e.corpus import line_start_windows, load_corpus  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=TrainRecipe.steps, help="training steps")
    parser.add_argument("--prompts", type=int, default=48, help="held-out prompts to decode")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--new-tokens", type=int, default=96, help="tokens decoded per prompt")
    parser.add_argument("--windows", type=int, default=256, help="held-out single-cycle windows")
    parser.add_argument("--window-len", type=int, default=128, help="bytes per window")
    parser.add_argument("--cache", default=os.path.join(REPO, ".cache", "accept"))
    parser.add_argument("--plot", default=None, help="write the per-position PNG here")
    parser.add_argument("--json", default=None, help="write every figure as JSON here")
    return parser.parse_args()


def say(message: str) -> None:
    print(message, flush=True)


def load_target(config, float_tensors: dict):
    """transformers' Qwen3_5ForCausalLM with the float checkpoint's bf16 weights, fp32 compute."""
    from transformers import Qwen3_5ForCausalLM

    target = Qwen3_5ForCausalLM(config)
    names = set(target.state_dict())
    state = {k: v.float() for k, v in float_tensors.items() if k in names}
    target.load_state_dict(state, strict=True)
    return speculate.Target(target.float().eval())


def main() -> int:
    args = parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    spec, recipe = TinySpec(), TrainRecipe(steps=args.steps)
    corpus = load_corpus()
    say(
        f"corpus: {corpus.source} (sglang 0.5.23), {corpus.train.numel():,} train bytes, "
        f"{corpus.heldout.numel():,} held-out bytes, sha256 {corpus.sha256[:16]}"
    )
    trained = train(spec, recipe, corpus, args.cache, progress=say)
    say(f"held-out after training: {trained.log['heldout']}")

    proof = prove()
    say(proof.line())
    if not proof.ok:
        say(f"writer differs from msmodelslim on: {proof.mismatches}")
        return 1

    float_dir = os.path.join(trained.folder, "float_bf16")
    quant_dir = os.path.join(trained.folder, "modelslim_w8a8_dynamic")
    float_tensors = write_float_checkpoint(trained.model, float_dir)
    description = export_modelslim(trained.model, float_tensors, quant_dir)
    quantized = sorted(
        n for n, t in description.items() if t == "W8A8_DYNAMIC" and n.endswith(".weight")
    )
    in_mtp = sum(n.startswith("mtp.") for n in quantized)
    say(
        f"checkpoints: {float_dir}\n             {quant_dir} "
        f"({len(quantized)} W8A8_DYNAMIC linears, {in_mtp} of them in the MTP)"
    )

    started = time.perf_counter()
    sglang_load.prepare(float_dir)
    loads = [
        sglang_load.load("float", float_dir, plugin=True),
        sglang_load.load("stock", quant_dir, plugin=False),
        sglang_load.load("plugin", quant_dir, plugin=True),
    ]
    float_stock = sglang_load.load("float (stock)", float_dir, plugin=False)
    config = trained.model.config
    bad = sglang_load.mtp_differences(loads[0], config, float_tensors)
    # lm_head is never loaded into a draft (sglang shares the target's), so it holds
    # uninitialised memory: compare every parameter the checkpoint fills
    same_as_stock = all(
        torch.equal(loads[0].params[n], float_stock.params[n])
        for n in loads[0].params
        if n != "lm_head.weight"
    )
    say(
        f"sglang loads ({time.perf_counter() - started:.1f} s): float draft holds the checkpoint's "
        f"bf16 mtp.* values bit for bit: {not bad}; plugin on the float checkpoint == stock: "
        f"{same_as_stock}"
    )
    for draft in loads:
        qkv = draft.absmax("model.layers.0.qkv_proj.weight")
        down = draft.absmax("model.layers.0.mlp.down_proj.weight")
        note = f" | plugin: {draft.log[0]}" if draft.log else ""
        say(f"  {draft.label:6s} qkv_proj absmax {qkv:8.4f}  down_proj absmax {down:8.4f}{note}")

    started = time.perf_counter()
    target = load_target(config, float_tensors)
    prompts = line_start_windows(corpus.heldout, args.prompts, args.prompt_len)
    run = speculate.target_greedy(target, prompts, args.new_tokens + speculate.NUM_STEPS)
    windows = line_start_windows(corpus.heldout, args.windows, args.window_len)
    distinct = speculate.distinct_ngrams(run)
    say(
        f"target greedy continuations ({time.perf_counter() - started:.1f} s): {args.prompts} "
        f"prompts x {args.new_tokens} tokens, distinct 8-byte n-grams {distinct:.1%}, "
        f"prompts with a non-greedy token in the full pass: {run.inconsistent_prompts}"
    )
    sample = bytes(run.tokens[0, : run.prompt_len + 60].tolist()).decode("utf-8", "replace")
    say(
        "  sample (prompt | continuation): "
        + repr(sample[: args.prompt_len])
        + " | "
        + repr(sample[args.prompt_len :])
    )

    rows = []
    for draft in loads:
        started = time.perf_counter()
        head = sglang_load.to_mtp_head(draft, config)
        decode = speculate.simulate(target, head, run, args.new_tokens)
        heldout = speculate.heldout_cycles(target, head, windows)
        rows.append((draft.label, decode, heldout))
        say(f"  simulated {draft.label} draft ({time.perf_counter() - started:.1f} s)")
        if draft.label == "float":
            p = run.prompt_len
            agree, compared = speculate.cross_check(
                target, head, run, [p + 1, p + 9, p + 30, p + 61]
            )
            say(f"  literal target-verify cycles vs batched simulation: {agree}/{compared} agree")

    say("")
    say(report.table(rows))
    say(
        "pos k: share of verify steps that accepted draft token k (in brackets: given drafts "
        "1..k-1 were accepted). held-out: one cycle from each of "
        f"{args.windows} windows of real held-out text ({args.window_len} bytes)."
    )
    by_label = {label: (decode, heldout) for label, decode, heldout in rows}
    f, s, pl = (by_label[k][0].accept_length for k in ("float", "stock", "plugin"))
    passed = f >= FLOAT_BAR and pl >= PLUGIN_SHARE_BAR * f and s <= STOCK_BAR
    say(
        f"bars: float >= {FLOAT_BAR}: {f >= FLOAT_BAR}; plugin >= {PLUGIN_SHARE_BAR:.0%} of float "
        f"({pl / f:.1%}): {pl >= PLUGIN_SHARE_BAR * f}; stock <= {STOCK_BAR}: {s <= STOCK_BAR}"
    )
    if args.plot:
        report.plot(
            args.plot,
            rows,
            f"Tiny Qwen3.5 MTP draft, greedy, 3 steps / topk 1 ({args.prompts} held-out prompts)",
        )
        say(f"plot: {os.path.relpath(args.plot, REPO)}")
    if args.json:
        report.write_json(
            args.json,
            {
                "train": trained.log,
                "writer_proof": proof.line(),
                "distinct_8grams": distinct,
                "inconsistent_prompts": run.inconsistent_prompts,
                "results": {
                    label: {"decode": report.stats_record(d), "heldout": report.stats_record(h)}
                    for label, d, h in rows
                },
            },
        )
    say(
        f"total {time.perf_counter() - wall:.0f} s wall, {time.process_time() - cpu:.0f} s CPU "
        f"(training {'cached' if trained.cached else 'included'})"
    )
    say(f"accept_length float={f:.3f} plugin={pl:.3f} stock={s:.3f}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
