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
- sglang's ``scripts/lint/check_registered_tests.py`` (the commit is in ``upstream/BASE``),
  ported over the tree's own parser (``ci_register.ut_parse_one_file``): every file under
  ``test/registered/`` registers for a suite; a TestCase file's ``__main__`` runs its tests; a
  CUDA registration uses ``stage=``/``runner_config=`` (legacy ``suite=`` only for stress);
  and, for a file the stack adds, the taxonomy: it lives under
  ``test/registered/<kind>/<subsystem>/`` (kind: unit, kernel, e2e, accuracy, perf, stress) or
  under a vendor folder (amd, mlx, mps, musa, npu, xpu); a unit test registers CPU (or a
  ``-unit-`` suite) only, with ``est_time`` at most 60, and calls no ``popen_launch_server``;
  a kernel test uses a ``-kernel-`` suite, accuracy/perf nightly/weekly suites, stress
  stress/weekly;
- the local hooks check-no-bare-pytest-main (``pytest.main`` with arguments, never bare) and
  check-no-registered-tests-in-package (nothing under ``python/sglang/`` registers a test), and
  no CJK characters in a changed file.
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
MAX_UNIT_EST_TIME = 60
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def changed_files(repo: Path, base: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changed or added, added/copied/renamed) files of the whole stack."""

    def diff(flt: str) -> list[str]:
        out = tree.git(repo, "diff", "--name-only", f"--diff-filter={flt}", tree.TAG,
                       base["branch"])  # fmt: skip
        return [line for line in out.splitlines() if line]

    return diff("AMCR"), diff("ACR")


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


# sglang's scripts/lint/check_registered_tests.py (the commit is in upstream/BASE), ported:
# where a new registered test may live and what each kind of test may register
TEST_KINDS = {"unit", "kernel", "e2e", "accuracy", "perf", "stress"}
VENDOR_DIRS = {"amd", "mlx", "mps", "musa", "npu", "xpu"}
LEGACY_CUDA_PREFIXES = ("stress",)
MODERN_SHAPE = re.compile(r"^(.+)-test-(.+)$")


def defines_testcase(module: ast.AST) -> bool:
    """The file defines unittest classes, statically or via type()."""
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef):
            if any("TestCase" in ast.unparse(b) for b in node.bases):
                return True
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Tuple)
            and any("TestCase" in ast.unparse(e) for e in node.args[1].elts)
        ):
            return True
    return False


def main_runs_tests(module: ast.Module) -> bool:
    for stmt in module.body:
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test).replace("'", '"') == (
            '__name__ == "__main__"'
        ):
            body = ast.unparse(ast.Module(body=stmt.body, type_ignores=[]))
            if "unittest.main" in body or "pytest.main" in body:
                return True
    return False


def contains_call(module: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
        for node in ast.walk(module)
    )


def taxonomy_errors(path: str, registries: list, module: ast.AST) -> list[str]:
    """The kind/subsystem rule for a newly added registered test."""
    parts = path.split("/")[2:] if path.startswith("test/registered/") else []
    if parts and parts[0] in VENDOR_DIRS:
        return []
    if len(parts) < 3 or parts[0] not in TEST_KINDS:
        return [f"{path}: registered tests must live under test/registered/<kind>/<subsystem>/; "
                f"kind must be one of {', '.join(sorted(TEST_KINDS))}"]  # fmt: skip
    kind, errors = parts[0], []
    suites = [r.effective_suite or "" for r in registries]
    if kind == "unit":
        if any(
            r.backend.name != "CPU" and "-unit-" not in s
            for r, s in zip(registries, suites, strict=True)
        ):
            errors.append(f"{path}: unit tests must use CPU or dedicated unit suites")
        if any(r.est_time > MAX_UNIT_EST_TIME for r in registries):
            errors.append(f"{path}: unit test est_time must be <= {MAX_UNIT_EST_TIME} seconds")
        if contains_call(module, "popen_launch_server"):
            errors.append(f"{path}: unit tests may not launch a server")
    elif kind == "kernel" and any("-kernel-" not in s for s in suites):
        errors.append(f"{path}: kernel tests must use a *-kernel-* suite")
    elif kind in {"accuracy", "perf"} and not all(
        s.startswith(("nightly-", "weekly-")) for s in suites
    ):
        errors.append(f"{path}: {kind} tests must use nightly/weekly suites")
    elif kind == "stress" and not all(s == "stress" or s.startswith("weekly-") for s in suites):
        errors.append(f"{path}: stress tests must use stress/weekly suites")
    return errors


def registered_test_problems(repo: Path, changed: list[str], added: list[str]) -> list[str]:
    """sglang's check_registered_tests.py over the tree's test/registered/ (the taxonomy rule
    on the files the stack adds), its local hooks check-no-bare-pytest-main and
    check-no-registered-tests-in-package, all over the tree's own parser."""
    # the tree's own parser, loaded from its file (stdlib only; importing the package would
    # import all of sglang)
    spec = importlib.util.spec_from_file_location(
        "sglang_ci_register", repo / "python/sglang/test/ci/ci_register.py"
    )
    ci_register = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ci_register  # dataclasses look their module up
    spec.loader.exec_module(ci_register)
    cuda = ci_register.HWBackend.CUDA

    problems = []
    for name in changed:
        text = (repo / name).read_text() if name.endswith(".py") else ""
        if name.startswith("python/sglang/") and re.search(r"\bregister_\w+_ci\(", text):
            problems.append(f"{name}: registers a test inside the package")
    registered = sorted(
        str(p.relative_to(repo))
        for p in (repo / "test" / "registered").rglob("*.py")
        if p.name not in ("conftest.py", "__init__.py")
    )
    for name in registered:
        path = repo / name
        registries, _ = ci_register.ut_parse_one_file(str(path))
        if not registries:
            problems.append(f"{name}: registers for no CI suite (move it to test/manual/)")
            continue
        module = ast.parse(path.read_text(), str(path))
        if name in added:
            problems += taxonomy_errors(name, registries, module)
        if defines_testcase(module) and not main_runs_tests(module):
            problems.append(f"{name}: defines TestCase classes its __main__ never runs")
        for r in registries:
            if r.backend == cuda and r.suite and r.stage is None and r.runner_config is None:
                if r.suite.split("-", 1)[0] not in LEGACY_CUDA_PREFIXES:
                    problems.append(
                        f"{name}: legacy CUDA suite={r.suite!r}: use stage=/runner_config="
                    )
        if name in changed:
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
    found = registered_test_problems(repo, changed, added)
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
