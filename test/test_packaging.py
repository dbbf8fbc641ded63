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


# -- layering: the package's own import graph ---------------------------------------------------

PACKAGE = os.path.join(ROOT, "python", "sglang_mtp_dequant")
#: what sglang's NPU install already ships (python/pyproject_npu.toml): the only third-party
#: modules the plugin itself may import, besides sglang and the standard library
ALLOWED_THIRD_PARTY = {"torch", "torchvision", "safetensors", "huggingface_hub", "numpy", "ray"}


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


def test_no_import_cycle_in_the_package():
    graph = _module_imports()
    assert "plugin" in graph and "context" in graph
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


def test_the_plugin_does_not_reach_the_cli_and_context_imports_nothing():
    graph = _module_imports()
    reached, todo = set(), ["plugin"]
    while todo:
        module = todo.pop()
        for target in graph[module] - reached:
            reached.add(target)
            todo.append(target)
    assert not reached & {"cli", "doctor", "verify", "dryrun"}, sorted(reached)
    assert graph["context"] == set()


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
