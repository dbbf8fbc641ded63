"""The server table of every launch form: per fixture, F1-F4 with the plugin off and on.

Usage (``make e2e-forms`` runs the first line)::

    .venv/bin/python -m e2e.forms                    # the bundled dense, MoE and hybrid fixtures
    .venv/bin/python -m e2e.forms test/fixtures/e2e/w8a8 /m/export=/m/float --markdown t.md

Each fixture is ONE ModelSlim folder (``FOLDER``, or ``FOLDER=FLOAT`` naming its float folder;
by default the sibling ``<first word>_float``, else ``float``: ``moe_w8a8`` -> ``moe_float``).
Per fixture, sglang's own server (``e2e/server.py``, the CPU stand-ins of ``e2e/site/``) is
started for: the float folder with its own MTP head (EAGLE, flagless, plugin off: the ceiling);
the fixture without speculation with the plugin off and on (the tokens each cell of that plugin
state must reproduce); and each launch form of ``e2e/plan.py`` (F1 flagless, F2
``--quantization modelslim``, F3 ``--speculative-draft-model-quantization unquant``, F4
``--speculative-draft-model-quantization modelslim``) with the plugin off
(``SGLANG_PLUGINS=none``) and on. Short runs: 2 held-out prompts x 16 greedy tokens.

Each cell is sglang's own accept length (``completion_tokens`` / ``spec_verify_ct`` from
``/generate``'s ``meta_info``), whether it is >= ``checks.ACCEPT_SHARE`` x the float draft's,
and whether the tokens equal the run without speculation; or, for a server that stopped, the
first line of the last exception of the real traceback in its log (sglang's own error, quoted);
where that
exception is an Ascend operator with no CPU stand-in (``torch.ops.npu.*``, ``torch_npu``), the
cell names that NPU-only piece. The table is printed and written (``--markdown``, ``--json``).

Exit status 1 when a server that served emitted tokens other than its run without speculation,
a plugin-on cell that served is under that share of float, the float run did not serve, or a CPU
stand-in a served server needed did not announce itself; a server that stops is a cell, not a
failure (the table says which forms serve).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field

from e2e.checks import ACCEPT_SHARE, PLUGIN_LINE, check_shims, first_difference
from e2e.client import Generation, generate
from e2e.inputs import InputError, check_model, check_target, heldout_prompts
from e2e.plan import FORMS, form_run
from e2e.server import Server, ServerError, ServerRun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")
#: the bundled fixtures, in the order they are served (dense and MoE first: the cheapest)
DEFAULT_FIXTURES = ("w8a8", "moe_w8a8", "hybrid_w8a8", "moe_float_experts")
#: the Ascend operator namespace and package: what keeps a server off the CPU
NPU_PIECE = (
    re.compile(r"torch\.ops\.npu\.(\w+)"),
    re.compile(r"'_OpNamespace' 'npu' object has no attribute '(\w+)'"),
    re.compile(r"No module named '(torch_npu[\w.]*)'"),
)
#: an NPU-only piece sglang names in its own words: ModelSlim's MoE schemes run their experts
#: through the ``ascend`` MoE runner (``ModelSlimMoEMethod.create_moe_runner``), whose
#: permutes are registered for the NPU's ``ascend_tp`` token dispatcher only
#: (``moe_runner/ascend.py``); off an NPU the dispatcher is ``standard``
ASCEND_RUNNER = re.compile(r"Pre-permute function for (\w+) to ascend is not registered")
#: exception lines that wrap the real one (the launcher's, after a scheduler died)
WRAPPERS = (
    "scheduler is dead",
    "Initialization failed",
    "KeyboardInterrupt",
    "SystemExit",
    "ChildProcessError",
)
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Fixture:
    """One ModelSlim folder and the float folder of the same model."""

    name: str
    folder: str
    float_folder: str


@dataclass
class Cell:
    """One server of the table: what it served, or how it stopped."""

    label: str
    run: ServerRun
    log_path: str = ""
    generations: list[Generation] = field(default_factory=list)
    error: str | None = None  # the last exception line of the real traceback
    npu_piece: str | None = None  # the Ascend operator that stopped it, if any
    start_seconds: float = 0.0

    @property
    def served(self) -> bool:
        return self.error is None

    @property
    def accept_length(self) -> float | None:
        steps = sum(int(g.meta.get("spec_verify_ct", 0)) for g in self.generations)
        tokens = sum(int(g.meta.get("completion_tokens", 0)) for g in self.generations)
        return tokens / steps if steps else None

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "command": self.run.shell_command(0),
            "plugin": self.run.plugin,
            "served": self.served,
            "accept_length": self.accept_length,
            "error": self.error,
            "npu_piece": self.npu_piece,
            "start_seconds": round(self.start_seconds, 1),
            "log": self.log_path,
            "output_ids": [g.output_ids for g in self.generations],
            "meta_info": [g.meta for g in self.generations],
        }


def float_folder_of(folder: str) -> str:
    """The float folder beside ``folder``: ``<first word>_float`` if it exists, else
    ``float`` (the bundled fixtures' layout)."""
    parent, name = os.path.split(os.path.abspath(folder))
    sibling = os.path.join(parent, f"{name.split('_')[0]}_float")
    return sibling if os.path.isdir(sibling) else os.path.join(parent, "float")


def parse_fixture(spec: str) -> Fixture:
    folder, _, float_folder = spec.partition("=")
    folder = os.path.abspath(folder)
    return Fixture(
        os.path.basename(folder), folder, os.path.abspath(float_folder or float_folder_of(folder))
    )


def default_fixtures() -> list[str]:
    """The bundled fixtures present in this checkout (the FLOAT-experts export once it lands)."""
    paths = [os.path.join(FIXTURES, name) for name in DEFAULT_FIXTURES]
    return [path for path in paths if os.path.isdir(path)]


def fixture_runs(fixture: Fixture, forms: list[str]) -> list[tuple[str, ServerRun]]:
    """Every server of one fixture's rows, in start order, each with its cell's label."""
    runs = [
        ("float", ServerRun("float", fixture.float_folder, True, False, draft_quantization=None)),
    ]
    for plugin in (False, True):
        state = "on" if plugin else "off"
        no_spec = FORMS["F1"]
        label = f"reference-{state}"
        runs.append((label, form_run(label, fixture.folder, no_spec, False, plugin)))
        for name in forms:
            label = f"{name}-{state}"
            runs.append((label, form_run(label, fixture.folder, FORMS[name], True, plugin)))
    return runs


def tracebacks(log_text: str) -> list[tuple[str, str]]:
    """Each traceback in a server's log: its frames' text and its exception's first line."""
    lines = log_text.splitlines()
    found: list[tuple[str, str]] = []
    index = 0
    while index < len(lines):
        if TRACEBACK not in lines[index]:
            index += 1
            continue
        start = index = index + 1
        while index < len(lines) and (not lines[index].strip() or lines[index][0].isspace()):
            index += 1
        if index < len(lines):
            found.append(("\n".join(lines[start:index]), lines[index].strip()))
        index += 1
    return found


def _real(log_text: str) -> tuple[str, str] | None:
    """The real traceback: the last whose exception is not a wrapper the launcher raises
    after a child died (else the last one)."""
    found = tracebacks(log_text)
    real = [tb for tb in found if not any(w in tb[1] for w in WRAPPERS)]
    return (real or found or [None])[-1]


def exception_line(log_text: str) -> str | None:
    """The first line of the last exception of the real traceback in a server's log."""
    real = _real(log_text)
    return None if real is None else real[1]


def npu_piece(log_text: str, error: str | None) -> str | None:
    """The Ascend operator or package the real traceback stops in (``torch.ops.npu.X``), or
    sglang's Ascend MoE runner; None if it names none (the log's other lines, such as the
    stand-ins' announcements, are not read)."""
    runner = ASCEND_RUNNER.search(error or "")
    if runner:
        return f"sglang's `ascend` MoE runner (NPU dispatcher only, here `{runner.group(1)}`)"
    real = _real(log_text)
    frames = real[0] if real is not None and real[1] == error else ""
    for text in (error or "", frames):
        for pattern in NPU_PIECE:
            match = pattern.search(text)
            if match:
                name = match.group(1)
                return name if name.startswith("torch_npu") else f"torch.ops.npu.{name}"
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def serve(label: str, run: ServerRun, prompts, new_tokens: int, args, log_dir: str) -> Cell:
    """Start ``run``'s server, generate, stop it; a server that stops becomes an error cell."""
    cell = Cell(label, run)
    started = time.perf_counter()
    server = Server(run, log_dir, start_timeout=args.start_timeout)
    cell.log_path = server.log_path
    try:
        with server:
            cell.start_seconds = time.perf_counter() - started
            for prompt in prompts:
                cell.generations.append(generate(server.url, prompt, new_tokens))
    except (ServerError, OSError) as exc:
        cell.start_seconds = time.perf_counter() - started  # until it stopped
        text = _read(cell.log_path)
        cell.generations = []
        cell.error = exception_line(text) or str(exc).splitlines()[0]
        cell.npu_piece = npu_piece(text, exception_line(text))
    return cell


def tokens_equal(cell: Cell, reference: Cell | None) -> str:
    """'yes', 'no (prompt i from token t)', or '-' where either did not serve."""
    if reference is None or not reference.served or not cell.served:
        return "-"
    for i, (want, got) in enumerate(zip(reference.generations, cell.generations, strict=True)):
        if want.output_ids != got.output_ids:
            return f"no (prompt {i} from token {first_difference(want.output_ids, got.output_ids)})"
    return "yes"


def describe(cell: Cell) -> str:
    if cell.served:
        length = cell.accept_length
        if length is None:
            return "serves (no speculation)"
        steps = sum(int(g.meta.get("spec_verify_ct", 0)) for g in cell.generations)
        tokens = sum(int(g.meta.get("completion_tokens", 0)) for g in cell.generations)
        return f"**{length:.3f}** ({tokens}/{steps})"
    if cell.error == NOT_RUN:
        return NOT_RUN
    if cell.npu_piece:
        piece = cell.npu_piece if "`" in cell.npu_piece else f"`{cell.npu_piece}`"
        return f"NPU-only: {piece}, no CPU stand-in (`{cell.error}`)"
    return f"stops: `{cell.error}`"


#: the error of a cell an interrupted table never started
NOT_RUN = "not run (the table was stopped before it)"


def complete(fixture: Fixture, cells: dict[str, Cell], forms: list[str]) -> dict[str, Cell]:
    """``cells`` with every cell of the fixture's rows, the missing ones ``NOT_RUN``."""
    return {
        label: cells.get(label) or Cell(label, run, error=NOT_RUN)
        for label, run in fixture_runs(fixture, forms)
    }


def fixture_rows(fixture: Fixture, cells: dict[str, Cell], forms: list[str]) -> list[str]:
    cells = complete(fixture, cells, forms)
    floating = cells["float"]
    ceiling = floating.accept_length if floating.served else None
    rows = [
        f"| {fixture.name} | float ({os.path.basename(fixture.float_folder)}) | off | "
        f"{describe(floating)} | ceiling | - |"
    ]
    for state in ("off", "on"):
        reference = cells[f"reference-{state}"]
        rows.append(
            f"| {fixture.name} | no speculation | {state} | {describe(reference)} | - | - |"
        )
        for name in forms:
            cell = cells[f"{name}-{state}"]
            share = "-"
            if cell.served and ceiling and cell.accept_length is not None:
                ratio = cell.accept_length / ceiling
                share = f"{'yes' if ratio >= ACCEPT_SHARE else 'no'} ({ratio:.2f})"
            rows.append(
                f"| {fixture.name} | {name} {FORMS[name].label} | {state} | {describe(cell)} | "
                f"{share} | {tokens_equal(cell, reference)} |"
            )
    return rows


HEADER = (
    "| fixture | launch form | plugin | sglang accept length (tokens / verify), or why it stops "
    f"| >= {ACCEPT_SHARE} x float (share) | tokens = no speculation |",
    "|---|---|---|---|---|---|",
)


def failures_of(fixture: Fixture, cells: dict[str, Cell], forms: list[str]) -> list[str]:
    """What makes the table fail (see the module docstring)."""
    cells = complete(fixture, cells, forms)
    out = [f"{fixture.name} {c.label}: {NOT_RUN}" for c in cells.values() if c.error == NOT_RUN]
    floating = cells["float"]
    if not floating.served:
        out.append(f"{fixture.name}: the float run stopped: {floating.error}")
    ceiling = floating.accept_length if floating.served else None
    for state in ("off", "on"):
        reference = cells[f"reference-{state}"]
        for name in forms:
            cell = cells[f"{name}-{state}"]
            equal = tokens_equal(cell, reference)
            if equal.startswith("no"):
                out.append(f"{fixture.name} {name} plugin {state}: tokens {equal}")
            if state == "on" and cell.served and ceiling and cell.accept_length is not None:
                if cell.accept_length < ACCEPT_SHARE * ceiling:
                    out.append(
                        f"{fixture.name} {name} plugin on: accept length "
                        f"{cell.accept_length:.3f} < {ACCEPT_SHARE} x float ({ceiling:.3f})"
                    )
            dequantized = PLUGIN_LINE.findall(_read(cell.log_path)) if cell.served else []
            if dequantized and (state == "off" or FORMS[name].draft_built is not None):
                out.append(f"{fixture.name} {name} plugin {state}: dequantized {dequantized}")
    served = {label: cell for label, cell in cells.items() if cell.served}
    out += [f"{fixture.name}: {failure}" for failure in check_shims(served)]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "fixtures",
        nargs="*",
        help="ModelSlim folders (FOLDER or FOLDER=FLOAT); default: the bundled ones present",
    )
    parser.add_argument("--forms", nargs="+", choices=sorted(FORMS), default=sorted(FORMS))
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".cache", "e2e", "forms"))
    parser.add_argument("--json", default=None, help="write every cell here")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds per server")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="start only these cells, in this order (float, reference-off, F2-on, ...); "
        "--from-json merges their --json over an earlier run's",
    )
    parser.add_argument(
        "--from-json",
        nargs="+",
        default=None,
        help="start nothing: the table of earlier runs' --json files (each stopped server's "
        "cell read again from its log)",
    )
    return parser.parse_args(argv)


def load_cells(path: str) -> tuple[str, list[tuple[Fixture, dict[str, Cell], list[str]]]]:
    """An earlier run's machine line and cells, from its ``--json``; a stopped server's error
    and NPU-only piece are read again from its log (the reading may have improved since)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    loaded = []
    for entry in data["fixtures"]:
        folder = entry["fixture"]
        fixture = Fixture(os.path.basename(folder), folder, entry["float"])
        forms = entry.get("forms", sorted(FORMS))  # the rows asked for, run or not
        runs = dict(fixture_runs(fixture, forms))
        cells = {}
        for saved in entry["cells"]:
            cell = Cell(saved["label"], runs[saved["label"]], log_path=saved["log"])
            cell.start_seconds = saved["start_seconds"]
            cell.generations = [
                Generation(ids, meta)
                for ids, meta in zip(saved["output_ids"], saved["meta_info"], strict=True)
            ]
            cell.error, cell.npu_piece = saved["error"], saved["npu_piece"]
            text = _read(cell.log_path)
            if cell.error is not None and text:
                cell.error = exception_line(text) or cell.error
                cell.npu_piece = npu_piece(text, cell.error)
            cells[cell.label] = cell
        loaded.append((fixture, cells, forms))
    return data["machine"], loaded


def render(paths: list[str], args) -> int:
    """``--from-json``: one table of every fixture of ``paths``, nothing started."""
    rows, failures, machines = list(HEADER), [], []
    merged: dict[str, tuple[Fixture, dict[str, Cell], list[str]]] = {}
    for path in paths:  # a later file's cells replace an earlier one's (--only reruns)
        machine, loaded = load_cells(path)
        machines.append(machine)
        for fixture, cells, forms in loaded:
            if fixture.folder in merged:
                _, earlier, earlier_forms = merged[fixture.folder]
                cells = {**earlier, **cells}
                forms = sorted(set(earlier_forms) | set(forms))
            merged[fixture.folder] = (fixture, cells, forms)
    for fixture, cells, forms in merged.values():
        rows += fixture_rows(fixture, cells, forms)
        failures += failures_of(fixture, cells, forms)
    table = "\n".join(rows)
    footer = "; ".join(sorted(set(machines)))
    say(table + "\n\n" + footer)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
    for failure in failures:
        say(f"FAILED: {failure}")
    say(f"e2e-forms tables={len(paths)} {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    from e2e.run import machine_line

    args = parse_args(argv)
    if args.from_json:
        return render(args.from_json, args)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    fixtures = [parse_fixture(spec) for spec in (args.fixtures or default_fixtures())]
    try:
        for fixture in fixtures:
            check_model(fixture.folder)
            check_target(fixture.float_folder, role="FLOAT")
    except InputError as exc:
        print(f"e2e.forms: {exc}", flush=True)
        return 2
    started = time.perf_counter()
    machine = machine_line()
    command = "python -m e2e.forms " + " ".join(argv if argv is not None else sys.argv[1:])
    print(machine, flush=True)
    prompts = heldout_prompts(args.prompts, args.prompt_len)
    rows, failures, written = list(HEADER), [], []
    try:
        for fixture in fixtures:
            cells: dict[str, Cell] = {}
            log_dir = os.path.join(args.log_dir, fixture.name)
            entry = {
                "fixture": fixture.folder,
                "float": fixture.float_folder,
                "forms": args.forms,
                "cells": [],
            }
            written.append(entry)
            runs = dict(fixture_runs(fixture, args.forms))
            for label in args.only or list(runs):  # --only: in the order given
                run = runs[label]
                cell = serve(label, run, prompts, args.new_tokens, args, log_dir)
                cells[label] = cell
                say(f"{fixture.name} {label}: {describe(cell)} (up in {cell.start_seconds:.0f} s)")
                # each cell kept as it comes: an interrupted table renders with --from-json
                entry["cells"].append(cell.to_json())
                _write_json(args, written, failures, machine)
            if not args.only:
                rows += fixture_rows(fixture, cells, args.forms)
                failures += failures_of(fixture, cells, args.forms)
    except KeyboardInterrupt:
        print("e2e.forms: interrupted; every server started has been stopped", flush=True)
        return 130
    table = "\n".join(rows)
    seconds = time.perf_counter() - started
    footer = (
        f"`{command}` on {machine}; {args.prompts} prompts x {args.new_tokens} tokens; "
        f"total {seconds:.0f} s"
    )
    print("\n" + table + "\n\n" + footer, flush=True)
    _write(args, table, footer, written, failures, machine)
    for failure in failures:
        print(f"FAILED: {failure}", flush=True)
    if args.only:  # single cells: judged only against the whole table (--from-json)
        print(f"e2e-forms fixtures={len(fixtures)} cells written; render with --from-json to check")
        return 0
    print(f"e2e-forms fixtures={len(fixtures)} {'FAILED' if failures else 'passed'}", flush=True)
    return 1 if failures else 0


def _write(args, table: str, footer: str, written: list, failures: list, machine: str) -> None:
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table + "\n\n" + footer + "\n")
    _write_json(args, written, failures, machine)


def _write_json(args, written: list, failures: list, machine: str) -> None:
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"machine": machine, "fixtures": written, "failures": failures}, handle, indent=1
            )


def say(message: str) -> None:
    print(message, flush=True)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
