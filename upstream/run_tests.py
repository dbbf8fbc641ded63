#!/usr/bin/env python3
"""``make upstream-test``: the feature branch through sglang's own CI harness, its negative
control on the baseline, and bit-identity with the plugin on the repository's fixtures.

Usage (after ``make upstream-tree``; the Makefile runs it with the venv's python)::

    python upstream/run_tests.py [--repo DIR] [--steps registered,baseline,fixtures,e2e]

Steps:

1. ``registered``: sglang's ``collect_tests(files, sanity_check=True)`` on the test files the
   branch adds under ``test/registered/``, then ``run_unittest_files`` on their CPU-suite
   registrations (``base-a-test-cpu``), from the tree's root as sglang's CI runs them
   (``python3 file.py -f``), with the patched tree first on ``PYTHONPATH`` and the plugin
   switched off (``SGLANG_PLUGINS=none``). Must pass. Every file must also register for the
   Ascend PR lane (``base-a-test-1-npu-a2``).
2. ``baseline``: the same files run the same way on a worktree of the baseline commit (the
   wheel's sglang files, the branch's test files): must fail, and the output must show the
   bug (a draft parameter loaded with absmax 128.0: raw int8 codes) or stock sglang's own
   failure on a companion tensor (KeyError).
3. ``fixtures``: every checkpoint in test/fixtures/modelslim/ with an MTP draft (named by the
   package's own rules: Qwen3.5's ``mtp.*``, DeepSeek-V3 / GLM-5's NextN layer): loaded by
   stock sglang with the plugin and by the patched tree with the plugin off, in two processes
   (``upstream/load_draft.py``); every draft parameter compared bit for bit. A checkpoint
   whose draft uses a scheme the branch does not decode must be refused by the branch
   (``ModelSlimDraftWeightError``), never loaded.
4. ``e2e``: the server run (benchmarks/e2e/): runs ``$UPSTREAM_E2E`` (a shell
   command) with the patched tree on PYTHONPATH and SGLANG_PLUGINS=none, when set; says that
   it was not run otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tree  # noqa: E402

from sglang_mtp_dequant.formats.config import CheckpointConfig  # noqa: E402
from sglang_mtp_dequant.formats.naming import mtp_prefix, nextn_layer  # noqa: E402

ROOT = tree.ROOT
FIXTURES = ROOT / "test" / "fixtures" / "modelslim"
CPU_SUITE, NPU_SUITE = "base-a-test-cpu", "base-a-test-1-npu-a2"
BRANCH_TYPES = {"FLOAT", "W8A8_DYNAMIC", "W8A16", "W8A8", "W8A8_MIX"}
#: target architecture -> the rule naming its draft's checkpoint tensors (the package's own)
DRAFT_NAMES = {
    "Qwen3_5ForConditionalGeneration": mtp_prefix,
    "Qwen3_5MoeForConditionalGeneration": mtp_prefix,
    "DeepseekV3ForCausalLM": nextn_layer,
    "GlmMoeDsaForCausalLM": nextn_layer,
}

# sglang's own harness, in a process whose sglang is the one on PYTHONPATH. The torchvision
# shim is this machine's (a CUDA torchvision wheel beside CPU torch; `import sglang` imports
# transformers, which imports torchvision); each test file has its own, for its own process.
HARNESS = r"""
import json, os, sys, torch
try:
    import torchvision  # noqa: F401
except RuntimeError as exc:
    if "torchvision::nms" not in str(exc):
        raise
    for m in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        del sys.modules[m]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
import sglang
from sglang.test.ci.ci_register import HWBackend, collect_tests
from sglang.test.ci.ci_utils import run_unittest_files

files = json.loads(sys.argv[1])
expected_root = sys.argv[2]
assert os.path.dirname(sglang.__file__).startswith(expected_root), sglang.__file__
print(f"harness: sglang from {os.path.dirname(sglang.__file__)}", flush=True)
registries = collect_tests(files, sanity_check=True)
cpu = [r for r in registries if r.backend == HWBackend.CPU and r.suite == "CPU_SUITE"]
npu = {r.filename for r in registries if r.backend == HWBackend.NPU and r.suite == "NPU_SUITE"}
missing = sorted(set(files) - {r.filename for r in cpu}) + sorted(set(files) - npu)
if missing:
    sys.exit(f"harness: not registered for both CPU_SUITE and NPU_SUITE: {missing}")
print(f"harness: collect_tests(sanity_check=True) accepted {len(files)} file(s)", flush=True)
sys.exit(0 if run_unittest_files(cpu, continue_on_error=True) == 0 else 1)
""".replace("CPU_SUITE", CPU_SUITE).replace("NPU_SUITE", NPU_SUITE)


def sglang_env(python_dir: Path, plugins: str = "none") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(python_dir), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env["SGLANG_PLUGINS"] = plugins
    # run_unittest_files starts `python3 file.py`: this venv's interpreter
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_harness(root: Path, files: list[str], log: Path) -> tuple[int, str]:
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", HARNESS, json.dumps(files), str(root / "python")],
            cwd=root,
            env=sglang_env(root / "python"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    text = log.read_text()
    print(f"  exit {proc.returncode} in {time.perf_counter() - started:.0f} s (log: {log})")
    return proc.returncode, text


def step_registered(repo: Path, base: dict, logs: Path) -> list[str]:
    files = tree.added_files(repo, base, "test/registered")
    if not files:
        return ["the branch adds no test under test/registered/"]
    print(f"[registered] {len(files)} file(s) on the patched tree: {', '.join(files)}")
    code, text = run_harness(repo, files, logs / "registered.log")
    if code != 0:
        return [f"the registered tests failed on the branch (see {logs / 'registered.log'})"]
    ran = [line for line in text.splitlines() if line.startswith("Ran ")]
    print(f"  green: {'; '.join(ran)}")
    return []


def step_baseline(repo: Path, base: dict, logs: Path) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="upstream-baseline-") as tmp:
        dest = Path(tmp) / "sglang"
        try:
            files = tree.baseline_worktree(repo, base, dest)
            print(f"[baseline] the same files on the baseline {base['baseline_commit'][:12]}")
            code, text = run_harness(dest, files, logs / "baseline.log")
        finally:
            tree.remove_worktree(repo, dest)
    problems = []
    if code == 0:
        problems.append("the registered tests PASS on the baseline: they do not test the fix")
    raw = text.count("absmax 128.0")
    stock_key_errors = text.count("KeyError: 'model.")
    if not raw and not stock_key_errors:
        problems.append("the baseline run shows neither raw codes nor stock's KeyError")
    summary = [line for line in text.splitlines() if line.startswith("FAILED (")]
    print(
        f"  red as it must be: {'; '.join(summary)}; parameters with raw int8 codes "
        f"(absmax 128.0): {raw}; stock KeyError on a companion: {stock_key_errors}"
    )
    return problems


def fixture_folders() -> tuple[list[Path], list[Path], dict[str, str]]:
    """(covered, refused, skipped-with-reason) fixtures."""
    covered, refused, skipped = [], [], {}
    for folder in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").is_file()):
        config = CheckpointConfig.read(str(folder))
        rule = DRAFT_NAMES.get(config.architecture or "")
        if rule is None:
            skipped[folder.name] = f"{config.architecture}: no MTP draft"
            continue
        is_draft = rule(config)
        desc = json.loads((folder / "quant_model_description.json").read_text())
        types = {v for k, v in desc.items() if is_draft(k) and isinstance(v, str)}
        if not types:  # never "covered" by an empty set
            skipped[folder.name] = f"{config.architecture}: no draft tensor in the description"
            continue
        (covered if types <= BRANCH_TYPES else refused).append(folder)
    return covered, refused, skipped


def same_bits(a, b) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(ints), b.view(ints))
    return torch.equal(a, b)


def step_fixtures(repo: Path, logs: Path) -> list[str]:
    from safetensors.torch import load_file

    covered, refused, skipped = fixture_folders()
    folders = [str(p) for p in covered + refused]
    print(f"[fixtures] {len(covered)} covered, {len(refused)} refused by the branch; skipped: "
          + ", ".join(f"{k} ({v})" for k, v in skipped.items()))  # fmt: skip
    script = str(Path(__file__).resolve().parent / "load_draft.py")
    with tempfile.TemporaryDirectory(prefix="upstream-fixtures-") as tmp:
        plugin, branch = Path(tmp) / "plugin", Path(tmp) / "branch"
        started = time.perf_counter()
        sides = [
            (plugin, "plugin", dict(os.environ, SGLANG_PLUGINS="mtp_dequant")),
            (branch, "branch", sglang_env(repo / "python")),
        ]
        procs = []
        for out, expect, env in sides:
            log = open(logs / f"fixtures-{expect}.log", "w")
            cmd = [sys.executable, script, "--out", str(out), "--expect", expect, *folders]
            procs.append(
                (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log)
            )
        codes = [proc.wait() for proc, _ in procs]
        for _, log in procs:
            log.close()
        print(f"  two processes (stock + plugin, patched tree + plugin off) in "
              f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        if any(codes):
            return [f"load_draft.py exited {codes} (logs: {logs}/fixtures-*.log)"]
        problems = []
        for folder in covered:
            a, b = plugin / f"{folder.name}.safetensors", branch / f"{folder.name}.safetensors"
            if not (a.exists() and b.exists()):
                errors = [p.read_text().splitlines()[0] for p in (plugin / f"{folder.name}.error",
                          branch / f"{folder.name}.error") if p.exists()]  # fmt: skip
                problems.append(f"{folder.name}: not loaded on both sides: {errors}")
                continue
            left, right = load_file(str(a)), load_file(str(b))
            differing = sorted(
                k for k in left if k not in right or not same_bits(left[k], right[k])
            )
            differing += sorted(set(right) - set(left))
            written = sum(
                1 for t in left.values() if not (t.is_floating_point() and t.isnan().all())
            )
            status = "bit-identical" if not differing else f"DIFFER: {differing}"
            print(f"  {folder.name}: {len(left)} draft parameters ({written} loaded), {status}")
            if differing:
                problems.append(f"{folder.name}: parameters differ: {differing}")
        for folder in refused:
            error = branch / f"{folder.name}.error"
            first = error.read_text().splitlines()[0] if error.exists() else ""
            ok = first.startswith("ModelSlimDraftWeightError")
            print(f"  {folder.name}: refused by the branch: {first[:160]}" if ok else
                  f"  {folder.name}: NOT refused by the branch")  # fmt: skip
            if not ok:
                problems.append(f"{folder.name}: the branch did not refuse an undecodable draft")
    return problems


def step_e2e(repo: Path) -> list[str]:
    command = os.environ.get("UPSTREAM_E2E", "").strip()
    if not command:
        print("[e2e] not run: set UPSTREAM_E2E to the server run's command (benchmarks/e2e/); "
              "it runs with the patched tree on PYTHONPATH and SGLANG_PLUGINS=none")  # fmt: skip
        return []
    print(f"[e2e] {command}")
    env = sglang_env(repo / "python")
    env["UPSTREAM_TREE"] = str(repo)
    code = subprocess.run(command, shell=True, cwd=ROOT, env=env).returncode
    return [] if code == 0 else [f"the e2e run exited {code}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=tree.CACHE / "sglang")
    parser.add_argument("--steps", default="registered,baseline,fixtures,e2e")
    parser.add_argument("--logs", type=Path, default=tree.CACHE / "logs")
    args = parser.parse_args(argv)
    base = tree.read_base()
    repo = args.repo.resolve()
    try:
        tree.build_tree(repo, base)  # reused when current: `make upstream-tree` made it
    except tree.TreeError as exc:
        print(f"upstream/run_tests.py: {exc}", file=sys.stderr)
        return 2
    args.logs.mkdir(parents=True, exist_ok=True)
    steps = {
        "registered": lambda: step_registered(repo, base, args.logs),
        "baseline": lambda: step_baseline(repo, base, args.logs),
        "fixtures": lambda: step_fixtures(repo, args.logs),
        "e2e": lambda: step_e2e(repo),
    }
    problems = []
    for name in args.steps.split(","):
        started = time.perf_counter()
        found = steps[name]()
        print(f"[{name}] {'ok' if not found else 'FAILED'} ({time.perf_counter() - started:.0f} s)")
        problems += [f"{name}: {p}" for p in found]
    for problem in problems:
        print(f"upstream-test: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
