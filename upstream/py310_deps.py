#!/usr/bin/env python3
"""The dependency set sglang's CPU CI installs (``uv pip install -e "python[dev]"``), derived
from the pinned 0.5.23 wheel's METADATA for CPython 3.10 on Linux x86_64, and its lock file.

The wheel is all there is of sglang 0.5.23 here (``upstream/BASE``): it has no
pyproject.toml under python/, so ``python[dev]`` is read from its ``Requires-Dist`` lines, the
base set plus the ``dev`` extra and every ``sglang[...]`` extra it pulls in, with each marker
evaluated for the interpreter sglang's CPU stage sets up (3.10, Linux, x86_64). The wheel's
own ``Requires-Python: >=3.11`` is its build's, not a requirement of the source CI installs
(``upstream/README.md``, "Python 3.10, as sglang's CPU CI").

Usage (``make upstream-py310-lock``; needs ``packaging``, which the project venv has)::

    python upstream/py310_deps.py requirements [--wheel W]   # print the derived set
    python upstream/py310_deps.py lock --uv UV --python PY310 [--wheel W]   # -> the lock

``lock`` resolves the set with uv (the resolver the CI stage uses, with its
``--index-strategy unsafe-best-match --prerelease allow``) for 3.10 on manylinux x86_64 and
writes ``requirements/upstream-py310.txt``; ``make upstream-py310`` installs exactly that.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "upstream-py310.txt"
PROJECT = "sglang"
EXTRAS = ("dev",)

#: the marker environment of sglang's CPU stage: actions/setup-python 3.10 on ubuntu-latest
CI_ENVIRONMENT = {
    "implementation_name": "cpython",
    "implementation_version": "3.10.13",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.10.13",
    "python_version": "3.10",
    "sys_platform": "linux",
}

#: requirements of ``python[dev]`` that cannot be installed for CPython 3.10 from PyPI, and
#: why (each checked by resolving with it: ``lock`` fails naming it). Everything else is in.
LEFT_OUT: dict[str, str] = {
    "tml-renderers": "PyPI has 0.1.0 (the pin) for cp311 only, no cp310 wheel and no sdist; "
    "sglang imports it only in its Inkling chat renderer (srt/parser/inkling_*.py, "
    "entrypoints/openai/serving_inkling.py)",
}


def wheel_metadata(wheel: Path) -> str:
    """The METADATA text of ``wheel`` (``<name>-<version>.dist-info/METADATA``)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one .dist-info/METADATA, found {names}")
        return archive.read(names[0]).decode()


def requires_dist(metadata: str) -> list[Requirement]:
    """The ``Requires-Dist`` headers of a METADATA text, parsed (headers only: the long
    description after the first blank line is free text)."""
    headers = email.parser.Parser().parsestr(metadata, headersonly=True)
    return [Requirement(value) for value in headers.get_all("Requires-Dist") or []]


def _applies(req: Requirement, extra: str, environment: dict[str, str]) -> bool:
    if req.marker is None:
        return extra == ""
    return req.marker.evaluate({**environment, "extra": extra})


def requirement_set(
    metadata: str,
    extras: tuple[str, ...] = EXTRAS,
    environment: dict[str, str] = CI_ENVIRONMENT,
    project: str = PROJECT,
) -> list[str]:
    """What ``pip install "<project>[<extras>]"`` asks for in ``environment``: the base
    requirements and those of each extra, following the project's references to its own
    extras (``sglang[test]``), markers evaluated and dropped. One line per requirement as
    written in METADATA (specifier and extras kept), sorted by name; a name required twice
    keeps both lines (the resolver intersects them)."""
    reqs = requires_dist(metadata)
    own = canonicalize_name(project)
    wanted, pending, seen = [], [""] + list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for req in reqs:
            if not _applies(req, extra, environment):
                continue
            if canonicalize_name(req.name) == own:
                pending.extend(sorted(req.extras))
                continue
            line = _without_marker(req)
            if line not in wanted:
                wanted.append(line)
    return sorted(wanted, key=lambda s: (canonicalize_name(Requirement(s).name), s))


def _without_marker(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def split_left_out(
    lines: list[str], left_out: dict[str, str] = LEFT_OUT
) -> tuple[list[str], list[str]]:
    """(kept, dropped) lines: dropped are those ``left_out`` names."""
    names = {canonicalize_name(n) for n in left_out}
    kept = [s for s in lines if canonicalize_name(Requirement(s).name) not in names]
    dropped = [s for s in lines if s not in kept]
    return kept, dropped


def left_out_reason(line: str) -> str:
    names = {canonicalize_name(name): why for name, why in LEFT_OUT.items()}
    return names[canonicalize_name(Requirement(line).name)]


def default_wheel() -> Path:
    sys.path.insert(0, str(ROOT / "upstream"))
    import tree

    base = tree.read_base()
    return tree.CACHE / base["wheel"]


def lock(wheel: Path, uv: str, python: str, out: Path = LOCK) -> int:
    """Resolve the set with uv for CPython 3.10 on manylinux x86_64 and write ``out``."""
    kept, dropped = split_left_out(requirement_set(wheel_metadata(wheel)))
    header = [
        f"# python[dev] of {wheel.name} (its METADATA) for CPython 3.10 on Linux",
        "# x86_64, resolved by uv as sglang's CPU CI stage resolves it (--index-strategy",
        "# unsafe-best-match --prerelease allow). Do not edit: `make upstream-py310-lock`",
        "# (upstream/py310_deps.py) writes it.",
    ]
    header += [f"# left out: {line}: {left_out_reason(line)}" for line in dropped]
    with tempfile.TemporaryDirectory(prefix="py310-lock-") as tmp:
        source = Path(tmp) / "python-dev.in"
        source.write_text("\n".join(kept) + "\n")
        cmd = [
            uv, "pip", "compile", str(source), "-o", str(Path(tmp) / "lock.txt"),
            "--python", python, "--python-platform", "x86_64-manylinux_2_28",
            "--index-strategy", "unsafe-best-match", "--prerelease", "allow",
            "--no-header", "--no-annotate", "--quiet",
        ]  # fmt: skip
        proc = subprocess.run(cmd, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
        if proc.returncode != 0:
            return proc.returncode
        body = (Path(tmp) / "lock.txt").read_text()
    out.write_text("\n".join(header) + "\n" + body)
    pins = sum(1 for line in body.splitlines() if "==" in line)
    print(f"{out.relative_to(ROOT)}: {pins} pins")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["requirements", "lock"])
    parser.add_argument("--wheel", type=Path, default=None)
    parser.add_argument("--uv", default="uv")
    parser.add_argument("--python", default="python3.10", help="the 3.10 interpreter")
    args = parser.parse_args(argv)
    wheel = args.wheel or default_wheel()
    if args.command == "requirements":
        kept, dropped = split_left_out(requirement_set(wheel_metadata(wheel)))
        print("\n".join(kept))
        for line in dropped:
            print(f"# left out: {line}: {left_out_reason(line)}")
        return 0
    return lock(wheel, args.uv, args.python)


if __name__ == "__main__":
    sys.exit(main())
