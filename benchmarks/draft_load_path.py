"""Which of the plugin's files one draft load crosses before its first decoded tensor.

Usage::

    .venv/bin/python benchmarks/draft_load_path.py [--fixture q35_dense_w8a8_dynamic]

A new owner reads the draft load in the order it runs. This follows it: sglang's own
``DefaultModelLoader.load_model`` of the msmodelslim-written fixture's draft (the CPU set-up of
``cpu_sglang.prepare_cpu_process``, plugins loaded by sglang's ``load_plugins()``), with
``sys.setprofile`` recording every call into a file of the package from the plugin's hook on
the draft class's ``load_weights`` (``load_weights_with_dequant``: where the draft load starts;
the model's build before it, with the build-time layer check, is not counted) until the first
call of a decoder's ``decompress`` (the first tensor turned from codes into weights). It
prints the files in the order first entered, how many times the path enters each (an entry
is a call arriving from another file: re-entries are what a reader follows back and forth),
and ends with
``draft_load_path files <N> entries <M>``. Counts calls, not time: the machine does not matter,
but it is printed like every benchmark's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from types import FrameType
from typing import Any

import support_on_path  # noqa: F401  (test/ on sys.path, for support.*)
from machine import describe

from support.paths import fixture_dir


class PathRecorder:
    """Package files entered, in order, from the ``load_weights`` hook to the first
    ``decompress``."""

    def __init__(self, package_root: str) -> None:
        self.package_root = package_root
        self.order: list[str] = []
        self.entries: dict[str, int] = {}
        self.started = False
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done or event != "call":
            return
        here = frame.f_code.co_filename
        if not here.startswith(self.package_root):
            return
        if frame.f_code.co_name == "load_weights_with_dequant":
            self.started = True
        if not self.started:
            return
        if frame.f_code.co_name == "decompress":
            self.done = True
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller == here:
            return
        name = os.path.relpath(here, self.package_root)
        if name not in self.entries:
            self.order.append(name)
            self.entries[name] = 0
        self.entries[name] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fixture", default="q35_dense_w8a8_dynamic")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(describe(), flush=True)
    folder = fixture_dir(args.fixture)

    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    prepare_cpu_process(folder)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang_mtp_dequant
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, publish_context
    from support.cpu_sglang import load_model

    publish_context(folder)
    config = draft_model_config(folder)
    logging.disable(logging.WARNING)
    recorder = PathRecorder(os.path.dirname(sglang_mtp_dequant.__file__) + os.sep)
    sys.setprofile(recorder)
    try:
        load_model(config)
    finally:
        sys.setprofile(None)
        logging.disable(logging.NOTSET)
    if not recorder.done:
        print(f"no tensor was decoded in the draft load of {folder}: nothing to follow")
        return 1
    print(f"draft load of {args.fixture}: package files before the first decoded tensor")
    for name in recorder.order:
        print(f"  {name}  (entered {recorder.entries[name]}x)")
    total = sum(recorder.entries.values())
    tiers: dict[str, int] = {}
    for name in recorder.order:
        tier = name.split(os.sep, 1)[0]
        tiers[tier] = tiers.get(tier, 0) + 1
    print("by tier: " + ", ".join(f"{tier} {count}" for tier, count in tiers.items()))
    print(f"draft_load_path files {len(recorder.order)} entries {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
