"""The quantized target computed by transformers: a reference of a W8A8_DYNAMIC export that no
sglang code computes.

Usage (``make e2e-quantized-reference`` runs both bundled hybrid exports with ``--serve``)::

    .venv/bin/python -m e2e.quantized_reference --model test/fixtures/e2e/hybrid_qwen36_recipe \\
        --float test/fixtures/e2e/hybrid_float [--serve] [--server-json run.json] [--attribute]

transformers' model class of the float folder (as ``hf_reference.py`` runs it) is built from the
export's config and given the export's tensors: every FLOAT one as stored, and every linear layer
the export's ``quant_model_description.json`` calls W8A8_DYNAMIC replaced by what that scheme
computes: the weight ``(q - offset) * scale`` decoded from the export's codes, the activation
quantized per token to symmetric int8 (``scale = max|x| / 127``, round half to even, CANN's
``npu_dynamic_quant`` formula), their product, all in float32 (the dtype the CPU servers run;
``--dtype float64`` shows how far float rounding alone moves it). It decodes the harness's
prompts greedily (byte ids, EOS ignored, as the servers and ``hf_reference`` do) and sets its
tokens against transformers' float decode, position by position (the harness's
``target_agree``), and against sglang's: ``--server-json`` (a harness ``--json`` of a run on
the export: its ``reference`` and ``float_reference`` tokens) or ``--serve`` (those two servers
started here as the harness starts them, their top log-probabilities returned too).

At every place one quantized decode first leaves the float one it prints, for each decode that
reached it on the float path, the logit of the float's token minus the quantized one's
(sglang's log-probabilities differ by the same amount): a near tie shows as a small number in
every row. ``--attribute`` adds which quantized layers move that difference.

Last line::

    quantized_reference <folder> agree_float=a/n [reference=b/n ...] first_difference=i,j,..
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESCRIPTION = "quant_model_description.json"
W8A8_DYNAMIC = "W8A8_DYNAMIC"
#: the target's layers (the MTP head, ``mtp.*``, is the draft's: not in transformers' class)
TARGET_PREFIX = "model."
INT8_MAX = 127
#: top logits kept per step (the float's and the quantized choice are both among them)
TOP = 5
DTYPES = {"float32": torch.float32, "float64": torch.float64}
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
    path = os.path.join(folder, DESCRIPTION)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as handle:
        description = json.load(handle)
    return sorted(
        key[: -len(".weight")]
        for key, kind in description.items()
        if key.startswith(TARGET_PREFIX) and key.endswith(".weight") and kind == W8A8_DYNAMIC
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

    def gap(self, step: int, a: int, b: int) -> float | None:
        """Logit of ``a`` minus logit of ``b`` at ``step`` (None: one is not in the top)."""
        top = self.top[step]
        return top[a] - top[b] if a in top and b in top else None


def greedy(model: nn.Module, prompts: list[list[int]], new_tokens: int) -> list[Decode]:
    """``new_tokens`` greedy tokens of each prompt (one at a time, EOS ignored), with logits."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            top = []
            for logits in generated.logits:
                values, indices = logits[0].double().topk(TOP)
                top.append({int(i): float(v) for i, v in zip(indices, values, strict=True)})
            out.append(Decode(generated.sequences[0, len(prompt) :].tolist(), top))
    return out


def served(model: str, label: str, prompts, new_tokens: int, log_dir: str) -> list[Decode]:
    """sglang's greedy decode of ``prompts`` by the harness's ``label`` server (``reference``:
    ``model`` with ``--quantization modelslim``, plugin on; ``float_reference``: a float
    folder), with sglang's top log-probabilities of each step."""
    from e2e.client import generate
    from e2e.plan import MODELSLIM
    from e2e.server import Server, ServerRun

    quantization = MODELSLIM if label == "reference" else None
    run = ServerRun(label, model, speculative=False, plugin=True, quantization=quantization)
    out = []
    with Server(run, log_dir) as server:
        print(f"sglang {label} server up in {server.started_seconds:.0f} s", flush=True)
        for prompt in prompts:
            answer = generate(server.url, prompt, new_tokens, top_logprobs=TOP)
            steps = answer.meta["output_top_logprobs"]
            top = [{int(i): float(v) for v, i, *_ in step} for step in steps]
            out.append(Decode(answer.output_ids, top))
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


def tie_rows(decodes: dict[str, list[Decode]], prompt: int, step: int, a: int, b: int):
    """Each decode's logit(a) - logit(b) at ``step`` of ``prompt``, if it got there on the float
    path (the first decode's)."""
    path = decodes["transformers float"][prompt].tokens[:step]
    rows = []
    for who, runs in decodes.items():
        decode = runs[prompt]
        if decode.tokens[:step] != path:
            rows.append(f"    {who}: left the float path earlier")
        elif not decode.top:
            rows.append(f"    {who}: chose {show(decode.tokens[step])} (no logits recorded)")
        else:
            gap = decode.gap(step, a, b)
            said = "not both in its top 5" if gap is None else f"{gap:+.4f}"
            rows.append(f"    {who}: chose {show(decode.tokens[step])}, gap {said}")
    return rows


def attribute(model: str, float_folder: str, context: list[int], a: int, b: int) -> list[str]:
    """logit(a) - logit(b) after ``context`` (one forward) with every layer float, every
    described layer quantized, each quantized alone, and all but each."""
    layers = quantized_linears(model)

    def gap(quantized: list[str]) -> float:
        with torch.no_grad():
            logits = build(model, quantized, float_folder)(torch.tensor([context])).logits[0, -1]
        return float(logits[a] - logits[b])

    lines = [f"    none quantized {gap([]):+.4f}, all {len(layers)} {gap(layers):+.4f}"]
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
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts (as the harness)")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--attribute", action="store_true", help="which layers move each tie")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, REPO)
    from benchmarks.machine import describe

    from e2e.inputs import heldout_prompts

    print(describe(), flush=True)
    prompts = heldout_prompts(args.prompts, args.prompt_len)
    model, float_folder = os.path.abspath(args.model), os.path.abspath(args.float)
    dtype = DTYPES[args.dtype]
    name = os.path.basename(model)
    decodes = {
        "transformers float": greedy(build(float_folder, dtype=dtype), prompts, args.new_tokens),
        "transformers quantized": greedy(build(model, dtype=dtype), prompts, args.new_tokens),
    }
    print(f"{name}: {len(quantized_linears(model))} target linear layers W8A8_DYNAMIC, {dtype}")
    for label, kind in (("float_reference", "float"), ("reference", "quantized")):
        if args.serve:
            folder = model if label == "reference" else float_folder
            runs = served(folder, label, prompts, args.new_tokens, args.log_dir)
        elif args.server_json:
            runs = server_json_decodes(args.server_json, label)
        else:
            continue
        decodes[f"sglang {kind}"] = runs
    floating = decodes["transformers float"]
    summary = f"quantized_reference {name} {args.dtype}"
    for who, base, key in COMPARISONS:
        if who in decodes and base in decodes:
            equal, total, first = agreement(decodes[base], decodes[who])
            print(f"{who} vs {base}: {equal}/{total} equal, first difference per prompt {first}")
            summary += f" {key}={equal}/{total}"
    points = set()
    for who in decodes:
        if "quantized" in who:
            _, _, first = agreement(floating, decodes[who])
            points |= {(p, t) for p, t in enumerate(first) if t < len(floating[p].tokens)}
    for p, t in sorted(points):
        a = floating[p].tokens[t]
        others = {
            d[p].tokens[t] for d in decodes.values() if d[p].tokens[:t] == floating[p].tokens[:t]
        }
        for b in sorted(others - {a}):
            print(f"prompt {p} token {t}: logit {show(a)} (float's) minus {show(b)}:")
            for row in tie_rows(decodes, p, t, a, b):
                print(row)
            if args.attribute:
                context = prompts[p] + floating[p].tokens[:t]
                for line in attribute(model, float_folder, context, a, b):
                    print(line)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
