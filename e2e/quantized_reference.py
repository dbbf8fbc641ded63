"""The quantized target computed by transformers: a reference of a W8A8_DYNAMIC export that no
sglang code computes, set against the float decode and sglang's own targets.

Usage (``make e2e-quantized-reference`` runs both bundled hybrid exports with ``--serve``)::

    .venv/bin/python -m e2e.quantized_reference --model test/fixtures/e2e/hybrid_qwen36_recipe \
        --float test/fixtures/e2e/hybrid_float [--serve | --server-json run.json] [--attribute]

transformers' model class of the float folder (as ``hf_reference.py`` runs it) is built from the
export's config and given the export's tensors: every FLOAT one as stored, and every linear layer
the export's ``quant_model_description.json`` calls W8A8_DYNAMIC replaced by what that scheme
computes: the weight ``(q - offset) * scale`` decoded from the export's codes, the activation
quantized per token to symmetric int8 (``scale = max|x| / 127``, round half to even, CANN's
``npu_dynamic_quant`` formula), their product, all in float32 (the dtype the CPU servers run).
It decodes the harness's prompts greedily (byte ids, EOS ignored, as the servers and
``hf_reference`` do) and sets its tokens against transformers' float decode, position by
position (the harness's ``target_agree``), and against sglang's: ``--server-json`` (a harness
``--json`` of a run on the export: its ``reference`` and ``float_reference`` tokens) or
``--serve`` (those two servers started here as the harness starts them, sglang's top
log-probabilities of every step returned too).

Where a quantized decode first leaves the float path it prints, for each decode that reached
that step on the float path, the logit of the float's token minus the other's (sglang's
log-probabilities differ by the same amount), and each model's after the same context computed
in one forward (a prefill; with ``--serve`` sglang's too): a near tie shows as a small number in
every row. How far float rounding alone moves these gaps: the same two models decoded in
float64, their per-step gaps against float32's (and, with ``--serve``, sglang's against
transformers'). ``--attribute`` adds which quantized layers move each tie.

Last line::

    quantized_reference <folder> agree_float=a/n [sglang_agree_float=b/n equal_to_sglang=c/n ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field

import torch
from safetensors import safe_open
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W8A8_DYNAMIC = "W8A8_DYNAMIC"
#: the target's layers (the MTP head, ``mtp.*``, is the draft's: not in transformers' class)
TARGET_PREFIX = "model."
INT8_MAX = 127
#: top logits kept per step (the float's and the quantized choice are both among them)
TOP = 5
#: the decodes set against each other (when both ran), and their key in the last line
COMPARISONS = (
    ("transformers quantized", "transformers float", "agree_float"),
    ("sglang float", "transformers float", "sglang_float"),
    ("sglang quantized", "transformers float", "sglang_agree_float"),
    ("transformers quantized", "sglang quantized", "equal_to_sglang"),
)


def quantized_linears(folder: str) -> list[str]:
    """The target's linear layers the export's description calls W8A8_DYNAMIC, by module name
    (none for a float folder)."""
    from sglang_mtp_dequant.formats.description import WEIGHT, read_description

    return sorted(
        key[: -len(WEIGHT)]
        for key, kind in read_description(folder).entries.items()
        if key.startswith(TARGET_PREFIX) and key.endswith(WEIGHT) and kind == W8A8_DYNAMIC
    )


def folder_tensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, as stored."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensors[key] = handle.get_tensor(key)
    return tensors


def per_token_int8(x: torch.Tensor) -> torch.Tensor:
    """``x`` after symmetric per-token int8 quantization, decoded: ``round(x / s) * s`` with
    ``s = max|x| / 127`` over the last dimension (an all-zero row stays zero)."""
    scale = x.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp(-INT8_MAX - 1, INT8_MAX) * scale


class W8A8DynamicLinear(nn.Module):
    """What a W8A8_DYNAMIC linear layer computes: per-token int8 activations times the decoded
    int8 weight (the integer product times both scales, here up to float rounding)."""

    def __init__(self, codes, scale, offset, dtype: torch.dtype = torch.float32):
        super().__init__()
        weight = (codes.to(torch.float32) - offset.to(torch.float32)) * scale.to(torch.float32)
        self.register_buffer("weight", weight.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return per_token_int8(x.to(self.weight.dtype)) @ self.weight.T


def build(
    folder: str,
    quantized: list[str] | None = None,
    float_folder: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """transformers' model of ``folder`` (an export, or a float checkpoint) in ``dtype``, each
    layer of ``quantized`` (default: every W8A8_DYNAMIC layer the export describes) computing as
    W8A8_DYNAMIC; a described layer left out takes ``float_folder``'s float weight. Every
    parameter is set from a file (a missing one raises): none keeps its initial value."""
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    model.eval()
    tensors, described = folder_tensors(folder), quantized_linears(folder)
    quantized = described if quantized is None else quantized
    if set(quantized) - set(described):
        raise ValueError(f"{sorted(set(quantized) - set(described))} are not W8A8_DYNAMIC")
    floats = folder_tensors(float_folder) if float_folder else {}
    state = {}
    for name in described:
        if name in quantized:
            parts = (tensors[f"{name}.{p}"] for p in ("weight", "weight_scale", "weight_offset"))
            if getattr(model.get_submodule(name), "bias", None) is not None:
                raise ValueError(f"{name} has a bias, which W8A8DynamicLinear does not add")
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, W8A8DynamicLinear(*parts, dtype=dtype))
        else:
            state[f"{name}.weight"] = floats[f"{name}.weight"]
    names = model.state_dict()
    for key, value in tensors.items():
        if key in names and key.rsplit(".", 1)[0] not in described:
            state[key] = value
    missing = sorted(k for k in names if k not in state and k.rsplit(".", 1)[0] not in quantized)
    if missing:
        raise ValueError(f"{folder}: no tensor for {missing}")
    model.load_state_dict(state, strict=False)
    return model


@dataclass
class Decode:
    """One prompt's greedy continuation and, at each step, the top logits (id -> value)."""

    tokens: list[int]
    top: list[dict[int, float]]


def greedy(model: nn.Module, prompts: list[list[int]], new_tokens: int) -> list[Decode]:
    """``new_tokens`` greedy tokens of each prompt (one at a time, EOS ignored), with logits."""
    from e2e.hf_reference import generate_greedy

    out = []
    with torch.no_grad():
        for prompt in prompts:
            generated = generate_greedy(
                model, prompt, new_tokens, output_logits=True, return_dict_in_generate=True
            )
            top = []
            for logits in generated.logits:
                values, indices = logits[0].double().topk(TOP)
                top.append({int(i): float(v) for i, v in zip(indices, values, strict=True)})
            out.append(Decode(generated.sequences[0, len(prompt) :].tolist(), top))
    return out


def top_of(step: list) -> dict[int, float]:
    """sglang's ``[logprob, token id, text]`` entries of one step as token id -> logprob."""
    return {int(i): float(v) for v, i, *_ in step}


def served(
    model: str, label: str, prompts, new_tokens: int, log_dir: str, probes: Probes
) -> list[Decode]:
    """sglang's greedy decode of ``prompts`` by the harness's ``label`` server (``reference``:
    ``model`` with ``--quantization modelslim``, plugin on; ``float_reference``: a float
    folder), with sglang's top log-probabilities of each step; then each of ``probes``' contexts
    and those where this decode first leaves the float path, as one prefill (one new token)."""
    from e2e.client import generate
    from e2e.plan import MODELSLIM
    from e2e.server import Server, ServerRun

    quantization = MODELSLIM if label == "reference" else None
    run = ServerRun(label, model, speculative=False, plugin=True, quantization=quantization)
    out = []
    who = f"sglang {'quantized' if quantization else 'float'}"
    with Server(run, log_dir) as server:
        print(f"sglang {label} server up in {server.started_seconds:.0f} s", flush=True)
        for prompt in prompts:
            answer = generate(server.url, prompt, new_tokens, top_logprobs=TOP)
            out.append(
                Decode(answer.output_ids, [top_of(s) for s in answer.meta["output_top_logprobs"]])
            )
        probes.add_differences(out)
        for point, context in probes.contexts.items():
            answer = generate(server.url, context, 1, top_logprobs=TOP)
            probes.tops.setdefault(point, {})[who] = top_of(answer.meta["output_top_logprobs"][0])
    return out


@dataclass
class Probes:
    """The places where a quantized decode first leaves the float path (prompt, step), each
    context on the float path up to there, and each model's top logits after that context
    computed in ONE forward (a prefill) rather than step by step."""

    prompts: list[list[int]]
    float_path: list[list[int]]
    contexts: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    tops: dict[tuple[int, int], dict[str, dict[int, float]]] = field(default_factory=dict)

    def add_differences(self, decodes: list[Decode]) -> None:
        from e2e.checks import first_difference

        for p, decode in enumerate(decodes):
            t = first_difference(self.float_path[p], decode.tokens)
            if t < len(self.float_path[p]):
                self.contexts[(p, t)] = self.prompts[p] + self.float_path[p][:t]

    def forward(self, who: str, model: nn.Module) -> None:
        with torch.no_grad():
            for point, context in self.contexts.items():
                logits = model(torch.tensor([context])).logits[0, -1].double()
                values, indices = logits.topk(TOP)
                top = {int(i): float(v) for i, v in zip(indices, values, strict=True)}
                self.tops.setdefault(point, {})[who] = top


def discrepancy(a: list[Decode], b: list[Decode]) -> list[float]:
    """At each step both decodes reached on the same path: the largest difference between
    their logit gaps (each top token's logit minus the first decode's choice's; sglang's
    log-probabilities give the same gaps), over the tokens in both tops."""
    out = []
    for x, y in zip(a, b, strict=True):
        for t, (tx, ty) in enumerate(zip(x.top, y.top, strict=True)):
            if x.tokens[:t] != y.tokens[:t]:
                break
            chosen = x.tokens[t]
            common = [k for k in tx if k in ty]
            if chosen in ty:
                out.append(max(abs((tx[k] - tx[chosen]) - (ty[k] - ty[chosen])) for k in common))
    return out


def server_json_decodes(path: str, label: str) -> list[Decode]:
    """The tokens a harness run (its ``--json``) recorded for ``label`` (no logits)."""
    with open(path, encoding="utf-8") as handle:
        runs = {r["label"]: r for r in json.load(handle)["runs"]}
    return [Decode(r["output_ids"], []) for r in runs[label]["requests"]]


def agreement(want: list[Decode], got: list[Decode]) -> tuple[int, int, list[int]]:
    """Tokens equal position by position, their number, and each prompt's first difference
    (the harness's ``target_agree``)."""
    from e2e.checks import first_difference

    pairs = [(w.tokens, g.tokens) for w, g in zip(want, got, strict=True)]
    equal = sum(a == b for w, g in pairs for a, b in zip(w, g, strict=True))
    first = [first_difference(w, g) for w, g in pairs]
    return equal, sum(len(w) for w, _ in pairs), first


def show(token: int) -> str:
    return repr(chr(token)) if token < 128 else str(token)


def tie_rows(decodes: dict[str, list[Decode]], probes: Probes, point, a: int, b: int):
    """Each decode's logit(a) - logit(b) at ``point`` (prompt, step), if it got there on the
    float path, and each model's after the same context in one forward."""
    prompt, step = point
    rows = []
    for who, runs in decodes.items():
        decode = runs[prompt]
        if decode.tokens[:step] != probes.float_path[prompt][:step]:
            rows.append(f"    {who}: left the float path earlier")
        elif not decode.top:
            rows.append(f"    {who}: chose {show(decode.tokens[step])} (no logits recorded)")
        else:
            rows.append(
                f"    {who}: chose {show(decode.tokens[step])}, {gap_of(decode.top[step], a, b)}"
            )
    for who, top in probes.tops.get(point, {}).items():
        rows.append(f"    {who}, the context in one forward: {gap_of(top, a, b)}")
    return rows


def gap_of(top: dict[int, float], a: int, b: int) -> str:
    return f"gap {top[a] - top[b]:+.4f}" if a in top and b in top else f"not both in its top {TOP}"


def attribute(model: str, float_folder: str, context: list[int], a: int, b: int) -> list[str]:
    """logit(a) - logit(b) after ``context`` (one forward) with every layer float, every
    described layer quantized, all but each kind (``linear_attn``, ``in_proj_z``, ...), each
    quantized alone, and all but each."""
    layers = quantized_linears(model)

    def gap(quantized: list[str]) -> float:
        with torch.no_grad():
            logits = build(model, quantized, float_folder)(torch.tensor([context])).logits[0, -1]
        return float(logits[a] - logits[b])

    lines = [f"    none quantized {gap([]):+.4f}, all {len(layers)} {gap(layers):+.4f}"]
    groups = sorted({part for layer in layers for part in layer.split(".")[-2:]})
    for group in groups:  # e.g. every linear_attn layer, every in_proj_z
        kept = [x for x in layers if group not in x.split(".")[-2:]]
        lines.append(f"    all but every *{group}* ({len(layers) - len(kept)}): {gap(kept):+.4f}")
    for layer in layers:
        alone, without = gap([layer]), gap([x for x in layers if x != layer])
        lines.append(f"    {layer}: alone {alone:+.4f}, all but it {without:+.4f}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True, help="the ModelSlim export (W8A8_DYNAMIC)")
    parser.add_argument("--float", required=True, help="its float folder")
    parser.add_argument("--server-json", default=None, help="a harness --json of a run on it")
    parser.add_argument("--serve", action="store_true", help="start sglang's two targets here")
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".cache", "e2e", "qref"))
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts (as the harness)")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--attribute", action="store_true", help="which layers move each tie")
    parser.add_argument("--json", default=None, help="write every decode's tokens and logits")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, REPO)
    from e2e.inputs import heldout_prompts
    from e2e.machine import describe

    print(describe(), flush=True)
    prompts = heldout_prompts(args.prompts, args.prompt_len)
    model, float_folder = os.path.abspath(args.model), os.path.abspath(args.float)
    name = os.path.basename(model)
    models = {
        "transformers float": build(float_folder),
        "transformers quantized": build(model),
    }
    decodes = {who: greedy(m, prompts, args.new_tokens) for who, m in models.items()}
    print(f"{name}: {len(quantized_linears(model))} target linear layers W8A8_DYNAMIC")
    floating = decodes["transformers float"]
    probes = Probes(prompts, [d.tokens for d in floating])
    probes.add_differences(decodes["transformers quantized"])
    for label, kind in (("reference", "quantized"), ("float_reference", "float")):
        if args.serve:
            folder = model if label == "reference" else float_folder
            runs = served(folder, label, prompts, args.new_tokens, args.log_dir, probes)
        elif args.server_json:
            runs = server_json_decodes(args.server_json, label)
            probes.add_differences(runs)
        else:
            continue
        decodes[f"sglang {kind}"] = runs
    for who, m in models.items():
        probes.forward(who, m)
    summary = f"quantized_reference {name}"
    for who, base, key in COMPARISONS:
        if who in decodes and base in decodes:
            equal, total, first = agreement(decodes[base], decodes[who])
            print(f"{who} vs {base}: {equal}/{total} equal, first difference per prompt {first}")
            summary += f" {key}={equal}/{total}"
    for kind in ("float", "quantized"):
        # float rounding alone: the same model in float64, against sglang's float32
        control = greedy(
            build(float_folder if kind == "float" else model, dtype=torch.float64),
            prompts,
            args.new_tokens,
        )
        for who, other in (
            ("transformers float64", control),
            ("sglang", decodes.get(f"sglang {kind}")),
        ):
            if other is None or not other[0].top:
                continue
            gaps = discrepancy(decodes[f"transformers {kind}"], other)
            print(
                f"{kind}: transformers' (float32) and {who}'s logit gaps at the {len(gaps)} "
                f"steps both decoded on one path differ by at most {max(gaps):.4f} (median "
                f"{statistics.median(gaps):.4f})"
            )
            summary += f" {kind}_vs_{who.split()[-1]}_max={max(gaps):.4f}"
    for point, context in sorted(probes.contexts.items()):
        p, t = point
        a = floating[p].tokens[t]
        others = {
            d[p].tokens[t] for d in decodes.values() if d[p].tokens[:t] == probes.float_path[p][:t]
        }
        others |= {max(top, key=top.get) for top in probes.tops.get(point, {}).values()}
        for b in sorted(others - {a}):
            print(f"prompt {p} token {t}: logit {show(a)} (float's) minus {show(b)}:")
            for row in tie_rows(decodes, probes, point, a, b):
                print(row)
            if args.attribute:
                for line in attribute(model, float_folder, context, a, b):
                    print(line)
    if args.json:
        write_json(args.json, decodes, probes)
    print(summary)
    return 0


def write_json(path: str, decodes: dict[str, list[Decode]], probes: Probes) -> None:
    """Every decode's tokens and top logits, and each probe's, for a later look."""
    figures = {
        "decodes": {
            who: [{"tokens": d.tokens, "top": [list(s.items()) for s in d.top]} for d in runs]
            for who, runs in decodes.items()
        },
        "probes": [
            {"point": list(point), "tops": {who: list(top.items()) for who, top in tops.items()}}
            for point, tops in probes.tops.items()
        ],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(figures, handle)


if __name__ == "__main__":
    sys.exit(main())
