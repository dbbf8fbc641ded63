"""The sglang releases this package supports, and the check every process makes against them.

Usage::

    support = releases.installed()          # Support(version="0.5.20", release=(0, 5, 20), ...)
    if not support.supported:
        logger.warning("%s", support.out_of_range())   # names the version and the range

Why a declared range: sglang's private surface moves between releases. ``TESTED`` is what
``make compat`` proved; below ``MINIMUM`` the plugin registers nothing and the CLI refuses; a
newer release is allowed, each hook target checked on its own.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

#: every sglang release the matrix ran on, oldest first
TESTED: tuple[str, ...] = tuple(f"0.5.{minor}" for minor in range(14, 24))
#: the oldest supported release: the plugin registers nothing below it
MINIMUM = TESTED[0]
#: the newest release proven; newer ones load the plugin, each hook target checked
NEWEST_TESTED = TESTED[-1]


def since(release: str) -> tuple[str, ...]:
    """The tested releases from ``release`` on (a name that appeared in it)."""
    return TESTED[TESTED.index(release) :]


def before(release: str) -> tuple[str, ...]:
    """The tested releases before ``release`` (a name it changed or removed)."""
    return TESTED[: TESTED.index(release)]


def release_of(version: str) -> tuple[int, ...] | None:
    """The numeric release of a version string (``"0.5.17.dev3+g1a2b"`` -> (0, 5, 17), a dev
    build counting as the release it precedes); None if it does not start with a number."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def range_text() -> str:
    return f"{MINIMUM} to {NEWEST_TESTED}"


@dataclass(frozen=True)
class Support:
    """An installed sglang measured against the declared range."""

    version: str
    release: tuple[int, ...] | None

    @property
    def supported(self) -> bool:
        """At least ``MINIMUM`` (an unreadable version too: each hook target is checked)."""
        return self.release is None or self.release >= _MINIMUM

    @property
    def tested(self) -> bool:
        return self.release is not None and _MINIMUM <= self.release[:3] <= _NEWEST

    def out_of_range(self) -> str:
        """The one WARNING of a process whose sglang is older than the range."""
        return (
            f"sglang-mtp-dequant: sglang {self.version} is older than the releases this plugin "
            f"supports ({range_text()}); it registers no hook, and ModelSlim-quantized MTP "
            f"draft weights load as stock sglang {self.version} loads them. What to do: run "
            f"sglang >= {MINIMUM}, or serve the draft quantized "
            "(--speculative-draft-model-quantization modelslim)"
        )


_MINIMUM = release_of(MINIMUM) or ()
_NEWEST = release_of(NEWEST_TESTED) or ()


def installed_version() -> str:
    """The installed sglang distribution's version, or "unknown"."""
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - not installed, or broken metadata
        return "unknown"


def installed() -> Support:
    version = installed_version()
    return Support(version, release_of(version))


def module_absent(module: str) -> bool:
    """Whether this sglang has no module ``module`` (a draft family added after its release); a
    module that fails to import is not absent (``plugin.unresolvable`` reports it)."""
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True
    except Exception:  # noqa: BLE001 - a parent that fails to import: not absent, reported
        return False
