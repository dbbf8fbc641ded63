"""F2 and F4 on the FLOAT-experts MoE export, in sglang's own server on the CPU, plugin off and on.

Usage (from the repository root; ~15 min on 2 cores)::

    .venv/bin/python benchmarks/float_experts_forms.py [--prompts 4 --new-tokens 32]
        [--json .cache/e2e/float_experts_forms.json]

The launch forms of issue 45 this measures (one ModelSlim folder, EAGLE with its own MTP head):

- F2: ``--quantization modelslim`` and no draft flag: sglang 0.5.23 gives the draft the
  target's CLI quantization, so it builds the draft under ``ModelSlimConfig``;
- F4: ``--speculative-draft-model-quantization modelslim`` and no ``--quantization``: the target
  takes ModelSlim from the folder's description, the draft is built under ``ModelSlimConfig``.

Each on ``test/fixtures/e2e/moe_float_experts`` (MTP routed experts, shared expert and fc FLOAT,
MTP attention W8A8_DYNAMIC) with the plugin off (``SGLANG_PLUGINS=none``: stock sglang, which
stops at start-up in ``get_moe_scheme``; its error is quoted from the log) and on, beside
``float`` (the float folder ``moe_float`` with its own MTP head: the ceiling) and ``reference``
(the ModelSlim folder without speculation: the tokens every plugin-on run must reproduce). The
servers are the harness's (``e2e/server.py``: sglang's launcher on a free loopback port, the
``e2e/site`` CPU stand-ins, every process stopped); only the flags of the form differ. Passes
when each plugin-on run reproduces ``reference``'s tokens and its accept length is at least
``RATIO`` x ``float``'s. Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

import support_on_path  # noqa: F401  (test/ on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # e2e/ (run from the root, as python -m e2e is)

from benchmarks.machine import describe  # noqa: E402
from e2e.client import generate  # noqa: E402
from e2e.inputs import heldout_prompts  # noqa: E402
from e2e.server import SPECULATIVE_FLAGS, Server, ServerError, ServerRun  # noqa: E402

FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")
MODEL = os.path.join(FIXTURES, "moe_float_experts")
FLOAT = os.path.join(FIXTURES, "moe_float")
MODELSLIM = "modelslim"
#: the accept length a plugin-on run must reach, as a fraction of the float folder's own MTP
RATIO = 0.97
#: EAGLE's flags without the draft-quantization flag (the form decides it)
EAGLE = SPECULATIVE_FLAGS[:-1]


@dataclasses.dataclass(frozen=True)
class FormRun(ServerRun):
    """A harness server whose quantization flags are exactly the form's."""

    form: str = ""

    def command(self, port: int) -> list[str]:
        cmd = ServerRun(self.label, self.target, False, self.plugin).command(port)
        if self.form == "F2":
            return [*cmd, "--quantization", MODELSLIM, *EAGLE]
        if self.form == "F4":
            return [*cmd, *EAGLE, "--speculative-draft-model-quantization", MODELSLIM]
        return super().command(port)


def runs() -> list[ServerRun]:
    return [
        ServerRun("float", FLOAT, speculative=True, plugin=True),
        ServerRun("reference", MODEL, speculative=False, plugin=True, quantization=MODELSLIM),
        FormRun("F2_stock", MODEL, True, False, form="F2"),
        FormRun("F2_plugin", MODEL, True, True, form="F2"),
        FormRun("F4_stock", MODEL, True, False, form="F4"),
        FormRun("F4_plugin", MODEL, True, True, form="F4"),
    ]


def startup_error(log_path: str) -> str:
    """The last exception line of a server that stopped during start-up."""
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        lines = [line.strip() for line in handle]
    raised = [line for line in lines if re.search(r"\b\w+(Error|Exception): ", line)]
    return raised[-1] if raised else (lines[-1] if lines else "")


def serve(run: ServerRun, prompts, new_tokens: int, log_dir: str) -> dict:
    result: dict = {"label": run.label, "plugin": run.plugin}
    try:
        with Server(run, log_dir) as server:
            result["command"] = run.shell_command(server.port)
            result["start_seconds"] = round(server.started_seconds, 1)
            gens = [generate(server.url, p, new_tokens) for p in prompts]
    except ServerError:
        log = os.path.join(log_dir, f"server-{run.label}.log")
        result.update(started=False, error=startup_error(log), log=log)
        result["command"] = run.shell_command(0).replace("--port 0", "--port <free>")
        return result
    tokens = sum(int(g.meta["completion_tokens"]) for g in gens)
    steps = sum(int(g.meta.get("spec_verify_ct", 0)) for g in gens)
    result.update(
        started=True,
        output_ids=[g.output_ids for g in gens],
        completion_tokens=tokens,
        verify_steps=steps,
        accept_length=tokens / steps if steps else None,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".cache", "e2e", "float_experts"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(describe(), flush=True)
    prompts = heldout_prompts(args.prompts, args.prompt_len)
    results = {}
    for run in runs():
        results[run.label] = r = serve(run, prompts, args.new_tokens, args.log_dir)
        shown = (
            f"accept length {r['accept_length']:.3f} ({r['completion_tokens']}/{r['verify_steps']})"
            if r.get("accept_length") is not None
            else ("started" if r.get("started") else f"start-up stopped: {r['error']}")
        )
        print(f"{run.label}: {shown}\n  {r['command']}", flush=True)
    failures = []
    ceiling = results["float"].get("accept_length") or 0.0
    for label in ("F2_plugin", "F4_plugin"):
        r = results[label]
        if not r.get("started"):
            failures.append(f"{label} did not start: {r.get('error')}")
            continue
        if r["output_ids"] != results["reference"].get("output_ids"):
            failures.append(f"{label}'s tokens differ from reference's")
        if (r["accept_length"] or 0.0) < RATIO * ceiling:
            failures.append(
                f"{label} accept length {r['accept_length']:.3f} < {RATIO} x {ceiling:.3f}"
            )
    figures = " ".join(
        f"{label}={results[label]['accept_length']:.3f}"
        if results[label].get("accept_length") is not None
        else f"{label}=start-up-error"
        for label in results
        if label != "reference"
    )
    print(f"float_experts_forms accept_length {figures}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": describe(), "results": results, "failures": failures}, handle)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
