"""The ``sglang-mtp-dequant`` console script: ``doctor`` and ``verify``.

Usage::

    sglang-mtp-dequant doctor /models/Qwen3.5-27B-w8a8          # table, verdict last
    sglang-mtp-dequant doctor acme/Qwen3.5-27B-w8a8 --download-dir /data/hub --json
    sglang-mtp-dequant verify /models/Qwen3.5-27B-w8a8 [--reference mtp_float.safetensors]
    sglang-mtp-dequant doctor -- python -m sglang.launch_server --model-path /m --device cuda

PATH is what sglang gets as ``--model-path`` (never downloaded); other flags are sglang launch
flags (``launch.py``). sglang's output goes to a log file of this run (or the terminal with
``-v``), the answer alone to stdout; the exit status is the verdict's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import CheckpointFormatError, DraftWeightError
from .sglang_support import import_failure, sglang_answer, too_old_sglang
from .verdicts import ERROR, EXIT_CODES, NEEDS_SGLANG, SGLANG_BROKEN, help_text

if TYPE_CHECKING:  # imported when used: the CLI answers --help without them
    from .launch import Launch
    from .preflight import InputError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"sglang-mtp-dequant {of('sglang-mtp-dequant')} (sglang {of('sglang')})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mtp-dequant",
        description="Explain and check quantized MTP drafts for sglang.",
        epilog=help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    doctor, verify = (
        sub.add_parser(
            name,
            help=summary,
            usage="%(prog)s [options] PATH [sglang launch flags] | [options] -- LAUNCH COMMAND",
            epilog=LAUNCH_HELP + help_text(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for name, summary in (
            ("doctor", "list every draft tensor, the planned action and a verdict"),
            ("verify", "load sglang's draft on the CPU, stock and with the plugin, and compare"),
        )
    )
    for command in (doctor, verify):
        command.add_argument(
            "path",
            nargs="?",
            help="checkpoint folder, snapshot folder or cached hub id (or --model-path in the "
            "launch command after --)",
        )
        command.add_argument("--download-dir", help="sglang's --download-dir (a hub cache)")
        command.add_argument("--revision", help="sglang's --revision for a hub id")
        command.add_argument(
            "-v", "--verbose", action="store_true", help="sglang's and the plugin's log lines too"
        )
        command.add_argument(
            "--log", help="where sglang's output goes (default: a new file per run)"
        )
        command.add_argument("--json", action="store_true", help="print JSON instead of text")
    doctor.add_argument(
        "--no-dry-run",
        action="store_true",
        help="do not build the draft class (no coverage; the verdict is then 'unchecked')",
    )
    doctor.add_argument(
        "--no-forms",
        action="store_true",
        help="do not also answer every launch form (F1-F4) with the draft's memory",
    )
    verify.add_argument(
        "--reference",
        metavar="FILE.safetensors",
        help="the original float draft tensors, to report the error against them too",
    )
    return parser


LAUNCH_HELP = """
sglang launch flags: any flags of `python -m sglang.launch_server` after PATH (--device
npu|cuda|cpu, --quantization, --speculative-algorithm, --speculative-draft-model-path,
--speculative-draft-model-quantization, --tp-size, --ep-size, ...), or the whole command after
`--`: `sglang-mtp-dequant doctor -- python -m sglang.launch_server --model-path M --device cuda`.
They are read by sglang's own ServerArgs parser; the answer is for that launch (platform
answers stood in on this machine, and said). Without them: as on NPU, draft quantization unset.
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command_words: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, command_words = argv[:cut], argv[cut + 1 :]
    args, flags = _parser().parse_known_args(argv)
    args.launch_words = command_words if command_words is not None else flags
    args.whole_command = command_words is not None
    if command_words is not None and flags:
        _parser().error(f"unrecognized arguments before --: {' '.join(flags)}")
    if args.path is None and not args.whole_command:
        _parser().error("give PATH, or the launch command after --")
    args.path_in_command = args.path is None
    if args.path is None:
        from .launch import checkpoint_in

        args.path = checkpoint_in(args.launch_words)
        if args.path is None:
            _parser().error("the launch command after -- has no --model-path")
    early = _preflight(args)
    if early is not None:
        print(early)
        return EXIT_CODES[ERROR]
    too_old = too_old_sglang()
    if too_old is not None:
        print(sglang_answer(args.command, args.path, NEEDS_SGLANG, too_old, args.json, None))
        return EXIT_CODES[NEEDS_SGLANG]
    log = None if args.verbose else (os.path.abspath(args.log) if args.log else _new_log(args))
    with _sglang_output(log) as say:
        try:
            launch, wrong = _launch(args)
            if wrong is not None:
                code, text = EXIT_CODES[ERROR], _usage_answer(args, wrong, log)
            elif args.command == "doctor":
                code, text = _doctor(args, log, launch)
            else:
                code, text = _verify(args, say, log, launch)
        except ImportError as exc:  # sglang's own import, never a checkpoint problem
            why = import_failure(exc)
            code = EXIT_CODES[SGLANG_BROKEN]
            text = sglang_answer(args.command, args.path, SGLANG_BROKEN, why, args.json, log)
    print(text)
    if log is not None:
        print(f"(sglang's own output: {log})", file=sys.stderr)
    return code


def _launch(args: argparse.Namespace) -> tuple[Launch | None, str | None]:
    """``(Launch, None)`` from the user's flags (or None without flags), or ``(None, why)``."""
    from .launch import LaunchError, parse_launch

    words = list(args.launch_words)
    for flag, value in (("--download-dir", args.download_dir), ("--revision", args.revision)):
        if value is not None:
            words += [flag, value]
    if not words:
        return None, None
    try:
        path = None if args.path_in_command else args.path
        return parse_launch(path, words), None
    except LaunchError as exc:
        return None, str(exc)


def _usage_answer(args: argparse.Namespace, wrong: str, log: str | None) -> str:
    if args.json:
        return json.dumps(
            {"verdict": ERROR, "reason": wrong, "requested": args.path, "problems": [wrong],
             "log": log}, indent=2)  # fmt: skip
    return _error_text(args, wrong, wrong)


def _error_text(args: argparse.Namespace, problem: object, reason: str) -> str:
    """The text answer to an input or a launch refused before anything is loaded."""
    head = f"sglang-mtp-dequant {args.command}: {args.path}"
    return f"{head}\n  problem: {problem}\n\nverdict: {ERROR} - {reason}"


def _new_log(args: argparse.Namespace) -> str:
    """A log file of this run only (two runs at once never share one)."""
    handle, path = tempfile.mkstemp(prefix=f"sglang-mtp-dequant-{args.command}-", suffix=".log")
    os.close(handle)
    return path


def _preflight(args: argparse.Namespace) -> str | None:
    """The answer to an input that is certainly wrong, before sglang is imported."""
    from .preflight import check_model_path, check_reference

    wrong = check_model_path(args.path, download_dir=args.download_dir)
    if wrong is None and args.command == "verify" and args.reference:
        wrong = check_reference(args.reference)
    if wrong is None:
        return None
    if args.json:
        return json.dumps(_input_error_json(args, wrong), indent=2)
    return _error_text(args, wrong, wrong.problem)


def _input_error_json(args: argparse.Namespace, wrong: InputError) -> dict[str, object]:
    from .verdicts import DOCTOR_SCHEMA_VERSION, VERIFY_SCHEMA_VERSION

    return {
        "schema_version": (
            DOCTOR_SCHEMA_VERSION if args.command == "doctor" else VERIFY_SCHEMA_VERSION
        ),
        "verdict": ERROR,
        "reason": wrong.problem,
        "error_kind": wrong.kind,
        "requested": args.path,
        "path": wrong.path,
        "problems": [str(wrong)],
    }


@contextlib.contextmanager
def _sglang_output(log: str | None) -> Iterator[Callable[[str], None]]:
    """stdout, stderr and the plugin's INFO lines into ``log`` (None: the terminal's stderr);
    yields a function printing progress to the terminal's stderr (stdout is the answer's)."""
    plugin_log = logging.getLogger("sglang_mtp_dequant")
    level = plugin_log.level
    plugin_log.setLevel(logging.INFO)
    if log is None:
        handler = logging.StreamHandler(sys.stderr)
        plugin_log.addHandler(handler)
        try:
            yield lambda line: print(line, file=sys.stderr, flush=True)
        finally:
            plugin_log.removeHandler(handler)
            plugin_log.setLevel(level)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w", encoding="utf-8") as handle:
        # the descriptors (C code, handlers holding the streams) and the Python streams
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        handler = logging.StreamHandler(handle)
        plugin_log.addHandler(handler)
        try:
            with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):

                def to_terminal(line: str) -> None:
                    os.write(saved[1], f"{line}\n".encode())

                yield to_terminal
        finally:
            plugin_log.removeHandler(handler)
            plugin_log.setLevel(level)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _doctor(args: argparse.Namespace, log: str | None, launch: Launch | None) -> tuple[int, str]:
    from .doctor import diagnose, render_text

    report = diagnose(
        args.path,
        download_dir=args.download_dir,
        revision=args.revision,
        dry_run=not args.no_dry_run,
        launch=launch,
        forms=not args.no_forms,
    )
    if args.json:
        text = json.dumps({**report.to_json(), "log": log}, indent=2)
    else:
        text = render_text(report)
    return EXIT_CODES[report.verdict], text


def _verify(
    args: argparse.Namespace, say: Callable[[str], None], log: str | None, launch: Launch | None
) -> tuple[int, str]:
    from .verdicts import VERIFY_SCHEMA_VERSION as SCHEMA_VERSION
    from .verify import render_verify, run_verify

    try:
        report = run_verify(
            args.path,
            download_dir=args.download_dir,
            revision=args.revision,
            reference=args.reference,
            say=say,
            launch=launch,
        )
    except (CheckpointFormatError, DraftWeightError) as exc:
        if args.json:
            out = {"schema_version": SCHEMA_VERSION, "verdict": ERROR, "reason": str(exc),
                   "requested": args.path, "problems": [str(exc)], "log": log}  # fmt: skip
            return EXIT_CODES[ERROR], json.dumps(out, indent=2)
        return EXIT_CODES[ERROR], f"verify: {exc}\nverdict: error - {exc}"
    if args.json:
        return EXIT_CODES[report.verdict], json.dumps({**report.to_json(), "log": log}, indent=2)
    return EXIT_CODES[report.verdict], render_verify(report)


if __name__ == "__main__":
    sys.exit(main())
