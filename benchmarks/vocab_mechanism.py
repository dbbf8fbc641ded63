"""Never allocating the draft's vocab copies, or giving them back before sizing: what comes back.

Usage::

    .venv/bin/python benchmarks/vocab_mechanism.py [--repeats 2]

Issue #50, item 1: the mechanism chosen by measurement. Each arm is a fresh process that builds
and loads Qwen3.5's target and draft through sglang's own ``DefaultModelLoader.load_model`` from
the e2e float fixture padded to Qwen3.5's vocabulary (``kv_tokens.padded_fixture``; float32, as
the CPU server serves it) and reads its resident anonymous memory (``RssAnon``: what the
device reading of ``kv_tokens.py`` gives sglang's sizing) after the target's load and where
sglang sizes the KV pool:

- ``stock``: the plugin's hooks not loaded; the draft keeps its copies until after sizing;
- ``give back``: stock, then sglang's own sharing (``EagleDraftWorker.init_lm_head``) run before
  the reading, as sglang #32468 / #35996 / #37155 move it: the copies are freed before sizing;
- ``never``: ``load_plugins()``; the plugin builds the draft's vocab weights without storage.

Under two allocators: glibc as it is (a block this large is its own ``mmap``, returned to the
system when freed), and glibc keeping freed blocks (``MALLOC_MMAP_MAX_=0``: every block comes
from the heap, and a freed one below its top stays with the process), what a caching allocator
(PyTorch's on CUDA, torch_npu's on Ascend) does with a freed block whose segment holds live
ones: sglang #38147's point. The accelerators' own allocators were not measured (no NPU here).
Prints the machine, then per arm and allocator the draft's bytes at sizing (MiB, min over
``--repeats`` processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test"))

from benchmarks.kv_tokens import FIXTURES, padded_fixture  # noqa: E402
from benchmarks.machine import describe  # noqa: E402

ARMS = ("stock", "give back", "never")
ALLOCATORS = {"glibc": {}, "glibc keeping freed blocks": {"MALLOC_MMAP_MAX_": "0"}}


def rss_anon() -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        line = next(line for line in handle if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def one_arm(arm: str, folder: str) -> dict[str, int]:
    """In this process: target and draft loaded by sglang, the arm's way; RssAnon readings."""
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, prepare_cpu_process

    prepare_cpu_process(folder, speculative_algorithm="EAGLE", dtype="float32")
    if arm == "never":
        from sglang.srt.plugins import load_plugins

        load_plugins()
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_mtp_dequant.serving import sglang_private
    from support.cpu_sglang import load_model
    from support.vocab_sharing import share_as_sglang

    args = sglang_private.published_server_args()
    target = load_model(ModelConfig.from_server_args(args, model_path=folder))
    after_target = rss_anon()
    draft = load_model(draft_model_config(folder))
    if arm == "give back":
        share_as_sglang(draft, target, folder)
    return {"after_target": after_target, "at_sizing": rss_anon()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm:
        print(json.dumps(one_arm(args.arm, args.folder)))
        return 0
    print(describe(), flush=True)
    with tempfile.TemporaryDirectory(prefix="vocab-mechanism-") as root:
        folder = os.path.join(root, "float")
        config = padded_fixture(os.path.join(ROOT, FIXTURES["float"][0]), folder)
        copy = config["vocab_size"] * config["hidden_size"] * 4
        print(f"one vocab copy: {copy:,} B ({copy / 2**20:.1f} MiB), float32", flush=True)
        for allocator, extra in ALLOCATORS.items():
            for arm in ARMS:
                held = []
                for _ in range(args.repeats):
                    command = [sys.executable, __file__, "--arm", arm, "--folder", folder]
                    env = {**os.environ, **extra, "TQDM_DISABLE": "1"}
                    out = subprocess.run(command, env=env, capture_output=True, text=True)
                    if out.returncode != 0:
                        raise RuntimeError(f"{arm} / {allocator} failed:\n{out.stderr[-3000:]}")
                    readings = json.loads(out.stdout.strip().splitlines()[-1])
                    held.append(readings["at_sizing"] - readings["after_target"])
                each = ", ".join(f"{h / 2**20:.1f}" for h in held)
                print(f"{allocator}: {arm}: the draft holds {min(held) / 2**20:.1f} MiB at "
                      f"sizing ({each})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
