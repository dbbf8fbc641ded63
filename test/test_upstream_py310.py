"""The 3.10 stage's own logic (``upstream/py310_deps.py``, ``upstream/py310_stage.py``): the
``python[dev]`` set derived from a wheel's METADATA as pip would select it for CPython 3.10 on
Linux x86_64, the committed lock agreeing with that set for the pinned wheel, and the editable
install's files leaving the venv as they found it. The stage itself runs in
``make upstream-test`` (it needs the multi-GB 3.10 venv), not here."""

from __future__ import annotations

from pathlib import Path

import py310_deps
import py310_stage
import tree
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

METADATA = """\
Metadata-Version: 2.4
Name: sglang
Version: 9.9.9
Requires-Python: >=3.11
Requires-Dist: aiohttp
Requires-Dist: av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"
Requires-Dist: tomli; python_version < "3.11"
Requires-Dist: torch==2.14.1
Provides-Extra: fast
Requires-Dist: fastokens>=0.3.2; extra == "fast"
Provides-Extra: test
Requires-Dist: pytest; extra == "test"
Requires-Dist: sglang[fast]; extra == "test"
Requires-Dist: torch>=2; extra == "test"
Provides-Extra: dev
Requires-Dist: sglang[test]; extra == "dev"
Provides-Extra: diffusion
Requires-Dist: diffusers==0.37.0; extra == "diffusion"

long description
Requires-Dist: not-a-header-line
"""


def test_dev_set_follows_own_extras_and_evaluates_markers_for_310():
    got = py310_deps.requirement_set(METADATA)
    # base + dev -> test -> fast; the aarch64-only av and the unrequested diffusion left out;
    # tomli in (3.10 < 3.11); a name required twice keeps both specifiers for the resolver
    assert got == [
        "aiohttp", "fastokens>=0.3.2", "pytest", "tomli", "torch==2.14.1", "torch>=2",
    ]  # fmt: skip


def test_base_set_without_extras():
    assert py310_deps.requirement_set(METADATA, extras=()) == ["aiohttp", "tomli", "torch==2.14.1"]


def test_a_311_interpreter_gets_no_tomli():
    env = {**py310_deps.CI_ENVIRONMENT, "python_version": "3.11", "python_full_version": "3.11.7"}
    assert "tomli" not in py310_deps.requirement_set(METADATA, environment=env)


def test_left_out_names_are_split_off():
    kept, dropped = py310_deps.split_left_out(
        ["aiohttp", "tml_renderers==0.1.0"], {"tml-renderers": "cp311 only"}
    )
    assert (kept, dropped) == (["aiohttp"], ["tml_renderers==0.1.0"])


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in py310_deps.LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return pins


def test_lock_pins_every_requirement_of_the_pinned_wheel():
    """The committed lock is the pinned wheel's set: each derived requirement pinned at a
    version its specifier allows, only the LEFT_OUT names missing (and said so in the lock)."""
    wheel = tree.fetch_wheel(tree.read_base())
    derived = py310_deps.requirement_set(py310_deps.wheel_metadata(wheel))
    kept, dropped = py310_deps.split_left_out(derived)
    pins = _lock_pins()
    assert dropped, "the wheel's set lost its cp311-only requirement: re-check LEFT_OUT"
    for line in kept:
        req = Requirement(line)
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{line} is not in {py310_deps.LOCK.name}"
        assert req.specifier.contains(version, prereleases=True), (line, version)
    header = py310_deps.LOCK.read_text()
    for line in dropped:
        assert canonicalize_name(Requirement(line).name) not in pins
        assert f"# left out: {line}:" in header


def test_editable_install_files_come_and_go(tmp_path: Path):
    site = tmp_path / "site-packages"
    site.mkdir()
    written = py310_stage.install_editable(site, tmp_path / "tree" / "python", "0.5.23")
    pth = site / f"{py310_stage.EDITABLE}.pth"
    assert pth.read_text() == f"{tmp_path / 'tree' / 'python'}\n"
    assert "Version: 0.5.23" in (site / "sglang-0.5.23.dist-info" / "METADATA").read_text()
    py310_stage.remove_editable(written)
    assert list(site.iterdir()) == []


def test_stage_env_carries_nothing_of_ours(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/upstream/site")
    monkeypatch.setenv("SGLANG_PLUGINS", "none")
    env = py310_stage.ci_env(Path("/v"))
    assert "PYTHONPATH" not in env and "SGLANG_PLUGINS" not in env
    assert env["PATH"].split(":")[0] == "/v/bin" and env["SGLANG_IS_IN_CI"] == "true"
