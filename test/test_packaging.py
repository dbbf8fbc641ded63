"""Installing into an environment that already has sglang adds this package and nothing else.

pip resolves the project offline (``--no-index``) against what is installed here (sglang
0.5.23 installed without its dependencies, CPU torch): if any requirement were not already
satisfied (sglang's CUDA set, a newer torch), resolution would fail or list it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_install_into_sglang_environment_adds_only_this_package(tmp_path):
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--report", str(report), "-q", ROOT],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["sglang-mtp-dequant"]


def test_requirements_do_not_name_sglang():
    from importlib.metadata import requires

    requirements = requires("sglang-mtp-dequant") or []
    assert not [r for r in requirements if r.lower().startswith("sglang")]
    assert any(r.startswith("torch") for r in requirements)


def test_the_pinned_sglang_is_the_one_installed():
    """Every test here is against sglang 0.5.23 (the hook targets, the ledger were read in it)."""
    from sglang_mtp_dequant.serving.context import sglang_version

    assert sglang_version() == "0.5.23"


def _requirements(path: str) -> dict[str, str | None]:
    """name -> pinned version (None when unpinned) of a requirements file."""
    import re

    out: dict[str, str | None] = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = re.split(r"(==)", line, maxsplit=1) if "==" in line else (line, "", "")
        out[name.strip().lower().replace("_", "-")] = version.strip() or None
    return out


def test_the_lock_pins_every_chosen_requirement():
    """``make venv`` installs requirements/cpu-lock.txt with --no-deps: every package chosen in
    cpu.txt must be in it, at the version cpu.txt pins."""
    chosen = _requirements(os.path.join(ROOT, "requirements", "cpu.txt"))
    lock = _requirements(os.path.join(ROOT, "requirements", "cpu-lock.txt"))
    assert all(version is not None for version in lock.values()), "the lock pins everything"
    for name, version in chosen.items():
        assert name in lock, f"{name} (cpu.txt) is not in cpu-lock.txt: regenerate the lock"
        if version is not None:
            assert lock[name] == version, f"{name}: cpu.txt pins {version}, the lock {lock[name]}"


# -- layering: the package's own import graph ---------------------------------------------------

PACKAGE = os.path.join(ROOT, "python", "sglang_mtp_dequant")
#: what sglang's NPU install already ships (python/pyproject_npu.toml): the only third-party
#: modules the plugin itself may import, besides sglang and the standard library
ALLOWED_THIRD_PARTY = {
    "torch", "torchvision", "safetensors", "huggingface_hub", "numpy", "ray",
    "compressed_tensors",  # in pyproject_npu.toml too; pinned 0.18.0 by the CUDA wheel
    "orjson",  # in pyproject_npu.toml too, unpinned
}  # fmt: skip


def _module_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports (at any depth of its body)."""
    import ast

    graph: dict[str, set[str]] = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            rel = os.path.relpath(path, PACKAGE)[: -len(".py")].replace(os.sep, ".")
            module = rel[: -len(".__init__")] if rel.endswith("__init__") else rel
            package = module if rel.endswith("__init__") else module.rpartition(".")[0]
            found: set[str] = set()
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                    found.add(target)
                    found.update(f"{target}.{a.name}".strip(".") for a in node.names)
            graph[module] = found
    return {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}


def test_no_tracked_symlink_leaves_the_repository():
    """A tracked symlink out of the tree (a worktree's ``.venv`` once slipped in under a
    ``.venv/`` rule, which matches directories only) dangles in a user's clone, where ``make``
    then finds no interpreter to build ``.venv`` with."""
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-s"], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, no tracked files to read: {listed.stderr.strip()}")
    links = [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line[:6] == "120000"]
    outside = {}
    for link in links:
        path = os.path.join(ROOT, link)
        target = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        if os.path.commonpath([target, ROOT]) != ROOT:
            outside[link] = os.readlink(path)
    assert not outside, f"tracked symlinks out of the repository: {outside}"


def test_one_ruff_version():
    """pre-commit's ruff hook and ``make lint`` (requirements/lint.txt) run the same ruff: two
    versions disagree on formatting, and a contributor's commit hook would fight the CI."""
    import re

    with open(os.path.join(ROOT, ".pre-commit-config.yaml"), encoding="utf-8") as f:
        hook = re.search(r"ruff-pre-commit\s+rev:\s*v?(\S+)", f.read())
    assert hook, ".pre-commit-config.yaml has no ruff-pre-commit rev"
    pinned = _requirements(os.path.join(ROOT, "requirements", "lint.txt"))["ruff"]
    assert hook.group(1) == pinned


def test_mypy_requires_annotations_and_the_workflow_runs_it():
    """The extension points (scheme overrides, the AROUND hooks, the loader observers) stay
    typed: mypy refuses an unannotated def in the package, and the GitHub lint job runs
    ``make lint`` (ruff and mypy), not pre-commit's ruff alone."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        mypy = tomllib.load(f)["tool"]["mypy"]
    assert mypy.get("disallow_untyped_defs") is True
    for override in mypy.get("overrides", []):  # no module of the package let off
        assert override.get("disallow_untyped_defs", True), override
    with open(os.path.join(ROOT, ".github", "workflows", "cpu-tests.yml"), encoding="utf-8") as f:
        workflow = f.read()
    assert "run: make lint" in workflow


def test_no_import_cycle_in_the_package():
    graph = _module_imports()
    assert "serving.plugin" in graph and "formats.plan" in graph
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            # a package imports its own submodules: not a cycle through the package
            if target.startswith(f"{module}."):
                continue
            assert state.get(target) != 1, "import cycle: " + " -> ".join([*path, target])
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


#: tier -> the tiers its modules may import (``errors`` is shared by every tier)
TIERS = {
    "formats": {"formats"},
    "serving": {"formats", "serving"},
    "tools": {"formats", "serving", "tools"},
}


def _tier(module: str) -> str:
    return module.split(".")[0]


def test_each_tier_imports_only_the_tiers_below_it():
    """formats (checkpoint knowledge) <- serving (inside sglang) <- tools (the CLI)."""
    graph = _module_imports()
    tiers = {_tier(m) for m in graph} - {"", "errors"}
    assert tiers == set(TIERS), tiers
    for module, targets in graph.items():
        if _tier(module) not in TIERS:
            continue
        for target in targets:
            if _tier(target) in ("", "errors"):
                continue
            assert _tier(target) in TIERS[_tier(module)], f"{module} imports {target}"


def test_the_plugin_does_not_reach_the_cli():
    graph = _module_imports()
    reached, todo = set(), ["serving.plugin"]
    while todo:
        module = todo.pop()
        for target in graph[module] - reached:
            reached.add(target)
            todo.append(target)
    assert not {m for m in reached if _tier(m) == "tools"}, sorted(reached)


def _imported_names(path: str) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_formats_import_no_sglang():
    """The checkpoint/format core stands alone (the feature branch takes its arithmetic)."""
    for folder, _, files in os.walk(os.path.join(PACKAGE, "formats")):
        for file in (f for f in files if f.endswith(".py")):
            names = _imported_names(os.path.join(folder, file))
            assert not [n for n in names if n.split(".")[0] == "sglang"], (file, names)


def test_sglangs_private_names_are_spelled_only_in_the_ledger():
    """Every private sglang name the package touches is one entry of serving/sglang_private.py;
    no other module spells one (an sglang upgrade is a review of one file)."""
    import re

    from sglang_mtp_dequant.serving.sglang_private import LEDGER

    ledger = os.path.join(PACKAGE, "serving", "sglang_private.py")
    spelled = {
        "_prepare_weights", "_maybe_download_from_modelscope", "_get_all_weights",
        "_get_weights_iterator", "_initialize_model", "_get_quantization_config", "_patched",
        "_launch_scheduler_processes", "_map_global_expert_id_to_local_expert_id",
        "_sglang_require_global_experts", "runtime_context", "_get_excluded_dists",
        "get_rope_cpu", "is_npu", "_is_npu", "_weight_loader",
    }  # fmt: skip
    for name in spelled:
        assert any(name in entry.name for entry in LEDGER), f"{name} has no ledger entry"
    for entry in LEDGER:
        assert entry.why and entry.how and entry.read_in and entry.remove_when, entry.name
    word = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(spelled) + r")(?![A-Za-z0-9_])")
    for folder, _, files in os.walk(PACKAGE):
        for file in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            if path != ledger:
                hits = _private_spellings(path, spelled, word)
                assert not hits, f"{os.path.relpath(path, PACKAGE)} spells {hits}"


def _private_spellings(path: str, spelled: set[str], word) -> list[str]:
    """Attribute accesses, imports and (non-docstring) strings of ``path`` naming ``spelled``."""
    import ast

    tree = ast.parse(open(path).read())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in spelled:
            hits.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module and word.search(node.module):
            hits.append(node.module)
        elif isinstance(node, ast.alias) and word.search(node.name):
            hits.append(node.name)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and word.search(node.value)
        ):
            hits.append(node.value)
    return hits


def test_third_party_imports_are_in_sglangs_npu_install():
    import ast
    import sys as _sys

    stdlib = set(_sys.stdlib_module_names)
    for folder, _, files in os.walk(PACKAGE):
        for file in (f for f in files if f.endswith(".py")):
            tree = ast.parse(open(os.path.join(folder, file)).read())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                for name in names:
                    top = name.split(".")[0]
                    assert top in stdlib or top in ALLOWED_THIRD_PARTY or top == "sglang", (
                        f"{file} imports {name}"
                    )
