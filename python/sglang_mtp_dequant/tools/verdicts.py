"""The verdicts ``doctor`` and ``verify`` end with, and the exit code of each.

Usage::

    code = EXIT_CODES[report.verdict]       # what the console script returns
    print(help_text())                       # the table --help shows

One table for both commands: a script branches on the exit code, a person on the last line.
"""

from __future__ import annotations

OK = "ok"
ERROR = "error"
UNCHECKED = "unchecked"
UNSUPPORTED = "unsupported"
INACTIVE = "inactive"
NEEDS_SGLANG = "needs-sglang"
SGLANG_BROKEN = "sglang-broken"

#: versions of the JSON layouts ``doctor --json`` and ``verify --json`` write
DOCTOR_SCHEMA_VERSION = 4
VERIFY_SCHEMA_VERSION = 1

USAGE_EXIT = 2

EXIT_CODES = {
    OK: 0,
    ERROR: 1,
    UNCHECKED: 3,
    UNSUPPORTED: 4,
    INACTIVE: 5,
    NEEDS_SGLANG: 6,
    SGLANG_BROKEN: 7,
}

MEANINGS = {
    OK: "the draft loads as correct weights (the plugin decodes what needs decoding)",
    ERROR: "the draft would not load correctly, or an input is wrong (see the problems)",
    UNCHECKED: "nothing wrong was found, but part of the check could not run (the reason "
    "is given): not a clean bill",
    UNSUPPORTED: "the draft holds quantized tensors but its draft class is one this plugin "
    "does not hook (not supported yet)",
    INACTIVE: "the draft needs the plugin, but sglang in this environment would not load it "
    "(SGLANG_PLUGINS, or the package's entry point missing)",
    NEEDS_SGLANG: "the installed sglang is older than the releases this command supports; "
    "nothing was checked",
    SGLANG_BROKEN: "sglang itself failed to import something the command needs (its error is "
    "given): a problem of the sglang installation, not of the checkpoint; nothing was checked",
}


def help_text() -> str:
    """The verdicts and exit codes, for ``--help``."""
    lines = ["verdicts (last line of the output) and exit codes:"]
    for verdict, code in EXIT_CODES.items():
        lines.append(f"  {code}  {verdict:<12} {MEANINGS[verdict]}")
    lines.append(f"  {USAGE_EXIT}  {'(usage)':<12} a command-line usage error (argparse)")
    return "\n".join(lines)
