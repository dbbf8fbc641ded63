"""The MTP draft's parameter memory per rank, for each launch form that serves, at full size.

Usage::

    .venv/bin/python benchmarks/draft_memory.py                      # every model below
    .venv/bin/python benchmarks/draft_memory.py --models qwen3.5-27b --json .cache/bench/memory.json

What it measures: for each model, each launch form (``tools/forms.py``: F1 flagless, F2
``--quantization modelslim``, F3 ``--speculative-draft-model-quantization unquant``, F4
``--speculative-draft-model-quantization modelslim``) and each rank of the model's usual
deployment, the bytes of the parameters sglang 0.5.23's own draft class creates on that rank
(``tools/draft_memory.py``: less the embedding and lm_head, which the draft takes from the
target). The draft is built on the meta device from a folder holding the model's real
``config.json`` values and a ``quant_model_description.json`` written as msmodelslim describes
the export (no weights: building reads neither), through the doctor's own build
(``dryrun.build_meta_draft``: sglang's draft ``ModelConfig`` for the launch's flags, its
quantization config, the class as on NPU, NPU kernels looked up at construction answered by
placeholders). A form whose draft stock sglang cannot build (a ModelSlim build meeting MoE
experts described FLOAT, sglang #34211) is built as the plugin builds it (the serving hook's own
answers: ``float_layers.builds_as_the_plugin``) and marked so.

How each rank is set up: one process per rank, each a rank of a real gloo world of the
deployment's size joined with sglang's own ``init_distributed_environment`` /
``initialize_model_parallel`` and its ServerArgs published with its world rank
(``support.cpu_sglang.join_parallel_world``, as ``test_tensor_parallel.py``'s ranks do), so the
linear layers read their TP shard and FusedMoE its experts from sglang's own parallel state.

The models (config values: docs/results.md, "Draft memory per form"):

- ``qwen3.5-27b``: Qwen3.5-27B at TP 2 (dense MTP layer, W8A8_DYNAMIC);
- ``qwen3.5-397b``: Qwen3.5-397B-A17B, the largest Qwen3.5/3.6 MoE, at TP 16 / EP 16 (sglang's
  Ascend tutorial's sizes), its MTP experts W8A8_DYNAMIC (msmodelslim's Qwen3.6 recipe);
- ``qwen3.5-397b-float-mtp-experts``: the same with the MTP routed experts FLOAT, as published
  Qwen3.6-35B-A3B exports describe theirs;
- ``glm-5.1``: GLM-5.1-w8a8 at TP 16 / EP 16 (its published description: static W8A8 attention,
  W8A8_DYNAMIC experts).

What the draft holds when sglang sizes the KV pool (issue #50): stock sglang's draft still holds
its own vocab-sized ``embed_tokens`` / ``lm_head`` then (``draft_memory.vocab_copy_bytes``); with
the plugin those are never allocated. Each build is made for an EAGLE launch with the plugin's
own hooks on the draft's vocab layers applied and no other (``vocab_hooks_applied``: the builds
stay stock sglang's), and ``draft_vocab.held_back`` counts what they kept off the device.

Prints the machine and one line per (model, form): bytes on each rank (equal on every rank, or
the range), and the bytes at KV sizing, stock and with the plugin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import support_on_path  # noqa: E402, F401  (test/ on sys.path, for support.*)

from sglang_mtp_dequant.tools.forms import FORMS  # noqa: E402

#: the launch forms (key, flags): ``tools/forms.py``'s
FORM_FLAGS = {key: list(form.flags) for key, form in FORMS.items()}

#: every form is an MTP launch: sglang's EAGLE worker is what shares the target's vocab layers
SPECULATIVE = ("--speculative-algorithm", "EAGLE")


@dataclass(frozen=True)
class Model:
    key: str
    title: str
    tp: int
    ep: int


MODELS = (
    Model("qwen3.5-27b", "Qwen3.5-27B", 2, 1),
    Model("qwen3.5-397b", "Qwen3.5-397B-A17B", 16, 16),
    Model("qwen3.5-397b-float-mtp-experts", "Qwen3.5-397B-A17B, MTP experts FLOAT", 16, 16),
    Model("glm-5.1", "GLM-5.1-w8a8", 16, 16),
)


def write_model(key: str, folder: str) -> None:
    """``config.json`` and ``quant_model_description.json`` of model ``key`` into ``folder``."""
    config, description = _config_and_description(key)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    with open(os.path.join(folder, "quant_model_description.json"), "w") as handle:
        json.dump(description, handle)


def _config_and_description(key: str) -> tuple[dict, dict]:
    if key == "qwen3.5-27b":
        from bench_doctor import config_27b, layout

        description = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0", "group_size": 0}
        for name, dtype, _ in layout():
            quantized = dtype == "I8" or name.endswith(("_scale", "_offset"))
            description[name] = "W8A8_DYNAMIC" if quantized else "FLOAT"
        return config_27b(), description
    if key.startswith("qwen3.5-397b"):
        from bench_target_layers import config_397b, description

        config = config_397b()
        described = description(config)
        if key.endswith("float-mtp-experts"):
            for name in [n for n in described if n.startswith("mtp.layers.0.mlp.experts.")]:
                if name.endswith(".weight"):
                    described[name] = "FLOAT"
                else:
                    del described[name]
        return config, described
    from support.real_layouts import glm5_config, glm51_w8a8

    return glm5_config(scale=1), glm51_w8a8(scale=1).description


# -- one rank ----------------------------------------------------------------------------------


def rank_worker(folder: str, tp: int, ep: int, rank: int, port: int, out: str) -> None:
    """This process as rank ``rank`` of a TP ``tp`` / EP ``ep`` gloo world: the draft's bytes
    for each form, into ``out`` (JSON)."""
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()
    from support.cpu_sglang import join_parallel_world

    join_parallel_world(folder, world_size=tp, rank=rank, port=port, ep_size=ep)
    vocab_hooks_applied()
    target_quant_config_first(folder)
    found = {key: _form_bytes(folder, flags, tp, ep, rank) for key, flags in FORM_FLAGS.items()}
    with open(out, "w") as handle:
        json.dump(found, handle)


def vocab_hooks_applied() -> None:
    """The plugin's hooks on the draft's vocab layers (``draft_vocab.VOCAB_HOOKS``) applied in
    this process, and none of its others: each form is still built as stock sglang builds it."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_mtp_dequant.serving.draft_vocab import VOCAB_HOOKS

    for target, hook, _ in VOCAB_HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
    HookRegistry.apply_hooks()


def target_quant_config_first(folder: str) -> None:
    """Create the target's quantization config, as a server does before it builds the draft.

    sglang's ``ModelSlimConfig`` patches ``RMSNorm`` for the whole process when the description
    lists any ``norm.bias`` (GLM-5.1's indexer ``k_norm.bias``): every norm built afterwards,
    the draft's included, carries a bias. A server always creates the target's config first
    (ModelSlim is auto-detected for the target in every form), so the draft is counted so."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_mtp_dequant.serving import sglang_private

    target = ModelConfig.from_server_args(sglang_private.published_server_args(), model_path=folder)
    sglang_private.quantization_config(target, LoadConfig(load_format="auto"))


def _form_bytes(folder: str, flags: list[str], tp: int, ep: int, rank: int) -> dict[str, Any]:
    """The draft for one form on this rank: its bytes, by dtype, and how it was built."""
    from sglang_mtp_dequant.serving import sglang_private
    from sglang_mtp_dequant.tools.cpu_sglang import publish_context
    from sglang_mtp_dequant.tools.launch import parse_launch

    launch = parse_launch(
        folder, [*flags, *SPECULATIVE, "--tp-size", str(tp), "--ep-size", str(ep)]
    )
    publish_context(folder, tp_size=tp, ep_size=ep, **launch.server_args())
    args = sglang_private.published_server_args()
    sglang_private.publish_server_args(args, role="scheduler", world_rank=rank)
    try:
        return _built_bytes(folder, launch)
    finally:  # leave the published ranks as rank 0's, which every world has
        sglang_private.publish_server_args(args, role="scheduler", world_rank=0)


def _built_bytes(folder: str, launch: Any) -> dict[str, Any]:
    from sglang_mtp_dequant.serving.draft_vocab import held_back
    from sglang_mtp_dequant.serving.float_layers import builds_as_the_plugin
    from sglang_mtp_dequant.tools.cpu_sglang import build_draft, draft_model_config
    from sglang_mtp_dequant.tools.draft_memory import (
        bytes_by_dtype,
        draft_parameter_bytes,
        vocab_copy_bytes,
    )

    config = draft_model_config(folder)
    how = "sglang's build"
    with launch.platform():
        try:
            model = build_draft(config, "meta")
        except Exception as exc:  # noqa: BLE001 - stock cannot build it: the plugin's build
            try:
                model = build_draft(config, "meta", builds_as_the_plugin)
            except Exception as refused:  # noqa: BLE001 - the plugin's refusal, or sglang's
                return {"error": f"{type(refused).__name__}: {refused}"}
            how = f"the plugin's build; stock: {type(exc).__name__}: {exc}"
    quant = getattr(model, "quant_config", None)
    return {
        "class": type(model).__name__,
        "quantized": None if quant is None else str(quant.get_name()),
        "bytes": draft_parameter_bytes(model),
        "vocab_copy_bytes": vocab_copy_bytes(model),
        "held_back": held_back(model),
        "by_dtype": bytes_by_dtype(model),
        "how": how,
    }


def _rank_fields(tp: int, ep: int, rank: int) -> dict[str, Any]:
    """sglang's parallel fields of rank ``rank`` of TP ``tp`` / EP ``ep`` (no attention DP,
    no context parallelism): widths, ranks, and a group coordinator of each width.

    The ranks follow sglang's own arithmetic (``runtime_context.derive_spawn_ranks``)."""
    import copy

    from sglang.srt.distributed import parallel_state

    shared = parallel_state.get_tp_group()  # world size 1: every group is this coordinator

    def group(size: int, in_group: int) -> Any:
        made = copy.copy(shared)
        made.world_size, made.rank_in_group = size, in_group
        return made

    moe_tp = tp // ep
    return {
        "tp_size": tp, "tp_rank": rank, "tp_group": group(tp, rank),
        "attn_tp_size": tp, "attn_tp_rank": rank, "attn_tp_group": group(tp, rank),
        "moe_ep_size": ep, "moe_ep_rank": rank // moe_tp, "moe_ep_group": group(ep, rank // moe_tp),
        "moe_tp_size": moe_tp, "moe_tp_rank": rank % moe_tp,
        "moe_tp_group": group(moe_tp, rank % moe_tp), "ep_size": ep,
    }  # fmt: skip


@contextlib.contextmanager
def as_rank(tp: int, ep: int, rank: int) -> Iterator[None]:
    """In one process joined to sglang's parallel state at world size 1: sglang's own scoped
    override of its parallel context (``get_parallel().override``, which its errors point to)
    answering as rank ``rank`` of TP ``tp`` / EP ``ep``: each width and rank, and a group
    coordinator of that width and rank for TP, attention TP and MoE EP / TP, which is what the
    layers read while they are built. No collective runs while a class is built;
    ``test_draft_memory.py`` checks this against the ranks of a real gloo world."""
    from sglang.srt.distributed import parallel_state

    with parallel_state.get_parallel().override(**_rank_fields(tp, ep, rank)):
        yield


def in_process(folder: str, tp: int, ep: int) -> list[dict[str, Any]]:
    """Every rank of the world in this process (``as_rank``): per rank, form -> figures."""
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    prepare_cpu_process(folder)
    vocab_hooks_applied()
    target_quant_config_first(folder)
    per_rank = []
    for rank in range(tp):
        with as_rank(tp, ep, rank):
            per_rank.append(
                {key: _form_bytes(folder, flags, tp, ep, rank) for key, flags in FORM_FLAGS.items()}
            )
    return per_rank


# -- the parent --------------------------------------------------------------------------------


def measure(model: Model, root: str, world: str) -> dict[str, list[dict[str, Any]]]:
    """Every rank of ``model``'s world (``world``: ``processes``, one process per rank of a
    real gloo world; ``in-process``, ``as_rank``): form -> per-rank results."""
    folder = os.path.join(root, model.key)
    write_model(model.key, folder)
    per_rank = (
        in_process(folder, model.tp, model.ep)
        if world == "in-process"
        else (in_processes(folder, model, root))
    )
    return {form: [rank[form] for rank in per_rank] for form in FORM_FLAGS}


def in_processes(folder: str, model: Model, root: str) -> list[dict[str, Any]]:
    """One process per rank, each a rank of a real gloo world (``rank_worker``)."""
    from sglang_mtp_dequant.tools.cpu_sglang import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "test"), "TQDM_DISABLE": "1"}
    procs, outs = [], []
    for rank in range(model.tp):
        out = os.path.join(root, f"{model.key}.rank{rank}.json")
        args = [sys.executable, __file__, "--rank-worker", folder, str(model.tp), str(model.ep),
                str(rank), str(port), out]  # fmt: skip
        log = open(os.path.join(root, f"{model.key}.rank{rank}.log"), "w")
        procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        outs.append(out)
    for proc, log in procs:
        proc.wait(timeout=1500)
        log.close()
    failed = [i for i, (proc, _) in enumerate(procs) if proc.returncode != 0]
    if failed:
        with open(os.path.join(root, f"{model.key}.rank{failed[0]}.log")) as handle:
            raise RuntimeError(f"{model.key} rank {failed[0]} failed:\n{handle.read()[-3000:]}")
    per_rank = []
    for out in outs:
        with open(out) as handle:
            per_rank.append(json.load(handle))
    return per_rank


def form_line(model: Model, form: str, ranks: list[dict[str, Any]]) -> str:
    from sglang_mtp_dequant.tools.draft_memory import size_text

    if "error" in ranks[0]:
        return f"{model.key} {form}: not built: {ranks[0]['error']}"
    sizes = sorted({r["bytes"] for r in ranks})
    each = (
        f"{sizes[0]:,} B ({size_text(sizes[0])})"
        if len(sizes) == 1
        else (f"{sizes[0]:,}-{sizes[-1]:,} B")
    )
    built = f"quantized ({ranks[0]['quantized']})" if ranks[0]["quantized"] else "unquantized"
    plugin = " [the plugin's build]" if ranks[0]["how"] != "sglang's build" else ""
    dtypes = ", ".join(f"{k} {v:,}" for k, v in sorted(ranks[0]["by_dtype"].items()))
    return (
        (
            f"{model.key} TP{model.tp}/EP{model.ep} {form}: {ranks[0]['class']} {built}{plugin}; "
            f"per rank {each} on every one of {len(ranks)} ranks"
            if len(sizes) == 1
            else f"{model.key} TP{model.tp}/EP{model.ep} {form}: per rank {each}"
        )
        + f" [{dtypes}]; "
        + _sizing_text(ranks)
    )


def _sizing_text(ranks: list[dict[str, Any]]) -> str:
    """What a rank holds at KV sizing, stock and with the plugin (the largest rank)."""
    stock = max(r["bytes"] + r["vocab_copy_bytes"] for r in ranks)
    plugin = max(r["bytes"] + r["vocab_copy_bytes"] - r["held_back"] for r in ranks)
    held = max(r["held_back"] for r in ranks)
    return f"at KV sizing: stock {stock:,} B, plugin {plugin:,} B ({held:,} B never allocated)"


def _in_child(model: Model, root: str, world: str) -> dict[str, list[dict[str, Any]]]:
    out = os.path.join(root, f"{model.key}.json")
    command = [sys.executable, __file__, "--models", model.key, "--world", world, "--json", out]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as handle:
        return json.load(handle)[model.key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", nargs="*", default=[m.key for m in MODELS])
    parser.add_argument("--json", help="write every rank's figures here")
    parser.add_argument(
        "--world",
        choices=("in-process", "processes"),
        default="in-process",
        help="every rank in this process (as_rank), or one process per rank of a gloo world",
    )
    parser.add_argument("--rank-worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        folder, tp, ep, rank, port, out = args.rank_worker
        rank_worker(folder, int(tp), int(ep), int(rank), int(port), out)
        return
    from machine import describe

    print(describe(), flush=True)
    results = {}
    chosen = [m for m in MODELS if m.key in args.models]
    with tempfile.TemporaryDirectory(prefix="draft-memory-") as root:
        for model in chosen:
            started = time.perf_counter()
            if len(chosen) == 1:
                results[model.key] = measure(model, root, args.world)
            else:  # each model in a fresh process: sglang's published context is per process
                results[model.key] = _in_child(model, root, args.world)
            for form, ranks in results[model.key].items():
                print(form_line(model, form, ranks), flush=True)
            took = time.perf_counter() - started
            print(f"{model.key}: {model.tp} ranks ({args.world}) in {took:.0f} s", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
