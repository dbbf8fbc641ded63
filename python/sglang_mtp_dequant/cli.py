"""The ``sglang-mtp-dequant`` console script: ``doctor`` and ``verify``.

Usage::

    sglang-mtp-dequant doctor /models/Qwen3.5-27B-w8a8          # table, verdict last
    sglang-mtp-dequant doctor /models/Qwen3.5-27B-w8a8 --json   # machine-readable
    sglang-mtp-dequant verify /models/Qwen3.5-27B-w8a8 [--reference mtp_float.safetensors]

Exit status: 0 when the verdict is ok, 1 when it is error, 2 for a usage error (argparse).
``doctor`` imports neither sglang nor a model (headers and small tensors only); ``verify``
imports sglang and builds its draft class on the CPU, so it is slower and needs the draft's
memory (it prints the figure).
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import CheckpointFormatError, DraftWeightError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mtp-dequant",
        description="Explain and check ModelSlim-quantized MTP drafts for sglang.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor", help="list every draft tensor, the planned action and a verdict"
    )
    doctor.add_argument("path", help="checkpoint folder (what sglang gets as --model-path)")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")
    verify = sub.add_parser(
        "verify", help="load sglang's draft on the CPU, stock and with the plugin, and compare"
    )
    verify.add_argument("path", help="checkpoint folder")
    verify.add_argument(
        "--reference",
        metavar="FILE.safetensors",
        help="the original float mtp.* tensors, to report the error against them too",
    )
    verify.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        return _doctor(args.path, args.json)
    return _verify(args.path, args.reference, not args.no_progress)


def _doctor(path: str, as_json: bool) -> int:
    from .doctor import diagnose, render_text

    report = diagnose(path)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report))
    return 0 if report.verdict == "ok" else 1


def _verify(path: str, reference: str | None, progress: bool) -> int:
    from .verify import render_verify, run_verify

    try:
        report = run_verify(path, reference=reference, progress=progress)
    except (CheckpointFormatError, DraftWeightError) as exc:
        print(f"verify: {exc}", file=sys.stderr)
        print("verdict: error", file=sys.stderr)
        return 1
    print(render_verify(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
