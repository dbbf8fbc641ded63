"""Peak memory and time of ``sglang-mtp-dequant verify`` on a Qwen3.5-27B-shaped checkpoint.

Usage::

    .venv/bin/python benchmarks/bench_verify_memory.py

Writes the sparse 27B-layout W8A8_DYNAMIC checkpoint of ``bench_doctor.py`` (real headers,
zero codes, real MTP scales) with a ``config.json`` carrying Qwen3.5-27B's text dimensions
(hidden 5120, 24/4 heads of 256, MLP 17408, vocab 248320, 64 layers), then runs the console
script under ``/usr/bin/time -v`` and prints its verdict line, the memory line it printed, the
peak resident memory and the wall time. sglang's real ``Qwen3_5ForCausalLMMTP`` is built at
full size on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_doctor import write_sparse_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_CONFIG = os.path.join(ROOT, "test/fixtures/modelslim/q35_dense_w8a8_dynamic/config.json")


def config_27b() -> dict:
    with open(FIXTURE_CONFIG) as handle:
        config = json.load(handle)
    config["text_config"].update(
        hidden_size=5120,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        vocab_size=248320,
        num_hidden_layers=64,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 16,
        linear_num_value_heads=48,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
    )
    return config


def main() -> None:
    folder = tempfile.mkdtemp(prefix="verify-27b-")
    write_sparse_checkpoint(folder)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config_27b(), handle)
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    run = subprocess.run(
        ["/usr/bin/time", "-v", script, "verify", folder, "--no-progress"],
        capture_output=True,
        text=True,
    )
    lines = run.stdout.splitlines()
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)[1])
    wall = re.search(r"Elapsed \(wall clock\) time .*: (\S+)", run.stderr)[1]
    print(next((line.strip() for line in lines if line.strip().startswith("memory:")), "?"))
    print(lines[-1] if lines else run.stderr[-2000:])
    print(f"exit {run.returncode}; peak RSS {peak_kib / 2**20:.2f} GiB; wall {wall}")


if __name__ == "__main__":
    main()
