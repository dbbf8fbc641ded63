"""Train the bundled end-to-end model and write its float and ModelSlim W8A8_DYNAMIC folders.

Usage (from the repository root; what ``test/fixtures/e2e/*/RECIPE.md`` says)::

    .venv/bin/python benchmarks/e2e/build_fixture.py            # -> test/fixtures/e2e/{float,w8a8}

The model is ``make accept``'s tiny Qwen3.5 (``benchmarks/accept``: same corpus, recipe and
exporter) with every layer full attention: sglang's server on the CPU runs attention through
its Triton kernels under Triton's interpreter, and the Gated DeltaNet layers' kernels do not
run there (docs/results.md). The changed layer pattern gives the training its own cache key
in ``.cache/accept/``, so the model is trained once per machine and reused.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from accept import env  # noqa: E402

env.prepare()

from accept.corpus import load_corpus  # noqa: E402
from accept.export import write_float_checkpoint, write_modelslim_checkpoint  # noqa: E402
from accept.model import FULL, TinySpec  # noqa: E402
from accept.train import TrainRecipe, train  # noqa: E402

#: the bundled model: make accept's sizes with every layer full attention
E2E_SPEC = TinySpec(layer_types=(FULL,) * 4)
FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=FIXTURES, help="folder to write float/ and w8a8/ into")
    parser.add_argument("--cache", default=os.path.join(REPO, ".cache", "accept"))
    parser.add_argument("--steps", type=int, default=TrainRecipe.steps)
    args = parser.parse_args()
    corpus = load_corpus()
    trained = train(E2E_SPEC, TrainRecipe(steps=args.steps), corpus, args.cache)
    print(f"held-out after training: {trained.log['heldout']}", flush=True)
    float_dir = os.path.join(args.out, "float")
    quant_dir = os.path.join(args.out, "w8a8")
    float_tensors = write_float_checkpoint(trained.model, float_dir)
    write_modelslim_checkpoint(trained.model, float_tensors, quant_dir)
    print(f"training key {trained.log['key']}: wrote {float_dir} and {quant_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
