"""Peak memory and time of ``sglang-mtp-dequant verify`` on a Qwen3.5-27B-shaped checkpoint.

Usage::

    .venv/bin/python benchmarks/bench_verify_memory.py

Writes the sparse 27B-layout W8A8_DYNAMIC checkpoint of ``bench_doctor.py`` (real headers,
zero codes, real MTP scales, a ``config.json`` carrying Qwen3.5-27B's text dimensions), then
runs the console
script under ``/usr/bin/time -v`` and prints its verdict line, the memory line it printed, the
peak resident memory and the wall time. sglang's real ``Qwen3_5ForCausalLMMTP`` is built at
full size on the CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from bench_doctor import write_sparse_checkpoint
from machine import describe


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="verify-27b-") as folder:
        write_sparse_checkpoint(folder)  # its config.json carries 27B's text dimensions
        script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
        log = os.path.join(folder, "verify.log")
        run = subprocess.run(
            ["/usr/bin/time", "-v", script, "verify", folder, "--log", log],
            capture_output=True,
            text=True,
        )
    lines = run.stdout.splitlines()
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)[1])
    wall = re.search(r"Elapsed \(wall clock\) time .*: (\S+)", run.stderr)[1]
    print(next((line.strip() for line in lines if line.strip().startswith("memory:")), "?"))
    print(lines[-1] if lines else run.stderr[-2000:])
    print(f"exit {run.returncode}; peak RSS {peak_kib / 2**20:.2f} GiB; wall {wall}")
    print(describe())


if __name__ == "__main__":
    main()
