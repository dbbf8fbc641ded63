#!/usr/bin/env python3
"""``make upstream-test``: the pull-request stack through sglang's own CI harness, PR 1 alone
and then the whole stack, each with its negative control on the baseline and bit-identity with
the plugin on the repository's fixtures.

Usage (after ``make upstream-tree``; the Makefile runs it with the venv's python)::

    python upstream/run_tests.py [--repo DIR] [--steps pr1-registered,...,e2e]

Steps (``STEPS``; ``pr1-*`` on a worktree of the tree at ``step/series``, the rest on the
whole stack):

1. ``pr1-registered`` / ``registered``: sglang's ``collect_tests(files, sanity_check=True)`` on
   the test files the step adds under ``test/registered/``, then ``run_unittest_files`` on
   their CPU-suite registrations (``base-a-test-cpu``), from the tree's root as sglang's CI
   runs them (``python3 file.py -f``), with the tree first on ``PYTHONPATH``, then
   ``upstream/site`` (this machine's torchvision shim only: ``UPSTREAM_SITE_NO_ROTARY=1``
   leaves out the rotary stand-in, which the registered tests must not need), and the plugin
   switched off (``SGLANG_PLUGINS=none``). Must pass. NPU-only files are collected, not run.
   ``pr1-py310``: the same files as sglang's CPU CI stage runs them, under CPython 3.10 with
   ``python[dev]`` and nothing of ours (``upstream/py310_stage.py``). Must pass.
2. ``pr1-baseline`` / ``baseline``: the same CPU files run the same way on a worktree of the
   baseline commit: must fail, and the output must show the bug (a draft parameter loaded with
   absmax 128.0: raw int8 codes) or stock sglang's own failure on a companion (KeyError).
3. ``pr1-fixtures``: every msmodelslim checkpoint in test/fixtures/modelslim/ with a Qwen3.5 MTP
   draft, loaded by stock sglang with the plugin and by PR 1's tree with the plugin off, in two
   processes (``upstream/load_draft.py``); every draft parameter compared bit for bit where PR 1
   decodes the draft (per-channel W8A8_DYNAMIC, FLOAT); any other scheme, float8 ones and
   per-group W8A8_DYNAMIC included, must be refused with a ``ValueError`` naming the tensor.
4. ``bf16``: no regression. BF16 checkpoints of every MTP/NextN draft class the tests build on
   the CPU (``upstream/bf16_drafts.py``) loaded by stock sglang and by the tree at each step,
   each with the plugin off and on: every parameter bit-identical to stock sglang without the
   plugin. Every other MTP/NextN class sglang registers must have its ``load_weights`` in a file
   no step changes (reported per class).
5. ``e2e``: the server run (e2e/): runs ``$UPSTREAM_E2E`` (a shell command) with
   the whole stack on PYTHONPATH and SGLANG_PLUGINS=none, when set; says that it was not run
   otherwise.
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

import py310_stage
import tree

from sglang_mtp_dequant.formats.config import CheckpointConfig
from sglang_mtp_dequant.formats.naming import mtp_prefix, nextn_layer

ROOT = tree.ROOT
FIXTURES = ROOT / "test" / "fixtures" / "modelslim"
CPU_SUITE = "base-a-test-cpu"
SITE = ROOT / "upstream" / "site"
#: the targets whose draft PR 1 alone fixes (Qwen3.5 MTP; Qwen4-Exp inherits it)
PR1_ARCHITECTURES = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}
#: what PR 1 decodes (W8A8_DYNAMIC per channel only); it refuses every other scheme
PR1_TYPES = {"FLOAT", "W8A8_DYNAMIC"}
#: target architecture -> the rule naming its draft's checkpoint tensors (the package's own)
DRAFT_NAMES = {
    "Qwen3_5ForConditionalGeneration": mtp_prefix,
    "Qwen3_5MoeForConditionalGeneration": mtp_prefix,
    "DeepseekV3ForCausalLM": nextn_layer,
    "GlmMoeDsaForCausalLM": nextn_layer,
}

# sglang's own harness, in a process whose sglang is the one on PYTHONPATH (with upstream/site/,
# this machine's CPU shims, beside it): collect_tests with the sanity check on every file the
# step adds, then run_unittest_files on the CPU-suite files. Files registered for NPU only (the
# Ascend model test) are collected, not run: there is no NPU here.
HARNESS = r"""
import json, os, sys
import sglang
from sglang.test.ci.ci_register import HWBackend, collect_tests
from sglang.test.ci.ci_utils import run_unittest_files

files = json.loads(sys.argv[1])
expected_root = sys.argv[2]
assert os.path.dirname(sglang.__file__).startswith(expected_root), sglang.__file__
print(f"harness: sglang from {os.path.dirname(sglang.__file__)}", flush=True)
registries = collect_tests(files, sanity_check=True)
cpu = [r for r in registries if r.backend == HWBackend.CPU and r.suite == "CPU_SUITE"]
missing = sorted(set(files) - {r.filename for r in registries})
if missing:
    sys.exit(f"harness: not registered for any suite: {missing}")
npu_only = sorted({r.filename for r in registries} - {r.filename for r in cpu})
print(f"harness: collect_tests(sanity_check=True) accepted {len(files)} file(s); "
      f"NPU only, collected not run: {npu_only}", flush=True)
if not cpu:
    sys.exit(0)
sys.exit(0 if run_unittest_files(cpu, continue_on_error=True) == 0 else 1)
""".replace("CPU_SUITE", CPU_SUITE)


def sglang_env(python_dir: Path, plugins: str = "none") -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(python_dir), str(SITE), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(parts).rstrip(os.pathsep)
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
            # no rotary stand-in for the registered tests: sglang's CPU runner has none
            env={**sglang_env(root / "python"), "UPSTREAM_SITE_NO_ROTARY": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    text = log.read_text()
    print(f"  exit {proc.returncode} in {time.perf_counter() - started:.0f} s (log: {log})")
    return proc.returncode, text


def step_registered(root: Path, files: list[str], log: Path, what: str) -> list[str]:
    if not files:
        return [f"{what} adds no test under test/registered/"]
    print(f"[registered] {what}: {len(files)} file(s): {', '.join(files)}")
    code, text = run_harness(root, files, log)
    if code != 0:
        return [f"the registered tests failed on {what} (see {log})"]
    ran = [line for line in text.splitlines() if line.startswith("Ran ")]
    print(f"  green: {'; '.join(ran)}")
    return []


def step_baseline(repo: Path, base: dict, log: Path, tests_from: str, what: str) -> list[str]:
    """The tests ``tests_from`` adds, run on the baseline: they must fail, showing the bug."""
    with tempfile.TemporaryDirectory(prefix="upstream-baseline-") as tmp:
        dest = Path(tmp) / "sglang"
        try:
            files = tree.baseline_worktree(repo, base, dest, tests_from)
            files = [f for f in files if "/unit/" in f]  # the NPU model test cannot run here
            print(f"[baseline] {what}'s CPU tests on the baseline {base['baseline_commit'][:12]}")
            code, text = run_harness(dest, files, log)
        finally:
            tree.remove_worktree(repo, dest)
    problems = []
    if code == 0:
        problems.append(f"{what}'s registered tests PASS on the baseline: they do not test it")
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


def fixture_folders(
    architectures: set[str] | None = None,
) -> tuple[list[Path], list[Path], dict[str, str]]:
    """(covered, refused, skipped-with-reason) fixtures (of ``architectures`` only, if given):
    covered where PR 1 decodes every draft tensor, refused where a scheme it does not decode
    is present (per-group W8A8_DYNAMIC among them: the description's ``group_size``), skipped
    otherwise (other classes)."""
    covered, refused, skipped = [], [], {}
    for folder in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").is_file()):
        config = CheckpointConfig.read(str(folder))
        if architectures is not None and config.architecture not in architectures:
            skipped[folder.name] = f"{config.architecture}: not a class this step fixes"
            continue
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
        per_channel = not desc.get("group_size")
        (covered if types <= PR1_TYPES and per_channel else refused).append(folder)
    return covered, refused, skipped


def step_fixtures(
    root: Path, logs: Path, what: str, architectures: set[str] | None = None
) -> list[str]:
    """Every fixture's draft loaded by stock sglang + the plugin and by ``root``'s tree with the
    plugin off: bit-identical, or refused by the tree for a scheme it does not decode."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "test"))  # the tests' same_bits (test/support/reference.py)
    from support.reference import same_bits

    covered, refused, skipped = fixture_folders(architectures)
    print(f"[fixtures] {what}")
    folders = [str(p) for p in covered + refused]
    print(f"[fixtures] {len(covered)} covered, {len(refused)} refused by the branch; skipped: "
          + ", ".join(f"{k} ({v})" for k, v in skipped.items()))  # fmt: skip
    script = str(Path(__file__).resolve().parent / "load_draft.py")
    with tempfile.TemporaryDirectory(prefix="upstream-fixtures-") as tmp:
        plugin, branch = Path(tmp) / "plugin", Path(tmp) / "branch"
        started = time.perf_counter()
        sides = [
            (plugin, "plugin", dict(os.environ, SGLANG_PLUGINS="mtp_dequant")),
            (branch, "branch", sglang_env(root / "python")),
        ]
        procs = []
        for out, expect, env in sides:
            log = open(logs / f"fixtures-{what.split()[0]}-{expect}.log", "w")
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
            ok = first.startswith("ValueError: Cannot load mtp.")
            print(f"  {folder.name}: refused by the branch: {first[:160]}" if ok else
                  f"  {folder.name}: NOT refused by the branch")  # fmt: skip
            if not ok:
                problems.append(f"{folder.name}: the branch did not refuse an undecodable draft")
    return problems


def _run_sides(sides: list[tuple[str, list[str], dict]], logs: Path, jobs: int = 2) -> dict:
    """Run each (label, command, env) side, ``jobs`` at a time; returns their exit codes."""
    codes, running, pending = {}, [], list(sides)
    while pending or running:
        while pending and len(running) < jobs:
            label, cmd, env = pending.pop(0)
            log = open(logs / f"bf16-{label}.log", "w")
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((label, proc, log))
        label, proc, log = running.pop(0)
        codes[label] = proc.wait()
        log.close()
    return codes


def step_bf16(repo: Path, base: dict, logs: Path) -> list[str]:
    """BF16 checkpoints of every draft class: stock sglang, and the tree at each step (steps
    whose ``python/sglang/srt`` is the same tree share one run), each with the plugin off and
    on, load every parameter bit-identically to stock sglang with the plugin off."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "test"))
    from support.reference import same_bits

    script = str(Path(__file__).resolve().parent / "bf16_drafts.py")
    srt_trees: dict[str, list[str]] = {}
    for name, _, until in tree.step_ranges(repo):
        srt = tree.git(repo, "rev-parse", f"{until}:python/sglang/srt")
        srt_trees.setdefault(srt, []).append(name)
    problems = []
    with tempfile.TemporaryDirectory(prefix="upstream-bf16-") as tmp:
        root, worktrees = Path(tmp), []
        folders = root / "checkpoints"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE), str(ROOT / "test")]))
        subprocess.run([sys.executable, script, "write", str(folders)], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        python_dirs = {"stock": None}
        for steps_ in srt_trees.values():
            dest = root / f"tree-{steps_[0]}"
            tree.worktree_at(repo, base, dest, tree.step_ref(steps_[0]))
            worktrees.append(dest)
            python_dirs["+".join(steps_)] = dest / "python"
        sides, out = [], {}
        for label, python_dir in python_dirs.items():
            for plugin in ("none", "mtp_dequant"):
                parts = [str(SITE), str(ROOT / "test")]
                if python_dir is not None:
                    parts.insert(0, str(python_dir))
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(parts), SGLANG_PLUGINS=plugin)
                side = f"{label}.plugin-{'off' if plugin == 'none' else 'on'}"
                out[side] = root / side
                cmd = [sys.executable, script, "load", str(folders), str(out[side])]
                sides.append((side, cmd, env))
        print(f"[bf16] {len(sides)} sides (steps sharing one srt tree run once): "
              + ", ".join(out))  # fmt: skip
        started = time.perf_counter()
        try:
            codes = _run_sides(sides, logs)
        finally:
            for dest in worktrees:
                tree.remove_worktree(repo, dest)
        print(f"  {len(sides)} processes in {time.perf_counter() - started:.0f} s")
        if any(codes.values()):
            return [f"bf16_drafts.py exited {codes} (logs: {logs}/bf16-*.log)"]
        reference = out["stock.plugin-off"]
        cases = sorted(p.stem for p in reference.glob("*.safetensors"))
        errors = sorted(p.name for p in reference.glob("*.error"))
        if errors:
            problems.append(f"stock sglang did not load {errors}")
        for label, folder in out.items():
            before = len(problems)
            side = json.loads((folder / "side.json").read_text())
            want_hooked = label.endswith("plugin-on")
            if side["plugin_hooked"] != want_hooked:
                problems.append(f"{label}: plugin hooked {side['plugin_hooked']}")
            for case in cases:
                got = folder / f"{case}.safetensors"
                if not got.exists():
                    problems.append(f"{label}: {case} not loaded")
                    continue
                left, right = load_file(str(reference / got.name)), load_file(str(got))
                differing = sorted(k for k in left if k not in right
                                   or not same_bits(left[k], right[k]))  # fmt: skip
                if differing or set(right) != set(left):
                    problems.append(f"{label}: {case} differs from stock: {differing[:5]}")
            same = len(problems) == before
            print(f"  {label}: {len(cases)} drafts, "
                  f"{'bit-identical to stock' if same else 'DIFFER'}")  # fmt: skip
        problems += _untouched_classes(repo, base, reference)
    return problems


def _untouched_classes(repo: Path, base: dict, reference: Path) -> list[str]:
    """Every registered MTP/NextN class not loaded above: its ``load_weights`` is in a file
    the stack does not change, so it loads as stock by construction."""
    side = json.loads((reference / "side.json").read_text())
    loaded = set(side["loaded_classes"])
    changed = set(tree.git(repo, "diff", "--name-only", tree.TAG, base["branch"]).split())
    problems, untouched = [], []
    for cls, source in sorted(side["registered_drafts"].items()):
        if cls in loaded:
            continue
        if f"python/sglang/{source}" in changed:
            problems.append(f"{cls}: its load_weights ({source}) is changed by the stack, "
                            "and no BF16 checkpoint of it is loaded here")  # fmt: skip
        untouched.append(cls)
    print(f"  loaded: {', '.join(sorted(loaded))}; registered MTP/NextN classes whose "
          f"load_weights no step changes: {', '.join(untouched)}")  # fmt: skip
    return problems


def step_e2e(repo: Path) -> list[str]:
    command = os.environ.get("UPSTREAM_E2E", "").strip()
    if not command:
        print("[e2e] not run: set UPSTREAM_E2E to the server run's command (e2e/); "
              "it runs with the patched tree on PYTHONPATH and SGLANG_PLUGINS=none")  # fmt: skip
        return []
    print(f"[e2e] {command}")
    env = sglang_env(repo / "python")
    env["UPSTREAM_TREE"] = str(repo)
    code = subprocess.run(command, shell=True, cwd=ROOT, env=env).returncode
    return [] if code == 0 else [f"the e2e run exited {code}"]


STEPS = "pr1-registered,pr1-py310,pr1-baseline,pr1-fixtures,registered,baseline,bf16,e2e"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=tree.CACHE / "sglang")
    parser.add_argument("--steps", default=STEPS)
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
    pr1 = tree.step_ref("series")
    logs = args.logs
    with tempfile.TemporaryDirectory(prefix="upstream-pr1-") as tmp:
        pr1_root = Path(tmp) / "sglang"
        pr1_files: list[str] = []
        if any(name.startswith("pr1-") for name in args.steps.split(",")):
            pr1_files = tree.worktree_at(repo, base, pr1_root, pr1)
        steps = {
            "pr1-registered": lambda: step_registered(
                pr1_root, pr1_files, logs / "pr1-registered.log", "PR 1 alone"
            ),
            "pr1-py310": lambda: py310_stage.step_py310(
                pr1_root, logs / "pr1-py310.log", base["version"]
            ),
            "pr1-baseline": lambda: step_baseline(
                repo, base, logs / "pr1-baseline.log", pr1, "PR 1"
            ),
            "pr1-fixtures": lambda: step_fixtures(
                pr1_root, logs, "pr1: PR 1 alone, Qwen3.5 drafts", PR1_ARCHITECTURES
            ),
            "registered": lambda: step_registered(
                repo,
                tree.added_files(repo, base, "test/registered"),
                logs / "registered.log",
                "the whole stack",
            ),
            "baseline": lambda: step_baseline(
                repo, base, logs / "baseline.log", base["branch"], "the whole stack"
            ),
            "bf16": lambda: step_bf16(repo, base, logs),
            "e2e": lambda: step_e2e(repo),
        }
        problems = []
        try:
            for name in args.steps.split(","):
                started = time.perf_counter()
                found = steps[name]()
                status = "ok" if not found else "FAILED"
                print(f"[{name}] {status} ({time.perf_counter() - started:.0f} s)")
                problems += [f"{name}: {p}" for p in found]
        finally:
            if pr1_files:
                tree.remove_worktree(repo, pr1_root)
    for problem in problems:
        print(f"upstream-test: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
