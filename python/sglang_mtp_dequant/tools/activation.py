"""Would sglang, in this environment, load this plugin? Asked of sglang's own plugin loader.

Usage::

    found = plugin_activation()
    if not found.active:
        print(found.why)    # "SGLANG_PLUGINS='none' does not name mtp_dequant: ..."

Rather than restate sglang's rules, this asks its ``load_plugins_by_group`` which plugins it
would load, and only then explains a missing one.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: this package's name in sglang's ``sglang.srt.plugins`` entry-point group (pyproject.toml)
ENTRY_POINT = "mtp_dequant"


@dataclass(frozen=True)
class Activation:
    """Whether sglang would run the plugin here, and why (or why not)."""

    active: bool
    why: str
    notes: tuple[str, ...] = ()


def plugin_activation() -> Activation:
    """Ask sglang's plugin loader (see the module docstring)."""
    import sglang
    from sglang.srt.environ import envs
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    from ..serving import sglang_private
    from ..serving.plugin import register

    where = f"the environment of {sys.executable} (sglang from {os.path.dirname(sglang.__file__)})"
    ours = [ep for ep in _entry_points(GENERAL_PLUGINS_GROUP) if ep.name == ENTRY_POINT]
    if not ours:
        return Activation(
            False,
            f"no entry point {ENTRY_POINT!r} in group {GENERAL_PLUGINS_GROUP} in {where}: "
            "sglang would not load the plugin; pip install sglang-mtp-dequant into the "
            "environment that runs sglang",
        )
    loaded = load_plugins_by_group(GENERAL_PLUGINS_GROUP, sglang_private.excluded_plugin_dists())
    if ENTRY_POINT not in loaded:
        allowed = envs.SGLANG_PLUGINS.get()
        if allowed:
            why = (
                f"SGLANG_PLUGINS={allowed!r} does not name {ENTRY_POINT}: sglang loads only the "
                f"plugins it names; add {ENTRY_POINT} (comma-separated) or unset it"
            )
        elif envs.SGLANG_PLATFORM.get():
            why = (
                f"SGLANG_PLATFORM={envs.SGLANG_PLATFORM.get()!r} excludes the distribution that "
                f"provides {ENTRY_POINT}"
            )
        else:
            why = (
                f"sglang failed to load the entry point {ours[0].value} (its error is in the "
                "log file)"
            )
        return Activation(False, why)
    function, dist = loaded[ENTRY_POINT]
    notes: tuple[str, ...] = ()
    if function is not register:
        notes = (
            f"the entry point {ENTRY_POINT} in {where} loads {ours[0].value} from "
            f"{getattr(sys.modules.get(function.__module__), '__file__', '?')}, not this "
            f"copy of the package ({sys.modules[register.__module__].__file__}): two installs",
        )
    return Activation(
        True, f"sglang loads the entry point {ENTRY_POINT} (distribution {dist})", notes
    )


def _entry_points(group: str) -> list[EntryPoint]:
    from importlib.metadata import entry_points

    return list(entry_points(group=group))
