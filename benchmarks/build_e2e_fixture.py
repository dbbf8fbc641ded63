"""Train the bundled end-to-end model and write its float and ModelSlim W8A8_DYNAMIC folders.

Usage (from the repository root; what ``test/fixtures/e2e/*/RECIPE.md`` says)::

    .venv/bin/python benchmarks/build_e2e_fixture.py            # -> test/fixtures/e2e/{float,w8a8}
    .venv/bin/python benchmarks/build_e2e_fixture.py --family moe   # -> .../{moe_float,moe_w8a8}
    .venv/bin/python benchmarks/build_e2e_fixture.py --family hybrid  # .../hybrid_{float,w8a8}

The model is ``make accept``'s tiny Qwen3.5 (``benchmarks/accept``: same corpus, recipe and
exporter) with every layer full attention: sglang's server on the CPU runs attention through
its Triton kernels under Triton's interpreter, and the Gated DeltaNet layers' kernels do not
run there (docs/results.md). The changed layer pattern gives the training its own cache key
in ``.cache/accept/``, so the model is trained once per machine and reused.

``--family moe``: the same model as a Qwen3.5-MoE (``Qwen3_5MoeForCausalLM``): every layer's
MLP, the MTP layer's included, is a sparse MoE block of 8 routed experts (top-2, intermediate
64) and a gated shared expert (intermediate 128), trained by the same recipe under its own key.

``--family hybrid``: Qwen3.5's own layer pattern, three Gated DeltaNet (linear attention)
layers then one full-attention layer (config.json ``full_attention_interval: 4``), which is
``make accept``'s model itself (the default ``TinySpec``, the same cache key). sglang runs its
GDN layers through its own Triton kernels under the interpreter with the environment fixes of
``site/e2e_shim_gdn.py`` (``make e2e-hybrid``).
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from accept import env  # noqa: E402

env.prepare()

from accept.export import export_modelslim, write_float_checkpoint  # noqa: E402
from accept.model import FULL, TinySpec  # noqa: E402
from accept.train import TrainRecipe, train  # noqa: E402
from e2e.corpus import load_corpus  # noqa: E402

#: the bundled model: make accept's sizes with every layer full attention
E2E_SPEC = TinySpec(layer_types=(FULL,) * 4)
#: the bundled MoE model: the same sizes with Qwen3.5-MoE blocks in place of the dense MLP
E2E_MOE_SPEC = TinySpec(
    layer_types=(FULL,) * 4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=128,
)
#: the bundled hybrid model: make accept's model, Qwen3.5's 3:1 Gated DeltaNet / full attention
E2E_HYBRID_SPEC = TinySpec()
#: family -> (spec, float folder, ModelSlim folder) under test/fixtures/e2e
FAMILIES = {
    "dense": (E2E_SPEC, "float", "w8a8"),
    "moe": (E2E_MOE_SPEC, "moe_float", "moe_w8a8"),
    "hybrid": (E2E_HYBRID_SPEC, "hybrid_float", "hybrid_w8a8"),
}
FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=FIXTURES, help="folder to write float/ and w8a8/ into")
    parser.add_argument("--cache", default=os.path.join(REPO, ".cache", "accept"))
    parser.add_argument("--steps", type=int, default=TrainRecipe.steps)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="dense")
    args = parser.parse_args()
    spec, float_name, quant_name = FAMILIES[args.family]
    corpus = load_corpus()
    trained = train(spec, TrainRecipe(steps=args.steps), corpus, args.cache)
    print(f"held-out after training: {trained.log['heldout']}", flush=True)
    float_dir = os.path.join(args.out, float_name)
    quant_dir = os.path.join(args.out, quant_name)
    float_tensors = write_float_checkpoint(trained.model, float_dir)
    export_modelslim(trained.model, float_tensors, quant_dir)
    print(f"training key {trained.log['key']}: wrote {float_dir} and {quant_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
