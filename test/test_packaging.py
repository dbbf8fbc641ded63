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
