"""doctor on a full-shape GLM-5.1-w8a8 MTP layer against a full-shape Qwen3.5-27B one, in one run.

Usage::

    .venv/bin/python benchmarks/bench_doctor_glm5.py [--repeat 3]

Writes two checkpoints as *sparse* files (real headers, weights as holes, real scales): the
Qwen3.5-27B W8A8_DYNAMIC layout of ``bench_doctor.py`` (the whole model, 1842 tensors) and
GLM-5.1-w8a8's MTP layer 78 at full size (``test/support/real_layouts.py``: 793 draft tensors, 256
experts, static W8A8 MLA + DSA indexer, ``rot.safetensors``) with the target's embedding,
final norm and lm_head. Then, for each, the console script in a fresh process (as an operator
runs it) and ``diagnose`` in this process after a first call (sglang's imports paid), the
median of ``--repeat`` runs each; the figure the issue asks for is the ratio of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
from bench_doctor import write_sparse_checkpoint
from machine import describe

from support.real_layouts import draft_rows, glm51_w8a8, write_checkpoint


def console(folder: str, log: str) -> tuple[float, dict, int]:
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    started = time.perf_counter()
    run = subprocess.run(
        [script, "doctor", folder, "--json", "--log", log], capture_output=True, text=True
    )
    return time.perf_counter() - started, json.loads(run.stdout), run.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from sglang_mtp_dequant.tools.doctor import diagnose

    with tempfile.TemporaryDirectory(prefix="doctor-glm5-") as root:
        qwen, glm = os.path.join(root, "qwen35-27b"), os.path.join(root, "glm51")
        os.makedirs(qwen)
        write_sparse_checkpoint(qwen)
        layout = glm51_w8a8(scale=1)
        write_checkpoint(glm, layout, sparse=True)
        print(f"GLM-5.1 MTP layer: {draft_rows(layout)} draft rows, {len(layout.tensors)} tensors")
        results = {}
        for name, folder in (("Qwen3.5-27B", qwen), ("GLM-5.1", glm)):
            diagnose(folder)  # sglang's imports and model registry, once
            inner, fresh = [], []
            for i in range(args.repeat):
                started = time.perf_counter()
                report = diagnose(folder)
                inner.append(time.perf_counter() - started)
                wall, as_json, code = console(folder, os.path.join(root, f"{name}-{i}.log"))
                fresh.append(wall)
            results[name] = (statistics.median(inner), statistics.median(fresh))
            print(
                f"{name}: verdict {as_json['verdict']!r} (exit {code}), counts "
                f"{as_json['counts']}, draft class {as_json['draft_class']}; dry run: "
                f"{report.dry_run}"
            )
            print(
                f"  diagnose() in this process: {results[name][0]:.2f} s; console script, "
                f"fresh process: {results[name][1]:.2f} s (medians of {args.repeat})"
            )
        print(describe())
        q, g = results["Qwen3.5-27B"], results["GLM-5.1"]
        print(
            f"GLM-5.1 / Qwen3.5-27B: diagnose {g[0] / q[0]:.2f}x, console script {g[1] / q[1]:.2f}x"
        )


if __name__ == "__main__":
    main()
