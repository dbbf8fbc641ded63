#!/usr/bin/env python3
"""``make upstream-lint``: sglang's own lint, at its pinned versions, on every file the stack
adds or changes (``upstream/BASE`` names the sglang configuration followed).

Usage (after ``make upstream-tree``)::

    python upstream/lint.py [--repo DIR] [--tools DIR]

``--tools`` is the venv holding isort 7.0.0, ruff 0.15.1 and codespell 2.4.1
(``requirements/upstream-lint.txt``; ``make upstream-lint`` makes it). Checks, each as
sglang's ``.pre-commit-config.yaml`` runs it:

- isort with sglang's ``.isort.cfg`` (``profile=black``, ``known_first_party=sglang``);
- ``ruff check --select=F401,F821,F823,UP037`` and ``ruff format --check`` (new files);
- codespell with sglang's ``.codespellrc``;
- sglang's registered-test rules, re-implemented here over sglang's own parser
  (``ci_register.ut_parse_one_file``): a test under ``test/registered/unit/`` registers for
  CPU (or a ``-unit-`` suite) only, with ``est_time`` at most 60 and no server launch; every
  registered file has a ``__main__`` that runs its tests (``unittest.main()`` or
  ``pytest.main`` with arguments, never a bare ``pytest.main()``); nothing under
  ``python/sglang/`` registers a test; no CJK characters in a changed file.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import tree

#: sglang's .isort.cfg and .codespellrc, as stored (upstream/BASE names the commits)
ISORT_CFG = "[settings]\nprofile=black\nknown_first_party=sglang\n"
CODESPELLRC = (
    "[codespell]\n"
    "ignore-words-list = ans, als, hel, boostrap, childs, te, vas, hsa, ment, cann, thi, makro, "
    "wil, rouge, PRIS, ather, MIS, medias, allready, inout, nd, fo, visibles, nothink, renderD\n"
    "skip = *.json, *.jsonl, *.patch, *.txt, *.lock\n"
)
RUFF_SELECT = "--select=F401,F821,F823,UP037"
UNIT_DIR = "test/registered/unit/"
MAX_UNIT_EST_TIME = 60
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def changed_files(repo: Path, base: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changed or added, added) files of the whole stack."""

    def diff(flt: str) -> list[str]:
        out = tree.git(repo, "diff", "--name-only", f"--diff-filter={flt}", tree.TAG,
                       base["branch"])  # fmt: skip
        return [line for line in out.splitlines() if line]

    return diff("AM"), diff("A")


def run_tool(cmd: list[str], cwd: Path) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def main_entry_problems(path: Path) -> list[str]:
    """The file's ``if __name__ == "__main__":`` block must run its tests."""
    module = ast.parse(path.read_text(), str(path))
    blocks = [
        node
        for node in module.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    ]
    calls = [n for block in blocks for n in ast.walk(block) if isinstance(n, ast.Call)]
    names = {ast.unparse(call.func): call for call in calls}
    if "pytest.main" in names and not names["pytest.main"].args:
        return ["a bare pytest.main() in __main__ (give it the file: pytest.main([__file__]))"]
    if not ({"unittest.main", "pytest.main"} & set(names)):
        return ["no __main__ block calling unittest.main() (sglang's CI runs python3 file.py)"]
    return []


def registered_test_problems(repo: Path, files: list[str]) -> list[str]:
    """sglang's registered-test rules (see the module docstring) over its own parser."""
    # the tree's own parser, loaded from its file (stdlib only; importing the package would
    # import all of sglang)
    spec = importlib.util.spec_from_file_location(
        "sglang_ci_register", repo / "python/sglang/test/ci/ci_register.py"
    )
    ci_register = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ci_register  # dataclasses look their module up
    spec.loader.exec_module(ci_register)
    HWBackend, ut_parse_one_file = ci_register.HWBackend, ci_register.ut_parse_one_file

    problems = []
    for name in files:
        path = repo / name
        if not name.endswith(".py"):
            continue
        text = path.read_text()
        if name.startswith("python/sglang/") and re.search(r"\bregister_\w+_ci\(", text):
            problems.append(f"{name}: registers a test inside the package")
        if not name.startswith("test/registered/") or not path.name.startswith("test_"):
            continue
        registries, _ = ut_parse_one_file(str(path))
        if not registries:
            problems.append(f"{name}: registers for no CI suite")
        if name.startswith(UNIT_DIR):
            for reg in registries:
                if reg.backend != HWBackend.CPU and "-unit-" not in reg.suite:
                    problems.append(f"{name}: a unit test registered for {reg.backend.name} "
                                    f"({reg.suite}); unit tests register CPU only")  # fmt: skip
                if reg.est_time > MAX_UNIT_EST_TIME:
                    problems.append(f"{name}: est_time {reg.est_time} > {MAX_UNIT_EST_TIME}")
            if "popen_launch_server" in text:
                problems.append(f"{name}: a unit test launches a server")
        problems += [f"{name}: {p}" for p in main_entry_problems(path)]
    return problems


def lint_problems(repo: Path, tools: Path) -> list[str]:
    base = tree.read_base()
    changed, added = changed_files(repo, base)
    py = [f for f in changed if f.endswith(".py")]
    new_py = [f for f in added if f.endswith(".py")]
    print(f"upstream-lint: {len(changed)} file(s) the stack adds or changes ({len(py)} Python)")
    problems = []
    with tempfile.TemporaryDirectory(prefix="sglang-lint-") as tmp:
        (Path(tmp) / ".isort.cfg").write_text(ISORT_CFG)
        (Path(tmp) / ".codespellrc").write_text(CODESPELLRC)
        bin_ = tools / "bin"
        checks = [
            ("isort", [str(bin_ / "isort"), "--check-only", "--diff", "--settings-path", tmp, *py]),
            ("ruff check", [str(bin_ / "ruff"), "check", "--isolated", RUFF_SELECT, *py]),
            ("ruff format", [str(bin_ / "ruff"), "format", "--isolated", "--check", *new_py]),
            ("codespell", [str(bin_ / "codespell"), "--config", f"{tmp}/.codespellrc", *changed]),
        ]
        for label, cmd in checks:
            code, out = run_tool(cmd, repo)
            flag = "--version-number" if label == "isort" else "--version"
            version = run_tool([cmd[0], flag], repo)[1].splitlines()[0]
            print(f"  {label} ({version}): {'clean' if code == 0 else 'FAILED'}")
            if code != 0:
                problems.append(f"{label}:\n{out}")
    for name in changed:
        if CJK.search((repo / name).read_text(errors="replace")):
            problems.append(f"{name}: CJK characters")
    found = registered_test_problems(repo, changed)
    print(f"  registered-test rules: {'clean' if not found else 'FAILED'}")
    return problems + found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=tree.CACHE / "sglang")
    parser.add_argument("--tools", type=Path, default=tree.ROOT / ".cache" / "upstream-lint-venv")
    args = parser.parse_args(argv)
    problems = lint_problems(args.repo.resolve(), args.tools.resolve())
    for problem in problems:
        print(f"upstream-lint: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
