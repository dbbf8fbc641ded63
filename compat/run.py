"""The sglang release matrix: the plugin, its tests and its CLI on each supported release.

Usage::

    .venv/bin/python compat/run.py                          # every release in releases.TESTED
    .venv/bin/python compat/run.py 0.5.14 0.5.18 0.5.23     # those only (what CI runs)
    .venv/bin/python compat/run.py 0.5.11 --json out.json   # any release, supported or not

One line per release: ``compat <release> server=<hooks> doctor=<verdict> verify=<verdict>
tests=<passed>/<run> <ok|FAIL>``. Exit status 1 if any release failed.

How a release is installed, cheaply (the machine's ``.venv`` is 3 GB): a small venv per
release under ``.cache/compat/venvs/<release>`` holding only that sglang wheel (``--no-deps``)
and, when its ``transformers`` pin differs from ``.venv``'s, that transformers (and a
tokenizers it accepts) in a shared layer ``.cache/compat/layers/``; a ``.pth`` file then puts
the layer and ``.venv``'s own site-packages (torch, the pinned test set, this package,
editable) behind them. The release ``.venv`` itself holds is run in ``.venv``.

What runs in each: the activation, dense-scheme, guard, release and draft-vocabulary tests
(sglang's own draft class loading msmodelslim's real fixtures through its DefaultModelLoader,
stock and hooked; every draft class's vocab layers held back until its sharing);
``load_plugins()`` in a fresh process, as a server process does (the hooks it applied and the
WARNINGs it logged); ``doctor --json`` and ``verify --json`` on the W8A8_DYNAMIC fixture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

from sglang_mtp_dequant.serving import releases  # noqa: E402

FIXTURE = os.path.join(ROOT, "test/fixtures/modelslim/q35_dense_w8a8_dynamic")
REFERENCE = os.path.join(ROOT, "test/fixtures/reference/q35_dense_w8a8_dynamic.safetensors")
TESTS = (
    "test/integration/test_plugin_activation.py",
    "test/integration/test_dense_schemes.py",
    "test/integration/test_guard.py",
    "test/integration/test_releases.py",
    "test/integration/test_draft_vocab.py",
)
QWEN35 = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
#: what a fresh process reports after sglang's own load_plugins(), as one JSON line
PROBE = """
import json, logging
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record)
logging.getLogger().addHandler(Keep()); logging.getLogger().setLevel(logging.INFO)
from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable
ensure_torchvision_importable()
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang_mtp_dequant.serving.context import registered_targets
warnings = [r.getMessage() for r in records
            if r.levelno >= logging.WARNING and r.name.startswith("sglang_mtp_dequant")]
print(json.dumps({"hooked": sorted(registered_targets()), "warnings": warnings}))
"""


@dataclass
class Row:
    release: str
    supported: bool
    hooked: int = 0
    plugin_warnings: int = 0
    doctor: str = "-"
    doctor_rc: int = -1
    verify: str = "-"
    verify_rc: int = -1
    passed: int = 0
    run: int = 0
    seconds: float = 0.0
    problems: tuple[str, ...] = ()
    #: native packages a draft module of this release failed to import (its hook WARNING)
    missing_native: list[str] = field(default_factory=list)
    #: who ran the tests ("make test": not here)
    tests_by: str = "compat"

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        server = f"{self.hooked}-hooks" + (
            f"+{self.plugin_warnings}-warnings" if self.plugin_warnings else ""
        )
        if self.missing_native:
            server += f"(no-{','.join(self.missing_native)})"
        verdict = "ok" if self.ok else "FAIL: " + "; ".join(self.problems)
        return (
            f"compat {self.release} server={server} doctor={self.doctor}({self.doctor_rc}) "
            f"verify={self.verify}({self.verify_rc}) "
            f"tests={self.passed}/{self.run if self.tests_by == 'compat' else self.tests_by} "
            f"{self.seconds:.0f}s {verdict}"
        )


def _site(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip()


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-qq", "--no-deps", *args], check=True)


def _requires(site: str, dist: str) -> dict[str, Requirement]:
    """The Requires-Dist of ``dist`` installed in ``site``, by normalized name."""
    for entry in os.listdir(site):
        if entry.lower().startswith(dist.lower() + "-") and entry.endswith(".dist-info"):
            with open(os.path.join(site, entry, "METADATA"), encoding="utf-8") as handle:
                head = "Requires-Dist: "
                lines = [ln[len(head) :].strip() for ln in handle if ln.startswith(head)]
            reqs = [Requirement(line) for line in lines]
            return {r.name.lower().replace("_", "-"): r for r in reqs if not r.marker}
    raise FileNotFoundError(f"no {dist} in {site}")


def _version_in(site: str, dist: str) -> str:
    for entry in os.listdir(site):
        match = re.match(rf"{dist}-([^-]+)\.dist-info$", entry, re.IGNORECASE)
        if match:
            return match.group(1)
    raise FileNotFoundError(f"no {dist} in {site}")


def _layer_for(root: str, base_site: str, sglang_site: str) -> str | None:
    """The transformers layer this sglang needs, built if missing; None if ``.venv``'s fits."""
    wants = _requires(sglang_site, "sglang")["transformers"]
    base = _version_in(base_site, "transformers")
    if wants.specifier.contains(base):
        return None
    (pinned,) = [s.version for s in wants.specifier]
    layer = os.path.join(root, "layers", f"transformers-{pinned}")
    if os.path.exists(os.path.join(layer, ".done")):
        return layer
    shutil.rmtree(layer, ignore_errors=True)
    _pip("--target", layer, f"transformers=={pinned}")
    tokenizers = _requires(layer, "transformers")["tokenizers"]
    sglang_pin = _requires(sglang_site, "sglang").get("tokenizers")
    if not tokenizers.specifier.contains(_version_in(base_site, "tokenizers")):
        _pip("--target", layer, str(sglang_pin or tokenizers))
    open(os.path.join(layer, ".done"), "w").close()
    return layer


def venv_for(release: str, root: str) -> str:
    """The python of a venv running sglang ``release`` over ``.venv`` (see the docstring)."""
    base_site = _site(sys.executable)
    if _version_in(base_site, "sglang") == release:
        return sys.executable
    root = os.path.abspath(root)  # the .pth lines are read from any working directory
    venv = os.path.join(root, "venvs", release)
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".compat-installed")
    if os.path.exists(stamp):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = _site(python)
    _pip("--target", site, f"sglang=={release}")
    layer = _layer_for(root, base_site, site)
    with open(os.path.join(site, "zz_compat_base.pth"), "w", encoding="utf-8") as handle:
        if layer:
            handle.write(layer + "\n")
        handle.write(f"import site; site.addsitedir({base_site!r})\n")
    shutil.rmtree(os.path.join(site, "bin"), ignore_errors=True)  # sglang's scripts, unused
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write(f"sglang=={release} transformers layer: {layer}\n")
    return python


def _run(python: str, args: list[str], log: str, timeout: int = 1800) -> tuple[int, str]:
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"\n$ {' '.join(args)}\n")
        handle.flush()
        out = subprocess.run(
            [python, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=handle, text=True,
            timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )  # fmt: skip
        handle.write(out.stdout)
    return out.returncode, out.stdout


def _cli(python: str, command: list[str], log: str) -> tuple[str, int]:
    cli = ["-m", "sglang_mtp_dequant.tools.cli"]
    rc, out = _run(python, [*cli, *command, "--json", "--log", log + ".cli"], log)
    try:
        return json.loads(out)["verdict"], rc
    except (ValueError, KeyError):
        return "no-json", rc


def check(release: str, root: str, base_tested: bool = False) -> Row:
    """``release`` installed and checked (see the module docstring); ``base_tested``: the
    release ``.venv`` holds had its tests run by ``make test`` already (CI), so they are not
    run again here."""
    started = time.perf_counter()
    support = releases.Support(release, releases.release_of(release))
    row = Row(release, support.supported)
    python = venv_for(release, root)
    log = os.path.join(root, "logs", f"{release}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    open(log, "w").close()
    problems: list[str] = []
    rc, out = _run(python, ["-c", PROBE], log)
    probe = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
    row.hooked, row.plugin_warnings = len(probe.get("hooked", ())), len(probe.get("warnings", ()))
    row.doctor, row.doctor_rc = _cli(python, ["doctor", FIXTURE], log)
    row.verify, row.verify_rc = _cli(python, ["verify", FIXTURE, "--reference", REFERENCE], log)
    if support.supported and base_tested and python == sys.executable:
        row.tests_by = "make test"
    elif support.supported:
        junit = os.path.join(root, "logs", f"{release}.junit.xml")
        rc, _ = _run(python, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml",
                              junit, *TESTS], log)  # fmt: skip
        row.run, row.passed = _junit_counts(junit)
        if rc != 0 or row.run == 0:
            problems.append(f"tests rc {rc}")
    if support.supported:
        # Qwen3.5's draft hooked; a WARNING only for a draft module that fails its own import
        # here (in some releases the GLM / DeepSeek modules import cutlass, a CUDA package)
        unimportable = [w for w in probe.get("warnings", ()) if "failed: ModuleNotFoundError" in w]
        row.missing_native = sorted(
            set(re.findall(r"No module named '([^']+)'", str(unimportable)))
        )
        if QWEN35 not in probe.get("hooked", ()) or len(unimportable) != row.plugin_warnings:
            problems.append(f"plugin: {probe or 'probe failed'}")
        if (row.doctor, row.doctor_rc) != ("ok", 0):
            problems.append(f"doctor {row.doctor}")
        if (row.verify, row.verify_rc) != ("ok", 0):
            problems.append(f"verify {row.verify}")
    else:  # below the range: nothing hooked, one WARNING, the CLI's own verdict
        if row.hooked or row.plugin_warnings != 1:
            problems.append(f"plugin: {probe or 'probe failed'}")
        for verdict, rc in ((row.doctor, row.doctor_rc), (row.verify, row.verify_rc)):
            if (verdict, rc) != ("needs-sglang", 6):
                problems.append(f"cli {verdict}({rc})")
    row.problems = tuple(problems)
    row.seconds = time.perf_counter() - started
    return row


def _junit_counts(path: str) -> tuple[int, int]:
    """``(run, passed)`` from pytest's junit XML (skips counted as run, not passed)."""
    import xml.etree.ElementTree as ET

    if not os.path.exists(path):
        return 0, 0
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    run = int(suite.get("tests", 0))
    bad = sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    return run, run - bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", help="default: every tested release")
    parser.add_argument("--root", default=os.path.join(ROOT, ".cache", "compat"))
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--base-tested",
        action="store_true",
        help="do not rerun the tests in .venv's own release (make test ran them: CI)",
    )
    args = parser.parse_args(argv)
    wanted = args.releases or list(releases.TESTED)
    for release in wanted:
        Version(release)  # a typo fails here, before anything is installed
    started = time.perf_counter()
    print(f"compat: sglang releases {' '.join(wanted)} over {sys.prefix}", flush=True)
    rows = []
    for release in wanted:
        row = check(release, args.root, base_tested=args.base_tested)
        rows.append(row)
        print(row.line(), flush=True)
    took = time.perf_counter() - started
    print(f"compat: {sum(r.ok for r in rows)}/{len(rows)} releases ok in {took:.0f} s; "
          f"logs in {os.path.join(args.root, 'logs')}")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=2)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
