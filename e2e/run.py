"""sglang's own server with EAGLE on the CPU: one ModelSlim folder as users serve it, plugin on/off.

Usage (``make e2e`` runs the first line, ``make e2e-short`` the second)::

    .venv/bin/python -m e2e                 # F1 (flagless), bundled model
    .venv/bin/python -m e2e --short         # 2 prompts x 16 tokens (CI)
    .venv/bin/python -m e2e --form F2       # --quantization modelslim (F1-F4: e2e/plan.py)
    .venv/bin/python -m e2e --tp-size 2     # the same runs with --tp-size 2
    .venv/bin/python -m e2e --family hybrid # Gated DeltaNet Qwen3.5 (e2e-hybrid)
    .venv/bin/python -m e2e --model /models/w8a8 [--float /models/float]
    .venv/bin/python -m e2e --target /models/float --draft /models/w8a8
    .venv/bin/python -m e2e --family moe    # the Qwen3.5-MoE draft (make e2e-moe)
    .venv/bin/python -m e2e --short --upstream-tree .cache/upstream/sglang   # step 01's F1

Every server is started as users start it (``python -m sglang.launch_server``) on a free
loopback port and stopped with nothing left running. The default serves ONE ModelSlim folder
(the bundled trained tiny Qwen3.5's W8A8_DYNAMIC export, ``test/fixtures/e2e/w8a8``) in launch
form F1: no quantization flag at all (sglang auto-detects ModelSlim for the target from its
description; the draft, never auto-detected, is built unquantized over the codes), EAGLE 3/1/4
with no draft path. ``--form`` picks another of ``e2e/plan.py``'s forms (F2
``--quantization modelslim``, F3 ``--speculative-draft-model-quantization unquant``, F4
``--speculative-draft-model-quantization modelslim``). Runs: ``plugin`` (the form, plugin on),
``float`` (the float folder with its own MTP head: the ceiling), ``stock`` (the form, plugin
off), ``quantized_draft`` (F4, plugin on; for F1/F3 only), and without speculation
``reference`` and ``float_reference``. The NPU-only kernels and platform checks the quantized
target needs run through the CPU stand-ins of ``e2e/site/`` (docs/results.md). Prompts are
windows of held-out text as byte ids; generation is greedy and ignores EOS.

Accept length is sglang's own: the sum of ``completion_tokens`` over the sum of
``spec_verify_ct`` (tokens per verification step), beside each request's
``spec_accept_length``, both read from ``/generate``'s ``meta_info``. The run fails (exit 1)
unless every speculative run emits exactly its reference run's tokens; the plugin's INFO line
names the folder in the plugin server's log (once per rank with ``--tp-size``) and nowhere
else (nowhere at all in F2/F4, whose draft sglang builds quantized); every CPU stand-in a
server needs announced itself in its log; and the accept bars of ``checks.py`` hold: float
>= FLOAT_MIN (1.5 for the hybrid), plugin and quantized_draft >= ACCEPT_SHARE x float, stock
<= STOCK_MAX in F1/F3 (its draft is the raw codes) and >= ACCEPT_SHARE x float in F2/F4.
Without a float folder (``--model`` alone, ``--short``) the draft built quantized is the ceiling
(F2/F4: stock's own run). The full run also checks, on the plugin server, a 512-token generation
against the reference run's, and 8 concurrent requests against the same requests one by one, and
measures plugin over float tokens/s with both servers up and requests alternated (median and
spread of 3 rounds). The hybrid family also checks the float target's tokens against
transformers' greedy decode. Last line::

    e2e accept_length float=F stock=S plugin=P quantized_draft=Q tokens_per_s float=a ... form=F1

``--upstream-tree`` (what ``make upstream-test`` runs) proves the feature branch in step 01's
launch (F1, or ``--form F3``): ``reference``, ``float``, ``float_reference`` and ``branch``
run the patched sglang tree (its ``python/`` first on the path) with the plugin off, ``stock``
the installed sglang with the plugin off; the branch's own INFO line must name the folder,
stock <= STOCK_MAX and branch >= ACCEPT_SHARE x float, and the last line says ``branch=B``.
``--target`` / ``--draft`` (the earlier form: a float target, the ModelSlim folder passed as
``--speculative-draft-model-path`` with ``unquant``) and ``--family moe`` (whose target's
quantized experts need NPU-only kernels, so its float target serves) run four servers:
reference, float, stock and plugin. ``--family moe`` serves the bundled Qwen3.5-MoE, whose
routed experts run through sglang's FusedMoE layer (``moe_forward_native`` on this platform);
the run also fails unless every server's log shows that for the target's layers and, in the
speculative servers, for the draft's. Its last line starts ``e2e-moe``. ``e2e/forms.py`` runs
every form with the plugin off and on, per fixture, into one table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from e2e.checks import (
    FLOAT_MIN,
    Bars,
    check_logs,
    check_moe_logs,
    check_outputs,
    check_shims,
    compare_tokens,
    first_difference,
)
from e2e.client import SPEC_KEYS, Generation, generate
from e2e.inputs import (
    InputError,
    check_draft,
    check_model,
    check_target,
    check_tree,
    heldout_prompts,
)
from e2e.load import Pairing, alternated, concurrent
from e2e.plan import FORMS, UPSTREAM_FORMS, Plan, one_folder_plan, two_folder_plan, upstream_plan
from e2e.server import Server, ServerError, ServerRun, log_tail

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")


@dataclass(frozen=True)
class Family:
    """A bundled model: its float folder, its ModelSlim folder, and its run's bounds."""

    float_folder: str
    modelslim_folder: str
    line: str  # the last line's first word
    one_folder: bool  # served as one ModelSlim folder by default (else the two-folder form)
    float_min: float = FLOAT_MIN


FAMILIES = {
    "dense": Family(os.path.join(FIXTURES, "float"), os.path.join(FIXTURES, "w8a8"), "e2e", True),
    "moe": Family(
        os.path.join(FIXTURES, "moe_float"), os.path.join(FIXTURES, "moe_w8a8"), "e2e-moe", False
    ),
    "hybrid": Family(
        os.path.join(FIXTURES, "hybrid_float"),
        os.path.join(FIXTURES, "hybrid_w8a8"),
        "e2e-hybrid",
        True,
        float_min=1.5,
    ),
}


@dataclass
class RunResult:
    """What one server returned for every prompt, and sglang's acceptance figures."""

    run: ServerRun
    generations: list[Generation] = field(default_factory=list)
    start_seconds: float = 0.0
    log_path: str = ""
    command: str = ""
    #: the long greedy generation (``--long-tokens``), and the load test's two passes
    long: Generation | None = None
    one_by_one: list[Generation] = field(default_factory=list)
    together: list[Generation] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return sum(int(g.meta["completion_tokens"]) for g in self.generations)

    @property
    def verify_steps(self) -> int:
        return sum(int(g.meta.get("spec_verify_ct", 0)) for g in self.generations)

    @property
    def accept_length(self) -> float | None:
        """sglang's tokens per verification step over the whole run."""
        steps = self.verify_steps
        return self.completion_tokens / steps if steps else None

    @property
    def generate_seconds(self) -> float:
        return sum(g.seconds for g in self.generations)

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.generate_seconds

    def spec_sum(self, key: str) -> int:
        return sum(int(g.meta.get(key, 0)) for g in self.generations)

    def to_json(self) -> dict:
        def requests(generations: list[Generation]) -> list[dict]:
            return [
                {"output_ids": g.output_ids, "seconds": round(g.seconds, 2), "meta_info": g.meta}
                for g in generations
            ]

        return {
            "label": self.run.label,
            "target": self.run.target,
            "draft": self.run.draft_folder,
            "quantization": self.run.quantization,
            "draft_quantization": self.run.draft_quantization if self.run.speculative else None,
            "tp_size": self.run.tp_size,
            "plugin": self.run.plugin,
            "command": self.command,
            "server_start_seconds": round(self.start_seconds, 1),
            "generate_seconds": round(self.generate_seconds, 1),
            "completion_tokens": self.completion_tokens,
            "spec_verify_ct": self.verify_steps,
            "accept_length": self.accept_length,
            "tokens_per_second": self.tokens_per_second,
            "requests": requests(self.generations),
            "long": requests([self.long]) if self.long else [],
            "one_by_one": requests(self.one_by_one),
            "together": requests(self.together),
            "log": self.log_path,
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default="dense",
        help="the bundled model: dense Qwen3.5 (default), hybrid Gated DeltaNet, or Qwen3.5-MoE",
    )
    parser.add_argument("--model", default=None, help="ONE ModelSlim folder, served as users do")
    parser.add_argument("--float", default=None, help="the float folder of --model (the ceiling)")
    parser.add_argument("--target", default=None, help="float folder (the two-folder form)")
    parser.add_argument("--draft", default=None, help="ModelSlim folder (the two-folder form)")
    parser.add_argument(
        "--form",
        choices=sorted(FORMS),
        default=None,
        help="the launch form's quantization flags (default F1, flagless; e2e/plan.py)",
    )
    parser.add_argument("--tp-size", type=int, default=1, help="sglang's --tp-size")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--short", action="store_true", help="2 prompts x 16 tokens (CI)")
    parser.add_argument("--long-tokens", type=int, default=None, help="the long generation")
    parser.add_argument("--load-requests", type=int, default=None, help="concurrent requests")
    parser.add_argument("--perf-rounds", type=int, default=None, help="alternated rounds")
    parser.add_argument(
        "--targets-only",
        action="store_true",
        help="only the runs without speculation (reference, float_reference, stock_reference): "
        "target_agree alone",
    )
    parser.add_argument("--port", type=int, default=None, help="loopback port (default: free)")
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".cache", "e2e"))
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds per server")
    parser.add_argument(
        "--upstream-tree",
        default=None,
        help="a materialized feature-branch tree (make upstream-tree): serve it, plugin off",
    )
    args = parser.parse_args(argv)
    family = FAMILIES[args.family]
    args.line, args.float_min = family.line, family.float_min
    if args.model and (args.target or args.draft):
        parser.error("--model (one folder) and --target / --draft exclude each other")
    two_folder = bool(args.target or args.draft) or (not family.one_folder and not args.model)
    if two_folder and args.form is not None:
        parser.error("--form is a launch of one ModelSlim folder (--model), not of two folders")
    if args.upstream_tree is not None and not two_folder:
        if (args.form or "F1") not in UPSTREAM_FORMS:
            parser.error(f"--upstream-tree runs step 01's launch: --form {UPSTREAM_FORMS}")
        if args.tp_size != 1 or args.targets_only:
            parser.error("--upstream-tree runs step 01's launch at --tp-size 1 only")
    args.form = args.form or "F1"
    if args.short:
        args.prompts, args.new_tokens = 2, 16
    # the extras of the full dense run (docs/results.md): off in --short and in other families
    full = not args.short and args.family == "dense" and not two_folder and not args.upstream_tree
    args.long_tokens = (512 if full else 0) if args.long_tokens is None else args.long_tokens
    args.load_requests = (8 if full else 0) if args.load_requests is None else args.load_requests
    args.perf_rounds = (3 if full else 0) if args.perf_rounds is None else args.perf_rounds
    if two_folder:
        args.layout = "two-folder"
        args.target = os.path.abspath(args.target or family.float_folder)
        args.draft = os.path.abspath(args.draft or family.modelslim_folder)
    else:
        args.layout = "upstream" if args.upstream_tree is not None else "one-folder"
        args.model = os.path.abspath(args.model or family.modelslim_folder)
        float_default = family.float_folder if args.model == family.modelslim_folder else None
        args.float = os.path.abspath(args.float) if args.float else float_default
        if args.layout == "upstream" and args.float is None:
            parser.error("--upstream-tree with --model needs --float (the ceiling)")
    if args.upstream_tree is not None:
        args.upstream_tree = os.path.abspath(args.upstream_tree)
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    if args.layout == "two-folder":
        return two_folder_plan(args.target, args.draft, args.tp_size, args.upstream_tree)
    if args.layout == "upstream":
        return upstream_plan(args.model, args.float, args.upstream_tree, args.form)
    plan = one_folder_plan(args.model, args.float, args.tp_size, args.short, args.form)
    if args.targets_only:
        plain = [run for run in plan.runs if not run.speculative]
        plan = Plan(plan.form, plain, {}, (), plan.draft_folder, launch=plan.launch)
    return plan


def check_inputs(args: argparse.Namespace) -> None:
    """Each folder checked in seconds before any server starts (raises InputError)."""
    if args.layout == "two-folder":
        check_target(args.target)
        check_draft(args.draft)
    else:
        check_model(args.model)
        if args.float is not None:
            check_target(args.float, role="FLOAT")
    if args.upstream_tree is not None:
        check_tree(args.upstream_tree)


def say(message: str) -> None:
    print(message, flush=True)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _generate(server: Server, prompt: list[int], new_tokens: int) -> Generation:
    try:
        return generate(server.url, prompt, new_tokens)
    except OSError as exc:  # urllib's errors: the server died or refused the request
        raise ServerError(
            f"the {server.run.label} server failed a /generate request ({exc}); log "
            f"{server.log_path}, last lines:\n{log_tail(server.log_path)}"
        ) from exc


def open_server(run: ServerRun, args, port: int | None) -> Server:
    """``run``'s server, not yet started (use it as a context manager)."""
    return Server(run, args.log_dir, port=port, start_timeout=args.start_timeout)


def result_of(server: Server) -> RunResult:
    """A started server's result so far: its start-up time, log and command."""
    return RunResult(
        server.run,
        start_seconds=server.started_seconds,
        log_path=server.log_path,
        command=server.run.shell_command(server.port),
    )


def extras(server: Server, result: RunResult, args, load_prompts: list[list[int]]) -> None:
    """The long generation (plugin and reference), and the load test (plugin)."""
    label = result.run.label
    if args.long_tokens and label in ("plugin", "reference"):
        result.long = _generate(server, load_prompts[0], args.long_tokens)
        say(f"  {label}: {args.long_tokens} greedy tokens in {result.long.seconds:.0f} s")
    if args.load_requests and label == "plugin":
        result.one_by_one = [_generate(server, p, args.new_tokens) for p in load_prompts]
        try:
            started = time.perf_counter()
            result.together = concurrent(server.url, load_prompts, args.new_tokens)
        except OSError as exc:
            raise ServerError(f"the plugin server failed a concurrent request ({exc})") from exc
        say(
            f"  plugin: {len(load_prompts)} requests one by one in "
            f"{sum(g.seconds for g in result.one_by_one):.0f} s, all at once in "
            f"{time.perf_counter() - started:.0f} s"
        )


def report(result: RunResult, args, index: int, total: int) -> None:
    figures = ""
    if result.accept_length is not None:
        per_request = ", ".join(f"{g.meta['spec_accept_length']:.3f}" for g in result.generations)
        figures = (
            f"; accept length {result.accept_length:.3f} "
            f"({result.completion_tokens}/{result.verify_steps}; per request {per_request})"
        )
    say(
        f"[{index}/{total}] {result.run.label}: server up in {result.start_seconds:.0f} s, "
        f"{len(result.generations)} prompts x {args.new_tokens} tokens in "
        f"{result.generate_seconds:.0f} s ({result.tokens_per_second:.2f} tokens/s){figures}"
    )


def serve_all(plan: Plan, prompts, load_prompts, args) -> tuple[dict[str, RunResult], Pairing]:
    """Every server of ``plan``: the paired ones up together first, then one at a time."""
    results: dict[str, RunResult] = {}
    pairing = Pairing()
    total = len(plan.runs)
    paired = [run for run in plan.runs if run.label in plan.paired]
    with contextlib.ExitStack() as stack:
        servers: dict[str, Server] = {}
        for run in paired:  # the first on --port (if given), the other on a free port
            server = stack.enter_context(open_server(run, args, None if servers else args.port))
            servers[run.label], results[run.label] = server, result_of(server)
        for prompt in prompts:  # the correctness pass, alternated between the paired servers
            for label, server in servers.items():
                results[label].generations.append(_generate(server, prompt, args.new_tokens))
        for label, server in servers.items():
            report(results[label], args, 1 + list(servers).index(label), total)
            extras(server, results[label], args, load_prompts)
        if servers and args.perf_rounds:
            urls = {label: server.url for label, server in servers.items()}
            pairing = alternated(urls, prompts, args.new_tokens, args.perf_rounds)
            ratio = pairing.ratio(*plan.paired)
            say(
                f"  {plan.paired[0]} / {plan.paired[1]} tokens/s, {args.perf_rounds} alternated "
                f"rounds: median {ratio['median']:.3f} (min {ratio['min']:.3f}, "
                f"max {ratio['max']:.3f})"
            )
    for run in plan.runs:
        if run.label in results:
            continue
        with open_server(run, args, args.port) as server:
            result = result_of(server)
            for prompt in prompts:
                result.generations.append(_generate(server, prompt, args.new_tokens))
            extras(server, result, args, load_prompts)
        results[run.label] = result
        report(result, args, len(results), total)
    return results, pairing


def check_extras(results: dict[str, RunResult], pairing: Pairing, plan: Plan) -> list[str]:
    """The long generation, the load test, and the alternated rounds' tokens."""
    failures = []
    plugin, reference = results.get("plugin"), results.get("reference")
    if plugin is not None and plugin.long is not None and reference and reference.long:
        failures += compare_tokens(
            "plugin: the long generation", "reference", reference.long, plugin.long
        )
    if plugin is not None:
        for i, (alone, together) in enumerate(zip(plugin.one_by_one, plugin.together, strict=True)):
            failures += compare_tokens(
                f"plugin: request {i} of {len(plugin.together)} sent at once",
                "one-by-one",
                alone,
                together,
            )
    for label in plan.paired:
        for r, generations in enumerate(pairing.generations(label)):
            for i, (first, again) in enumerate(
                zip(results[label].generations, generations, strict=True)
            ):
                failures += compare_tokens(
                    f"{label}: round {r} prompt {i}", f"first {label}", first, again
                )
    return failures


def check_transformers(results: dict[str, RunResult], prompts, args) -> list[str]:
    """The float target's tokens against transformers' greedy decode (the hybrid family)."""
    reference = results.get("float_reference")
    if reference is None:
        return []
    from e2e.hf_reference import greedy_tokens

    expected = greedy_tokens(reference.run.target, prompts, args.new_tokens)
    failures = []
    for i, (want, got) in enumerate(zip(expected, reference.generations, strict=True)):
        failures += compare_tokens(
            f"float_reference: prompt {i}", "transformers greedy", Generation(want), got
        )
    say(f"transformers' greedy decode of {reference.run.target}: {len(expected)} prompts compared")
    return failures


#: target_agree's parts: the run without speculation whose tokens are set against the float
#: target's, stock sglang's and the plugin's
TARGET_AGREE = {"stock": "stock_reference", "plugin": "reference"}


def target_agreement(results: dict[str, RunResult], label: str = "reference") -> dict | None:
    """How many of the quantized target's tokens (``label``: ``reference`` with the plugin,
    ``stock_reference`` without) are the float target's (``float_reference``), position by
    position, and where each prompt first leaves them: a figure, not a bound (a W8A8 target may
    rightly differ; raw codes loaded as weights do not come close)."""
    quantized, floating = results.get(label), results.get("float_reference")
    if quantized is None or floating is None:
        return None
    pairs = list(zip(floating.generations, quantized.generations, strict=True))
    equal = sum(a == b for f, q in pairs for a, b in zip(f.output_ids, q.output_ids, strict=True))
    total = sum(len(f.output_ids) for f, _ in pairs)
    first = [first_difference(f.output_ids, q.output_ids) for f, q in pairs]
    return {"equal": equal, "total": total, "first_difference": first}


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(results: list[RunResult]) -> str:
    rows = [
        "| run | serves | sglang | plugin | sglang accept length (tokens / verify) | per request "
        "spec_accept_length | correct / proposed drafts | start s | generate s | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        length = (
            f"{r.accept_length:.3f} ({r.completion_tokens}/{r.verify_steps})"
            if r.accept_length is not None
            else "- (no speculation)"
        )
        per = ", ".join(f"{g.meta.get('spec_accept_length', 0):.3f}" for g in r.generations)
        drafts = (
            f"{r.spec_sum('spec_num_correct_drafts')} / {r.spec_sum('spec_num_proposed_drafts')}"
            if r.accept_length is not None
            else "-"
        )
        rows.append(
            f"| {r.run.label} | {describe_run(r.run)} | "
            f"{'branch tree' if r.run.sglang_path else 'installed'} | "
            f"{'on' if r.run.plugin else 'off'} | {length} | "
            f"{per if r.accept_length is not None else '-'} | {drafts} | {r.start_seconds:.0f} | "
            f"{r.generate_seconds:.1f} | {r.tokens_per_second:.2f} |"
        )
    return "\n".join(rows)


def describe_run(run: ServerRun) -> str:
    parts = [os.path.basename(run.target)]
    if run.quantization:
        parts.append(f"--quantization {run.quantization}")
    if run.speculative:
        parts.append(f"EAGLE, draft {os.path.basename(run.draft) if run.draft else 'its own MTP'}")
        if run.draft_quantization is not None:
            parts.append(f"--speculative-draft-model-quantization {run.draft_quantization}")
        parts.append(f"built {run.draft_built or 'unquantized'}")
    if run.tp_size != 1:
        parts.append(f"TP={run.tp_size}")
    return ", ".join(parts)


def machine_line() -> str:
    from e2e.machine import describe

    return describe()


def last_line(args, plan: Plan, by_label: dict[str, RunResult], bars: Bars, pairing: Pairing):
    def tps(label: str) -> str:
        return f"{by_label[label].tokens_per_second:.2f}" if label in by_label else "-"

    if plan.form in ("two-folder", "upstream"):
        fixed = bars.fixed_label
        line = (
            f"{args.line} accept_length float={bars.float:.3f} stock={bars.stock:.3f} "
            f"{fixed}={bars.fixed:.3f} tokens_per_s float={tps('float')} "
            f"stock={tps('stock')} {fixed}={tps(fixed)}"
        )
        return line + (f" form={plan.launch.key}" if plan.launch else "")
    line = (
        f"{args.line} accept_length float={_value(bars.float)} stock={bars.stock:.3f} "
        f"plugin={bars.fixed:.3f} quantized_draft={_value(bars.quantized_draft)} tokens_per_s "
        f"float={tps('float')} stock={tps('stock')} plugin={tps('plugin')} "
        f"quantized_draft={tps('quantized_draft')}"
    )
    if pairing.rounds:
        ratio = pairing.ratio(*plan.paired)
        line += (
            f" plugin_over_float={ratio['median']:.3f} "
            f"[{ratio['min']:.3f}..{ratio['max']:.3f}] rounds={len(pairing.rounds)}"
        )
    if args.tp_size != 1:
        line += f" tp_size={args.tp_size}"
    if plan.launch is not None:
        line += f" form={plan.launch.key}"
    agree = {name: target_agreement(by_label, label) for name, label in TARGET_AGREE.items()}
    if all(agree.values()):
        line += " target_agree " + " ".join(
            f"{name}={a['equal']}/{a['total']}" for name, a in agree.items() if a
        )
    return line


def targets_only_end(args, by_label: dict[str, RunResult], failures: list[str]) -> int:
    """``--targets-only``: each target's agreement with the float target, and the last line
    ``<family> target_agree stock=a/n plugin=b/n``."""
    agree = {name: target_agreement(by_label, label) for name, label in TARGET_AGREE.items()}
    for name, agreed in agree.items():
        if agreed is None:
            failures.append(f"no {TARGET_AGREE[name]} / float_reference run to compare")
        else:
            say(f"{name} target: first difference per prompt {agreed['first_difference']}")
    for failure in failures:
        say(f"FAILED: {failure}")
    parts = " ".join(f"{n}={a['equal']}/{a['total']}" for n, a in agree.items() if a)
    say(f"{args.line} target_agree {parts}")
    return 1 if failures else 0


def write_json(args, plan: Plan, prompts, results: list[RunResult], failures, **figures) -> None:
    """Every figure of the run and every server's tokens, in ``--json`` (if given)."""
    if not args.json:
        return
    by_label = {r.run.label: r for r in results}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "machine": machine_line(),
                "family": args.family,
                "form": plan.form,
                "launch": plan.launch.key if plan.launch else None,
                "launch_flags": plan.launch.label if plan.launch else None,
                "tp_size": args.tp_size,
                "prompts": prompts,
                "new_tokens": args.new_tokens,
                **figures,
                "target_agreement": target_agreement(by_label),
                "stock_target_agreement": target_agreement(by_label, TARGET_AGREE["stock"]),
                "failures": failures,
                "runs": [r.to_json() for r in results],
            },
            handle,
            indent=1,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM stop every server started (SIGINT may arrive ignored from a
    # non-interactive parent shell, so its handler is set explicitly)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    started = time.perf_counter()
    try:
        check_inputs(args)
    except InputError as exc:
        say(f"e2e: {exc}")
        return 2
    plan = make_plan(args)
    try:
        prompts = heldout_prompts(args.prompts, args.prompt_len)
        load_prompts = heldout_prompts(args.load_requests or 1, args.prompt_len)
        say(machine_line())
        served = f"{args.target} + {args.draft}"
        if plan.launch is not None:
            served = f"{args.model} in {plan.launch.key} ({plan.launch.label})"
        say(
            f"e2e ({plan.form}): {served}; {len(plan.runs)} servers "
            f"({', '.join(plan.labels())}), {len(prompts)} prompts x {args.new_tokens} greedy "
            f"tokens; logs in {args.log_dir}"
        )
        by_label, pairing = serve_all(plan, prompts, load_prompts, args)
        failures = []
        if args.family == "hybrid":
            failures += check_transformers(by_label, prompts, args)
    except ServerError as exc:
        say(f"e2e: {exc}")
        return 1
    except KeyboardInterrupt:
        say("e2e: interrupted; every server started has been stopped")
        return 130
    results = [by_label[run.label] for run in plan.runs]
    failures += check_outputs(by_label, plan.reference_of, SPEC_KEYS)
    if args.targets_only:
        failures += check_shims(by_label, hybrid=args.family == "hybrid")
        write_json(args, plan, prompts, results, failures)
        return targets_only_end(args, by_label, failures)
    # in F2/F4 sglang builds the draft quantized: the fix has nothing to do
    stock_broken = plan.launch is None or plan.launch.draft_built is None
    failures += check_logs(by_label, plan.draft_folder, expect_fix=stock_broken)
    failures += check_shims(by_label, hybrid=args.family == "hybrid")
    failures += check_extras(by_label, pairing, plan)
    if args.family == "moe":
        failures += check_moe_logs(by_label)
    bars = Bars.of(by_label, float_min=args.float_min, stock_broken=stock_broken)
    failures += bars.failures()
    agreement = target_agreement(by_label)
    stock_agreement = target_agreement(by_label, TARGET_AGREE["stock"])
    say("")
    say(table(results))
    reference_who = "the branch's tree, plugin off" if plan.form == "upstream" else "plugin on"
    for who, agreed in ((reference_who, agreement), ("stock sglang", stock_agreement)):
        if agreed is not None:
            say(
                f"\nthe quantized target's tokens ({who}) equal to the float target's: "
                f"{agreed['equal']} of {agreed['total']} (first difference per prompt: "
                f"{agreed['first_difference']})"
            )
    say("")
    for r in results:
        say(f"{r.run.label}: {r.command}")
    write_json(
        args,
        plan,
        prompts,
        results,
        failures,
        bars=bars.to_json(),
        pairing=pairing.ratio(*plan.paired) if pairing.rounds else None,
    )
    for failure in failures:
        say(f"FAILED: {failure}")
    say(f"total {time.perf_counter() - started:.0f} s; {'FAILED' if failures else 'passed'}")
    say(last_line(args, plan, by_label, bars, pairing))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
