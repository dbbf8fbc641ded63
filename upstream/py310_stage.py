#!/usr/bin/env python3
"""``make upstream-test``'s ``py310`` step: a tree's registered CPU tests run as sglang's CPU CI
stage runs them, under CPython 3.10 with ``python[dev]`` installed and no stand-in of ours.

sglang's stage (its workflow _pr-test-stage-cpu.yml) sets up Python 3.10, installs
``uv pip install -e "python[dev]"`` and runs ``cd test && python3 run_suite.py --hw cpu --suite
<suite>``. Here: the 3.10 venv ``make upstream-py310`` builds from
``requirements/upstream-py310.txt`` (``upstream/py310_deps.py``); the tree put on its path as an
editable install puts it (a ``.pth`` naming ``<tree>/python`` and a ``sglang`` dist-info, for the
time of the run); and ``run_suite.py``'s own sequence, which the wheel does not ship, in
``SUITE_RUNNER``: every ``test/registered/**/*.py`` collected with ``sanity_check=True``, the
enabled per-commit CPU registrations of the suite run by ``run_unittest_files`` from ``test/``.
Nothing of ``upstream/site`` and no plugin: the venv holds neither.

Usage (after ``make upstream-tree upstream-py310``)::

    python upstream/py310_stage.py --root DIR [--log FILE]   # DIR: a worktree of the tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "upstream-py310-venv"
SUITE = "base-a-test-cpu"
#: the name of the editable-install files written into the venv for the run
EDITABLE = "__editable__.sglang-tree"

# test/run_suite.py of sglang main, as stored (collect -> filter -> run), for the one suite,
# unpartitioned: sglang's functions from the tree, nothing of ours in between
SUITE_RUNNER = r"""
import glob, os, sys
import sglang
from sglang.test.ci.ci_register import HWBackend, collect_tests
from sglang.test.ci.ci_utils import run_unittest_files

suite, expected_root = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath("run_suite.py"))
assert os.path.dirname(sglang.__file__).startswith(expected_root), sglang.__file__
print(f"run_suite: Python {sys.version.split()[0]} ({sys.executable}), "
      f"sglang from {os.path.dirname(sglang.__file__)}", flush=True)
files = [
    f for f in glob.glob(os.path.join(here, "registered", "**", "*.py"), recursive=True)
    if not f.endswith(("/conftest.py", "/__init__.py", "/cpu/utils.py"))
]
tests = collect_tests(files, sanity_check=True)
chosen = [
    t for t in tests
    if t.backend == HWBackend.CPU and getattr(t, "effective_suite", t.suite) == suite
    and not t.nightly and t.disabled is None
]
print(f"run_suite: collected {len(tests)} registration(s) in {len(files)} file(s); "
      f"--hw cpu --suite {suite}: {[os.path.relpath(t.filename, here) for t in chosen]}",
      flush=True)
if not chosen:
    sys.exit("run_suite: no enabled CPU test in the suite")
sys.exit(run_unittest_files(chosen, timeout_per_file=1200, continue_on_error=False))
"""


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.check_output([str(python), "-c", code], text=True).strip())


def install_editable(site: Path, tree_python: Path, version: str) -> list[Path]:
    """What ``pip install -e python`` leaves in site-packages for a static editable install:
    a ``.pth`` with the source folder, and the distribution's metadata (sglang reads its own
    version from it when ``sglang/_version.py`` is absent, as in the wheel's files)."""
    pth = site / f"{EDITABLE}.pth"
    pth.write_text(f"{tree_python}\n")
    info = site / f"sglang-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (info / "INSTALLER").write_text("sglang-mtp-dequant upstream/py310_stage.py\n")
    return [pth, info]


def remove_editable(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
        elif path.exists():
            path.unlink()


def ci_env(venv: Path) -> dict[str, str]:
    """The stage's environment: its ``env:`` (``SGLANG_IS_IN_CI``), the venv's ``python3``
    first on PATH (run_unittest_files starts ``python3 file.py``), nothing of this project's
    (no PYTHONPATH, no plugin selection)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_PLUGINS")}
    env["SGLANG_IS_IN_CI"] = "true"
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    return env


def run(root: Path, log: Path, version: str, venv: Path = VENV) -> tuple[int, str]:
    """The suite run on ``root`` (a worktree of the tree) under the 3.10 venv; (exit, log)."""
    python = venv_python(venv)
    site = site_packages(python)
    written = install_editable(site, root / "python", version)
    started = time.perf_counter()
    try:
        with open(log, "w") as out:
            proc = subprocess.run(
                [str(python), "-c", SUITE_RUNNER, SUITE, str(root / "python")],
                cwd=root / "test",
                env=ci_env(venv),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    finally:
        remove_editable(written)
    print(f"  exit {proc.returncode} in {time.perf_counter() - started:.0f} s (log: {log})")
    return proc.returncode, log.read_text()


def step_py310(root: Path, log: Path, version: str, venv: Path = VENV) -> list[str]:
    """``make upstream-test``'s step: must pass; on failure the log's last lines are shown."""
    python = venv_python(venv)
    if not (venv / ".installed").is_file():
        return [f"no 3.10 environment at {venv}: run `make upstream-py310` first"]
    print(f"[py310] {root.name}: run_suite --hw cpu --suite {SUITE} under {python} "
          "(sglang's CPU CI stage: Python 3.10, python[dev], no stand-in)")  # fmt: skip
    code, text = run(root, log, version, venv)
    tail = [line for line in text.splitlines() if line.strip()][-12:]
    for line in tail:
        print(f"  | {line}")
    return [] if code == 0 else [f"the registered CPU tests fail under Python 3.10 (see {log})"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="a worktree of the tree")
    parser.add_argument("--log", type=Path, default=ROOT / ".cache" / "upstream" / "py310.log")
    parser.add_argument("--version", default="0.5.23")
    parser.add_argument("--venv", type=Path, default=VENV)
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    problems = step_py310(args.root.resolve(), args.log, args.version, args.venv)
    for problem in problems:
        print(f"py310: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
