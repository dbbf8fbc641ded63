"""The fast unit layer (``make test-fast``): formats, naming, plan, ownership; no sglang import.

These tests exercise the package's own rules on checkpoints written in the test, in seconds,
with no sglang module imported (checked when a run collects only this folder: the run fails
if anything imported sglang). The behaviour through sglang's real classes and server is the
rest of the suite.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_ONLY_UNIT: list[bool] = []


def pytest_collection_modifyitems(session: pytest.Session, config, items) -> None:
    _ONLY_UNIT.append(bool(items) and all(str(i.path).startswith(HERE + os.sep) for i in items))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not (_ONLY_UNIT and _ONLY_UNIT[-1]):
        return
    imported = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    if imported:
        print(f"\nthe unit layer imported sglang ({imported[:3]} ...): it must not", flush=True)
        session.exitstatus = 1
