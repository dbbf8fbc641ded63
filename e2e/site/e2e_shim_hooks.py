"""What every CPU shim of the end-to-end servers shares: its log line, and acting after an import.

Usage (in a shim module of this folder)::

    from e2e_shim_hooks import after_import, announce_first_call, say

    after_import("sglang.some.module", lambda module: ...)   # runs once the module executed
    announce_first_call(module, "function", "what the stand-in did")
    say("something the harness looks for")

Every line starts with ``MARK``; the harness (``e2e/checks.py``) requires the lines
of the shims a run needs in that server's log, so a shim that did not take effect fails the
run instead of passing silently. Lines go to stderr, which the harness writes to the log.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType

MARK = "sglang-mtp-dequant e2e shim:"

_ACTIONS: dict[str, list[Callable[[ModuleType], None]]] = {}


def say(message: str) -> None:
    """One shim line in the server's log (with the process id: TP ranks are told apart)."""
    print(f"{MARK} {message} (pid {os.getpid()})", file=sys.stderr, flush=True)


def announce_first_call(owner, name: str, message: str) -> Callable:
    """Wrap ``owner.name`` so that its first call prints ``message``; returns the wrapper."""
    original = getattr(owner, name)
    called: list[bool] = []

    @functools.wraps(original)
    def announced(*args, **kwargs):
        if not called:
            called.append(True)
            say(message)
        return original(*args, **kwargs)

    setattr(owner, name, announced)
    return announced


def after_import(module_name: str, action: Callable[[ModuleType], None]) -> None:
    """Run ``action(module)`` right after ``module_name`` executes (now, if it already did)."""
    module = sys.modules.get(module_name)
    if module is not None:
        action(module)
        return
    _ACTIONS.setdefault(module_name, []).append(action)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """After one of the registered modules executes, apply its actions to it."""

    def find_spec(self, fullname, path, target=None):
        actions = _ACTIONS.get(fullname)
        if not actions:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_act(module):
            exec_module(module)
            for action in actions:
                action(module)

        spec.loader.exec_module = exec_and_act
        return spec
