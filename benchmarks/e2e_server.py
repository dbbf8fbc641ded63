"""sglang's own server with EAGLE on the CPU: float draft vs quantized draft, plugin off and on.

Usage (``make e2e`` runs the first line, ``make e2e-short`` the second)::

    .venv/bin/python benchmarks/e2e_server.py
    .venv/bin/python benchmarks/e2e_server.py --short        # 2 prompts x 16 tokens (CI)
    .venv/bin/python benchmarks/e2e_server.py --target /models/float --draft /models/w8a8
    .venv/bin/python benchmarks/e2e_server.py --family moe   # the Qwen3.5-MoE draft (make e2e-moe)
    .venv/bin/python benchmarks/e2e_server.py --short --upstream-tree .cache/upstream/sglang

Four servers, one after the other, each started as users start it
(``python -m sglang.launch_server``) on a free loopback port and stopped with nothing left
running: no speculation (the reference output), EAGLE with the float checkpoint's own MTP head
(``--speculative-draft-model-path`` = TARGET), EAGLE with the ModelSlim W8A8_DYNAMIC draft and
the plugin off (``SGLANG_PLUGINS=none``: stock sglang), and the same with the plugin. The
default TARGET / DRAFT are the bundled trained tiny Qwen3.5 (``test/fixtures/e2e/``). Prompts
are windows of held-out text as byte ids; generation is greedy and ignores EOS.

Accept length is sglang's own: the sum of ``completion_tokens`` over the sum of
``spec_verify_ct`` (tokens per verification step), beside each request's
``spec_accept_length``, both read from ``/generate``'s ``meta_info``. The run fails (exit 1)
unless every speculative run emits exactly the reference run's tokens, the plugin's INFO line
names the draft folder in the plugin server's log, the CPU shim's tree kernels ran in every
speculative server, and float >= 2.0, stock <= 1.3, plugin >= 0.97 x float. Last line::

    e2e accept_length float=F stock=S plugin=P tokens_per_s float=a stock=b plugin=c

``--upstream-tree`` (what ``make upstream-test`` runs) proves the feature branch instead: the
reference, float and ``branch`` servers run the patched sglang tree (its ``python/`` first on
the path) with the plugin off, ``stock`` the installed sglang with the plugin off; the branch's
own INFO line must name the draft folder, and the last line says ``branch=B`` for ``plugin=P``.

``--family moe`` serves the bundled trained tiny Qwen3.5-MoE instead (``Qwen3_5MoeForCausalLM``,
8 routed experts top-2 and a shared expert in every layer; its draft is sglang's
``Qwen3_5ForCausalLMMTP`` with the same MoE block, whose routed experts, shared expert and
attention ModelSlim quantized). Its routed experts run through sglang's FusedMoE layer, which on
this platform computes them with sglang's own ``moe_forward_native``; the run also fails unless
every server's log shows that for the target's layers and, in the speculative servers, for the
draft's. Same bounds; its last line starts ``e2e-moe`` instead of ``e2e``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from e2e.checks import Bars, check_logs, check_moe_logs, check_outputs  # noqa: E402
from e2e.client import SPEC_KEYS, Generation, generate  # noqa: E402
from e2e.inputs import (  # noqa: E402
    InputError,
    check_draft,
    check_target,
    check_tree,
    heldout_prompts,
)
from e2e.server import Server, ServerError, ServerRun, log_tail  # noqa: E402

FIXTURES = os.path.join(REPO, "test", "fixtures", "e2e")
#: family -> (default TARGET, default DRAFT, the last line's first word)
FAMILIES = {
    "dense": (os.path.join(FIXTURES, "float"), os.path.join(FIXTURES, "w8a8"), "e2e"),
    "moe": (os.path.join(FIXTURES, "moe_float"), os.path.join(FIXTURES, "moe_w8a8"), "e2e-moe"),
}


@dataclass
class RunResult:
    """What one server returned for every prompt, and sglang's acceptance figures."""

    run: ServerRun
    generations: list[Generation] = field(default_factory=list)
    start_seconds: float = 0.0
    log_path: str = ""

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
        return {
            "label": self.run.label,
            "draft": self.run.draft,
            "plugin": self.run.plugin,
            "server_start_seconds": round(self.start_seconds, 1),
            "generate_seconds": round(self.generate_seconds, 1),
            "completion_tokens": self.completion_tokens,
            "spec_verify_ct": self.verify_steps,
            "accept_length": self.accept_length,
            "tokens_per_second": self.tokens_per_second,
            "requests": [
                {"output_ids": g.output_ids, "seconds": round(g.seconds, 2), "meta_info": g.meta}
                for g in self.generations
            ],
            "log": self.log_path,
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default="dense",
        help="the bundled model: dense Qwen3.5 (default) or Qwen3.5-MoE",
    )
    parser.add_argument("--target", default=None, help="float checkpoint folder")
    parser.add_argument("--draft", default=None, help="ModelSlim checkpoint folder")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="bytes per prompt")
    parser.add_argument("--short", action="store_true", help="2 prompts x 16 tokens (CI)")
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
    if args.short:
        args.prompts, args.new_tokens = 2, 16
    target, draft, args.line = FAMILIES[args.family]
    args.target = os.path.abspath(args.target or target)
    args.draft = os.path.abspath(args.draft or draft)
    if args.upstream_tree is not None:
        args.upstream_tree = os.path.abspath(args.upstream_tree)
    return args


def server_runs(args: argparse.Namespace) -> list[ServerRun]:
    """The four servers: with the plugin (the default), or with the feature branch's tree."""
    stock = ServerRun("stock", args.target, args.draft, plugin=False)
    if args.upstream_tree is None:
        return [
            ServerRun("reference", args.target, None, plugin=True),
            ServerRun("float", args.target, args.target, plugin=True),
            stock,
            ServerRun("plugin", args.target, args.draft, plugin=True),
        ]
    tree = os.path.join(args.upstream_tree, "python")
    return [
        ServerRun("reference", args.target, None, plugin=False, sglang_path=tree),
        ServerRun("float", args.target, args.target, plugin=False, sglang_path=tree),
        stock,
        ServerRun("branch", args.target, args.draft, plugin=False, sglang_path=tree),
    ]


def say(message: str) -> None:
    print(message, flush=True)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def serve(run: ServerRun, prompts: list[list[int]], args, index: int, total: int) -> RunResult:
    result = RunResult(run)
    with Server(run, args.log_dir, port=args.port, start_timeout=args.start_timeout) as server:
        result.start_seconds, result.log_path = server.started_seconds, server.log_path
        for prompt in prompts:
            try:
                result.generations.append(generate(server.url, prompt, args.new_tokens))
            except OSError as exc:  # urllib's errors: the server died or refused the request
                raise ServerError(
                    f"the {run.label} server failed a /generate request ({exc}); log "
                    f"{server.log_path}, last lines:\n{log_tail(server.log_path)}"
                ) from exc
    figures = ""
    if result.accept_length is not None:
        per_request = ", ".join(f"{g.meta['spec_accept_length']:.3f}" for g in result.generations)
        figures = (
            f"; accept length {result.accept_length:.3f} "
            f"({result.completion_tokens}/{result.verify_steps}; per request {per_request})"
        )
    say(
        f"[{index}/{total}] {run.label}: server up in {result.start_seconds:.0f} s, "
        f"{len(prompts)} prompts x {args.new_tokens} tokens in {result.generate_seconds:.0f} s "
        f"({result.tokens_per_second:.2f} tokens/s){figures}"
    )
    return result


def table(results: list[RunResult]) -> str:
    rows = [
        "| run | draft | sglang | plugin | sglang accept length (tokens / verify) | per request "
        "spec_accept_length | correct / proposed drafts | generate s | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
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
        draft = os.path.basename(r.run.draft) if r.run.draft else "-"
        rows.append(
            f"| {r.run.label} | {draft} | {'branch tree' if r.run.sglang_path else 'installed'} | "
            f"{'on' if r.run.plugin else 'off'} | {length} | "
            f"{per if r.accept_length is not None else '-'} | {drafts} | "
            f"{r.generate_seconds:.1f} | {r.tokens_per_second:.2f} |"
        )
    return "\n".join(rows)


def machine_line() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0]
    return (
        f"machine: {cpu}, {os.cpu_count()} CPUs, load average {load:.2f}; python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM stop every server started (SIGINT may arrive ignored from a
    # non-interactive parent shell, so its handler is set explicitly)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    started = time.perf_counter()
    try:
        check_target(args.target)
        check_draft(args.draft)
        if args.upstream_tree is not None:
            check_tree(args.upstream_tree)
    except InputError as exc:
        say(f"e2e: {exc}")
        return 2
    runs = server_runs(args)
    results: list[RunResult] = []
    try:
        prompts = heldout_prompts(args.prompts, args.prompt_len)
        say(machine_line())
        say(
            f"e2e: target {args.target}, draft {args.draft}; {len(runs)} servers, "
            f"{len(prompts)} prompts x {args.new_tokens} greedy tokens; logs in {args.log_dir}"
        )
        for index, run in enumerate(runs, 1):
            results.append(serve(run, prompts, args, index, len(runs)))
    except ServerError as exc:
        say(f"e2e: {exc}")
        return 1
    except KeyboardInterrupt:
        say("e2e: interrupted; every server started has been stopped")
        return 130
    by_label = {r.run.label: r for r in results}
    failures = check_outputs(by_label, SPEC_KEYS) + check_logs(by_label, args.draft)
    if args.family == "moe":
        failures += check_moe_logs(by_label)
    bars = Bars.of(by_label)
    failures += bars.failures()
    say("")
    say(table(results))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "machine": machine_line(),
                    "family": args.family,
                    "prompts": prompts,
                    "new_tokens": args.new_tokens,
                    "bars": bars.to_json(),
                    "failures": failures,
                    "runs": [r.to_json() for r in results],
                },
                handle,
                indent=1,
            )
    for failure in failures:
        say(f"FAILED: {failure}")
    say(f"total {time.perf_counter() - started:.0f} s; {'FAILED' if failures else 'passed'}")
    fixed = bars.fixed_label
    tps = {k: by_label[k].tokens_per_second for k in ("float", "stock", fixed)}
    say(
        f"{args.line} accept_length float={bars.float:.3f} stock={bars.stock:.3f} "
        f"{fixed}={bars.fixed:.3f} tokens_per_s float={tps['float']:.2f} "
        f"stock={tps['stock']:.2f} {fixed}={tps[fixed]:.2f}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
