"""Peak bytes PR 1's decoding stream holds while a full-size MTP layer streams through it.

Usage (after ``make upstream-tree``)::

    .venv/bin/python benchmarks/bench_pr1_stream_memory.py [--tree .cache/upstream/sglang]

PR 1's ``_dequantize_modelslim_mtp`` (private to the tree's ``models/qwen3_5_mtp.py``; its
module-level code executed alone by ``upstream/tree.py``'s ``pr1_decoder``) is fed
the ``mtp.*`` tensors of two W8A8_DYNAMIC MTP layers with the real tensor names, dtypes and
shapes of their configs: Qwen3.5-27B (hidden 5120, 24/4 heads of 256 with the output gate,
MLP 17408; the export Eco-Tech publishes quantizes exactly these seven projections) and
Qwen3.5-397B-A17B (hidden 4096, 32/2 heads of 256, 512 routed experts and one shared expert
of 1024; msmodelslim's shipped MoE recipes export this layer FLOAT, so this is the layer a
recipe without the ``mtp*`` exclude would write).

The tensors are meta tensors: what the stream holds is decided by names, shapes and order,
not values, and the decode runs on them shape for shape. "Held" is measured from outside:
the bytes the helper has pulled from the source and not yet given back (a pass-through
tensor, or the decoded weight of a module whose weight, weight_scale and weight_offset it
consumed), taken each time it asks the source for the next tensor: what it holds back across
pulls, beyond the one tensor in flight that any loader holds. Its peak, per order:

- ``write``: msmodelslim's writer order (module by module: weight, weight_scale,
  weight_offset; ``save/ascendv1.py``);
- ``sorted``: one shard read in name order, as safetensors lists a file's tensors;
- ``sharded``: the writer order cut into msmodelslim's default 4 GiB parts, each read in
  name order, with the MTP layer starting at 64 offsets within a part (cuts inside modules);
- ``adversarial`` (no msmodelslim order): every weight before any companion.

Also printed: the bytes of the layer's integer tensors and companions (what the previous
revision held until the stream ended) and the largest single decode's fp32 + bf16 transient
(computed from its shape). Ends with one line per layer:
``pr1-stream <layer> peak_held_bytes <write> <sorted> <sharded> <adversarial> all <bytes>``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from machine import describe

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "upstream"))
import tree  # noqa: E402 - upstream/tree.py, the branch's own tooling

PART_BYTES = 4 << 30  # msmodelslim's AscendV1Config.part_file_size default: 4 (GB)


def w8a8_dynamic(name: str, out: int, inp: int) -> list[tuple[str, torch.dtype, tuple]]:
    return [
        (f"{name}.weight", torch.int8, (out, inp)),
        (f"{name}.weight_scale", torch.float32, (out, 1)),
        (f"{name}.weight_offset", torch.float32, (out, 1)),
    ]


def mtp_layer(hidden: int, heads: int, kv_heads: int, head_dim: int, mlp: dict) -> list:
    """(name, dtype, shape) in msmodelslim's module order, with the description."""
    attn = "mtp.layers.0.self_attn"
    tensors = [("mtp.fc.weight", torch.bfloat16, (hidden, 2 * hidden))]
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors.append((f"mtp.{norm}.weight", torch.bfloat16, (hidden,)))
    for norm in ("input_layernorm", "post_attention_layernorm"):
        tensors.append((f"mtp.layers.0.{norm}.weight", torch.bfloat16, (hidden,)))
    tensors += [(f"{attn}.{n}_norm.weight", torch.bfloat16, (head_dim,)) for n in "qk"]
    tensors += w8a8_dynamic(f"{attn}.q_proj", 2 * heads * head_dim, hidden)  # output gate
    tensors += w8a8_dynamic(f"{attn}.k_proj", kv_heads * head_dim, hidden)
    tensors += w8a8_dynamic(f"{attn}.v_proj", kv_heads * head_dim, hidden)
    tensors += w8a8_dynamic(f"{attn}.o_proj", hidden, heads * head_dim)
    prefixes = [f"mtp.layers.0.mlp.experts.{e}" for e in range(mlp.get("experts", 0))]
    if "experts" in mlp:
        tensors.append(("mtp.layers.0.mlp.gate.weight", torch.bfloat16, (mlp["experts"], hidden)))
        tensors.append(("mtp.layers.0.mlp.shared_expert_gate.weight", torch.bfloat16, (1, hidden)))
        prefixes.append("mtp.layers.0.mlp.shared_expert")
    else:
        prefixes.append("mtp.layers.0.mlp")
    for prefix in prefixes:
        tensors += w8a8_dynamic(f"{prefix}.gate_proj", mlp["inter"], hidden)
        tensors += w8a8_dynamic(f"{prefix}.up_proj", mlp["inter"], hidden)
        tensors += w8a8_dynamic(f"{prefix}.down_proj", hidden, mlp["inter"])
    return tensors


LAYERS = {
    "qwen3.5-27b": mtp_layer(5120, 24, 4, 256, {"inter": 17408}),
    "qwen3.5-397b-a17b (512 experts)": mtp_layer(4096, 32, 2, 256, {"inter": 1024, "experts": 512}),
}


def nbytes(entry) -> int:
    _, dtype, shape = entry
    return torch.Size(shape).numel() * dtype.itemsize


def orders(tensors: list) -> dict[str, list[list]]:
    """Each order as a list of runs (a run: one read of the stream)."""
    weights = [t for t in tensors if not t[0].endswith(("_scale", "_offset"))]
    companions = [t for t in tensors if t[0].endswith(("_scale", "_offset"))]
    sharded = []
    for start in range(0, PART_BYTES, PART_BYTES // 64):
        parts, used = [[]], start
        for entry in tensors:  # the writer starts a new part when this one would overflow
            if used + nbytes(entry) > PART_BYTES and parts[-1]:
                parts.append([])
                used = 0
            parts[-1].append(entry)
            used += nbytes(entry)
        sharded.append([e for part in parts for e in sorted(part)])
    return {
        "write": [tensors],
        "sorted": [sorted(tensors)],
        "sharded": sharded,
        "adversarial": [weights + companions],
    }


def peak_held(decode, run: list, description: dict) -> int:
    held: dict[str, int] = {}
    peak = 0

    def source() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal peak
        for name, dtype, shape in run:
            peak = max(peak, sum(held.values()))  # held back while asking for the next one
            held[name] = torch.Size(shape).numel() * dtype.itemsize
            yield name, torch.empty(shape, dtype=dtype, device="meta")

    for name, _ in decode(source(), description, "<bench>", torch.bfloat16):
        for key in (name, name + "_scale", name + "_offset"):
            held.pop(key, None)
    assert not held, sorted(held)[:3]
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT / ".cache" / "upstream" / "sglang")
    args = parser.parse_args()
    decode = tree.pr1_decoder(args.tree)["_dequantize_modelslim_mtp"]
    print(describe())
    print(f"decode: {args.tree}, step/series:{tree.PR1_MODEL}")
    torch.set_default_dtype(torch.bfloat16)
    for label, tensors in LAYERS.items():
        description = {
            name: "W8A8_DYNAMIC" if dtype != torch.bfloat16 else "FLOAT"
            for name, dtype, _ in tensors
        }
        quantized = sum(nbytes(t) for t in tensors if t[1] != torch.bfloat16)
        largest = max(torch.Size(t[2]).numel() for t in tensors if t[1] == torch.int8)
        peaks = {}
        for order, runs in orders(tensors).items():
            peaks[order] = max(peak_held(decode, r, description) for r in runs)
        transient = largest * 6
        print(
            f"{label}: {len(tensors)} mtp.* tensors, integer tensors + companions "
            f"{quantized:,} B; largest decode transient (fp32 + bf16) {transient:,} B"
        )
        for order, peak in peaks.items():
            print(f"  {order:12s} peak held {peak:>15,} B ({peak / quantized:.2%} of the layer)")
        figures = " ".join(str(peaks[o]) for o in ("write", "sorted", "sharded", "adversarial"))
        print(f"pr1-stream {label.split()[0]} peak_held_bytes {figures} all {quantized}")


if __name__ == "__main__":
    main()
