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

from support.paths import PACKAGE, package_files

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

    requirements = [r for r in requires("sglang-mtp-dequant") or [] if "extra ==" not in r]
    assert not [r for r in requirements if r.lower().startswith("sglang")]
    assert any(r.startswith("torch") for r in requirements)


def test_the_supported_sglang_range_is_declared_in_metadata_and_readme():
    """The range of serving/releases.py, stated where a user and a tool look: the ``sglang``
    extra's floor (no upper bound: pip must never replace a newer sglang) and the README."""
    from importlib.metadata import requires

    from sglang_mtp_dequant.serving import releases

    (extra,) = [r for r in requires("sglang-mtp-dequant") or [] if 'extra == "sglang"' in r]
    assert extra.split(";")[0].strip() == f"sglang>={releases.MINIMUM}", extra
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        assert f"sglang {releases.range_text()}" in handle.read()


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
    for path in package_files():
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


def _absolute_imports(path: str) -> list[tuple[str, str]]:
    """``(module, name)`` of each absolute import in ``path``: ``name`` is what ``from module
    import name`` takes, "" for ``import module``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.module, a.name) for a in node.names]
    return found


def _imported_names(path: str) -> set[str]:
    """The modules ``path`` imports absolutely."""
    return {module for module, _ in _absolute_imports(path)}


def test_formats_import_no_sglang():
    """The checkpoint/format core stands alone (the feature branch takes its arithmetic)."""
    for path in package_files("formats"):
        names = _imported_names(path)
        assert not [n for n in names if n.split(".")[0] == "sglang"], (path, names)


def test_formats_spell_no_sglang_parameter_name():
    """sglang's parameter names live in serving/parameter_names.py; formats/ knows checkpoints.
    The names checked are those no checkpoint spells (``gate_up_proj`` is also Qwen3.5's fused
    experts tensor, ``down_proj`` a checkpoint projection)."""
    import re

    from sglang_mtp_dequant.serving import parameter_names as p

    checkpoint = set(p.FUSED_EXPERTS.values())
    for parts in (*p.EXPERT_PARTS.values(), *p.DEFAULT_PACKED.values()):
        checkpoint.update(parts)
    sglang_only = (set(p.EXPERT_PARTS) | set(p.DEFAULT_PACKED)) - checkpoint
    assert {"w13_weight", "qkv_proj", "fused_qkv_a_proj_with_mqa"} <= sglang_only, sglang_only
    word = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(sglang_only)) + r")(?![A-Za-z0-9_])")
    for path in package_files("formats"):
        text = open(path, encoding="utf-8").read()
        assert not word.findall(text), f"{path} spells {set(word.findall(text))}"


#: the folders the ledger test reads: the package, its tests, benchmarks, the e2e harness and
#: the upstream runner (not sglang's own tree, nor the upstream patches, which are not .py)
SCANNED = ("python", "test", "benchmarks", "e2e", "upstream")
LEDGER_FILE = "python/sglang_mtp_dequant/serving/sglang_private.py"


def _repository_sources() -> list[str]:
    """The repository's tracked .py files under ``SCANNED``, relative to ``ROOT``."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *(f"{folder}/*.py" for folder in SCANNED)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted(path for path in out.stdout.split("\0") if path)


def test_sglangs_private_names_are_spelled_only_in_the_ledger():
    """Every private sglang name the repository touches is one entry of serving/sglang_private.py,
    spelled there, in the paths the entry declares and nowhere else, through accessors someone
    calls (an sglang upgrade is a review of the ledger, and of sglang_public.py beside it)."""
    import ast
    import re

    from sglang_mtp_dequant.serving import releases, sglang_private
    from sglang_mtp_dequant.serving.sglang_private import LEDGER

    owners: dict[str, set[str]] = {}  # token -> the paths that may spell it
    for entry in LEDGER:
        assert entry.why and entry.how and entry.remove_when, entry.name
        assert entry.checked_in and set(entry.checked_in) <= set(releases.TESTED), entry.name
        assert entry.spelled or not entry.accessors, f"{entry.name}: accessors of no spelling"
        for token in entry.spelled:
            assert token in entry.name, f"{entry.name} does not name {token}"
            owners.setdefault(token, {LEDGER_FILE}).update(entry.also_spelled_in)
        for accessor in entry.accessors:
            assert hasattr(sglang_private, accessor), f"{entry.name}: no accessor {accessor}"
    word = re.compile(
        r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, owners)) + r")(?![A-Za-z0-9_])"
    )
    sources = _repository_sources()
    assert LEDGER_FILE in sources and "test/test_packaging.py" in sources, sources[:5]
    found: dict[str, set[str]] = {}  # token -> the paths that spell it
    read: set[str] = set()  # the names the repository reads outside the ledger
    strays = []
    for path in sources:
        tree = ast.parse(open(os.path.join(ROOT, path)).read())
        if path == LEDGER_FILE:  # the entries' own text is not a use
            tree.body = [n for n in tree.body if "LEDGER" not in _assigned(n)]
        else:
            read.update(_read_names(tree))
        for token in _private_spellings(tree, owners, word):
            found.setdefault(token, set()).add(path)
            if path not in owners[token]:
                strays.append(f"{path} spells sglang's {token}: use its ledger accessor")
    assert not strays, "\n".join(strays)
    unused = []
    for entry in LEDGER:
        for token in entry.spelled:
            for path in (LEDGER_FILE, *entry.also_spelled_in):
                if path not in found.get(token, ()):
                    unused.append(f"{path} is said to spell {token} but does not")
        unused += [f"no one calls the accessor {a}" for a in entry.accessors if a not in read]
    assert not unused, "\n".join(unused)
    functions = {n for n, v in vars(sglang_private).items() if _defined_function(v, sglang_private)}
    declared = {a for entry in LEDGER for a in entry.accessors}
    assert functions <= declared, f"accessors of no ledger entry: {sorted(functions - declared)}"


def _defined_function(value, module) -> bool:
    import inspect

    return inspect.isfunction(value) and value.__module__ == module.__name__


def _assigned(node) -> set[str]:
    """The names a module-level statement assigns."""
    import ast

    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _read_names(tree) -> set[str]:
    """Every name, attribute and imported name in ``tree``."""
    import ast

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name)
    return names


def _private_spellings(tree, spelled, word) -> list[str]:
    """The ``spelled`` tokens in attribute accesses, imports and (non-docstring) strings of
    ``tree``: comments and docstrings may name them."""
    import ast

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
        elif isinstance(node, ast.ImportFrom) and node.module:
            hits.extend(word.findall(node.module))
        elif isinstance(node, ast.alias):
            hits.extend(word.findall(node.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                hits.extend(word.findall(node.value))
    return hits


def _sglang_imports() -> dict[tuple[str, str], set[str]]:
    """(sglang module, name imported from it, "" for the module itself) -> the package modules
    (paths under the package) importing it, outside the ledger; from the source."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in package_files():
        module = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
        if module == "serving/sglang_private.py":
            continue
        for key in _absolute_imports(path):
            if key[0].split(".")[0] == "sglang":
                found.setdefault(key, set()).add(module)
    return found


def _label(key: tuple[str, str]) -> str:
    return f"{key[0]}: {key[1] or '(the module)'}"


def test_the_public_sglang_imports_are_listed_beside_the_ledger():
    """serving/sglang_public.py lists every sglang module the package imports outside the
    ledger, with the names taken and the modules taking them: none missing, none unused."""
    from sglang_mtp_dequant.serving.sglang_public import PUBLIC_IMPORTS

    found = _sglang_imports()
    assert ("sglang.srt.plugins.hook_registry", "HookRegistry") in found, sorted(found)
    listed: dict[tuple[str, str], int] = {}  # key -> the entry listing it
    for index, entry in enumerate(PUBLIC_IMPORTS):
        assert entry.why, entry.module
        for key in [(entry.module, n) for n in entry.names] or [(entry.module, "")]:
            assert key not in listed, f"{key} listed twice"
            listed[key] = index
    missing = sorted(f"{_label(k)} in {sorted(found[k])}" for k in set(found) - set(listed))
    assert not missing, "imported but not in sglang_public.PUBLIC_IMPORTS:\n" + "\n".join(missing)
    unused = sorted(_label(key) for key in set(listed) - set(found))
    assert not unused, "in sglang_public.PUBLIC_IMPORTS but imported nowhere:\n" + "\n".join(unused)
    for index, entry in enumerate(PUBLIC_IMPORTS):
        users = set().union(*(found[key] for key, i in listed.items() if i == index))
        assert set(entry.used_in) == users, f"{entry.module}: used_in {entry.used_in}, is {users}"


def test_third_party_imports_are_in_sglangs_npu_install():
    import sys as _sys

    stdlib = set(_sys.stdlib_module_names)
    for path in package_files():
        for name in _imported_names(path):
            top = name.split(".")[0]
            assert top in stdlib or top in ALLOWED_THIRD_PARTY or top == "sglang", (
                f"{os.path.relpath(path, PACKAGE)} imports {name}"
            )


#: the CLI's orchestration is split into steps a reader names (issue 38): no function of these
#: folders is longer than this, docstring included
LONGEST_CLI_FUNCTION = 60


def test_no_function_of_verify_or_doctor_is_longer_than_sixty_lines():
    import ast

    too_long = []
    for path in package_files("tools/verify") + package_files("tools/doctor"):
        relative = os.path.relpath(path, PACKAGE)
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_CLI_FUNCTION:
                    too_long.append(f"{relative}:{node.lineno} {node.name} ({length} lines)")
    assert not too_long, "split into named steps: " + ", ".join(too_long)


#: the package's size budget (issue 48): non-blank lines of its ``.py`` files, what
#: ``find python -name '*.py' -exec grep -cv '^\s*$' {} +`` sums
PACKAGE_LINE_BUDGET = 9_400


def test_the_package_stays_within_its_line_budget():
    lines = 0
    for path in package_files():
        with open(path, encoding="utf-8") as handle:
            lines += sum(1 for line in handle if line.strip())
    assert lines <= PACKAGE_LINE_BUDGET, f"{lines} non-blank lines, over {PACKAGE_LINE_BUDGET}"
