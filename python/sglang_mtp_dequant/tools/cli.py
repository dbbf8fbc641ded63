"""The ``sglang-mtp-dequant`` console script: ``doctor`` and ``verify``.

Usage::

    sglang-mtp-dequant doctor /models/Qwen3.5-27B-w8a8          # table, verdict last
    sglang-mtp-dequant doctor acme/Qwen3.5-27B-w8a8 --download-dir /data/hub --json
    sglang-mtp-dequant verify /models/Qwen3.5-27B-w8a8 [--reference mtp_float.safetensors]

PATH is what sglang gets as ``--model-path``: a folder, a Hugging Face snapshot folder, or a
hub id in the local cache (never downloaded), with ``--download-dir`` / ``--revision`` as
sglang takes them. Exit status: 0 when the verdict is ok, 1 when it is error, 2 for a usage
error (argparse). Both commands import sglang to resolve the checkpoint as it would; sglang's
own output (import-time warnings, its loader's log lines and progress bars) goes to a log file
whose path is printed last, or to the terminal with ``-v``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

from ..errors import CheckpointFormatError, DraftWeightError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mtp-dequant",
        description="Explain and check quantized MTP drafts for sglang.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor", help="list every draft tensor, the planned action and a verdict"
    )
    verify = sub.add_parser(
        "verify", help="load sglang's draft on the CPU, stock and with the plugin, and compare"
    )
    for command in (doctor, verify):
        command.add_argument("path", help="checkpoint folder, snapshot folder or cached hub id")
        command.add_argument("--download-dir", help="sglang's --download-dir (a hub cache)")
        command.add_argument("--revision", help="sglang's --revision for a hub id")
        command.add_argument("-v", "--verbose", action="store_true", help="sglang's output too")
        command.add_argument("--log", help="where sglang's output goes (default: a temp file)")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")
    doctor.add_argument(
        "--no-dry-run", action="store_true", help="do not build the draft class (no coverage)"
    )
    verify.add_argument(
        "--reference",
        metavar="FILE.safetensors",
        help="the original float draft tensors, to report the error against them too",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    log = args.log or os.path.join(tempfile.gettempdir(), f"sglang-mtp-dequant-{args.command}.log")
    with _sglang_output(None if args.verbose else log) as say:
        if args.command == "doctor":
            code, text = _doctor(args)
        else:
            code, text = _verify(args, say)
    print(text)
    if not args.verbose:
        print(f"(sglang's own output: {log})", file=sys.stderr)
    return code


@contextlib.contextmanager
def _sglang_output(log: str | None) -> Iterator[Callable[[str], None]]:
    """Send everything written to stdout and stderr (sglang's warnings, log lines, progress
    bars) to ``log``; yield a function that still prints to the terminal."""
    if log is None:
        yield lambda line: print(line, flush=True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w", encoding="utf-8") as handle:
        # the descriptors (C code, handlers that kept the original streams) and the Python
        # streams (whatever replaced them, e.g. a test's capture)
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
                yield lambda line: os.write(saved[0], f"{line}\n".encode())
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _doctor(args: argparse.Namespace) -> tuple[int, str]:
    from .doctor import diagnose, render_text

    report = diagnose(
        args.path,
        download_dir=args.download_dir,
        revision=args.revision,
        dry_run=not args.no_dry_run,
    )
    text = json.dumps(report.to_json(), indent=2) if args.json else render_text(report)
    return (0 if report.verdict == "ok" else 1), text


def _verify(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[int, str]:
    from .verify import render_verify, run_verify

    try:
        report = run_verify(
            args.path,
            download_dir=args.download_dir,
            revision=args.revision,
            reference=args.reference,
            say=say,
        )
    except (CheckpointFormatError, DraftWeightError) as exc:
        return 1, f"verify: {exc}\nverdict: error"
    return (0 if report.ok else 1), render_verify(report)


if __name__ == "__main__":
    sys.exit(main())
