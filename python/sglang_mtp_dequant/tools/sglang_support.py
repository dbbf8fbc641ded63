"""The CLI's answers when sglang itself, not the checkpoint, is what stops a command.

Usage::

    too_old = too_old_sglang()              # "this command needs sglang >= 0.5.14 (found 0.5.11)"
    if too_old is not None: return EXIT_CODES[NEEDS_SGLANG], sglang_answer(...)
    except ImportError as exc: return EXIT_CODES[SGLANG_BROKEN], sglang_answer(...)

Why its own answers: an sglang below the supported range, or an import inside sglang that
fails, says nothing about the checkpoint; each gets its own verdict.
"""

from __future__ import annotations

import json

from ..serving import releases
from .verdicts import NEEDS_SGLANG, SGLANG_BROKEN


def too_old_sglang() -> str | None:
    """ "this command needs sglang >= X (found Y)" below the supported range, else None."""
    support = releases.installed()
    if support.version == "unknown" or support.supported:
        return None
    return (
        f"this command needs sglang >= {releases.MINIMUM} (found {support.version}); "
        f"releases {releases.range_text()} are tested"
    )


def import_failure(exc: ImportError) -> str:
    """What an ImportError raised inside an sglang call means, for the user."""
    support = releases.installed()
    where = f" (module {exc.name})" if exc.name else ""
    return (
        f"sglang {support.version} failed to import what this command needs{where}: "
        f"{type(exc).__name__}: {exc}. This is a problem of the sglang installation, not of "
        f"the checkpoint; the releases this command is tested on are {releases.range_text()}"
    )


def sglang_answer(
    command: str, path: str, verdict: str, reason: str, json_out: bool, log: str | None
) -> str:
    """The whole answer (text, or ``--json``) for ``verdict`` NEEDS_SGLANG / SGLANG_BROKEN."""
    assert verdict in (NEEDS_SGLANG, SGLANG_BROKEN), verdict
    if json_out:
        return json.dumps(
            {
                "verdict": verdict,
                "reason": reason,
                "requested": path,
                "sglang": releases.installed().version,
                "supported_sglang": releases.range_text(),
                "problems": [reason],
                "log": log,
            },
            indent=2,
        )
    head = f"sglang-mtp-dequant {command}: {path}"
    return f"{head}\n  problem: {reason}\n\nverdict: {verdict} - {reason}"
