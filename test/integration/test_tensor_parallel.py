"""Every rank of a tensor-parallel / expert-parallel draft holds exactly the world-size-1 weights.

Two spawned processes (``support/rank_worker.py``) are two ranks of sglang's own distributed setup
on gloo (``init_distributed_environment`` / ``initialize_model_parallel``). Each activates plugins
with sglang's ``load_plugins()``, builds the real ``Qwen3_5ForCausalLMMTP`` and loads the whole
msmodelslim checkpoint through the plugin; sglang's loaders keep the rank's shard. The shards are
gathered here and compared bit for bit with the same plugin's world-size-1 load in this process.
Three layouts, each on fresh process groups in the same two children:

- dense draft, TP=2 (fused qkv_proj / gate_up_proj column shards, o_proj / down_proj row shards);
- MoE draft, TP=2 with experts tensor-parallel (moe_tp=2: each expert's w13/w2 split);
- MoE draft, TP=2 with expert parallelism 2 (moe_ep=2: experts 0-1 on rank 0, 2-3 on rank 1).
  sglang's FusedMoE builds and loads this way on CPU: expert placement is plain Python and
  the all-to-all backends (the CUDA-only part) are not used with ``moe_a2a_backend`` none.

Mocked: nothing. Not run: any forward pass (no GPU kernels on this machine).
The gather rules below are written from sglang's sharding (not read from its layers), so a
layout change in sglang fails here instead of being followed silently.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sglang_mtp_dequant.tools.cpu_sglang import free_port
from support.paths import fixture_dir
from support.rank_worker import Layout, RankJob, run_rank

pytestmark = pytest.mark.slow  # spawns processes (see pyproject.toml)

WORLD = 2
DENSE = "q35_dense_w8a8_dynamic"
MOE = "q35moe_w8a8_dynamic"
#: tag -> (fixture, expert-parallel size); one load per tag on both ranks
LOADS = {
    "dense_tp2": (DENSE, 1),
    "moe_tp2": (MOE, 1),
    "moe_tp2_ep2": (MOE, 2),
    "moe_tp2_shards_ep2": (MOE, 2),
}
#: tags whose checkpoint is the fixture rewritten over shards (``support/sharded.py``): the
#: routed experts over two, target layers alone in a third that every rank must skip
SHARDED = {"moe_tp2_shards_ep2"}


def moe_over_shards(name: str) -> int:
    """Experts 0-1 (but expert 1's ``down_proj`` scale) in shard 2 with the rest of the MTP
    layer and the embedding; experts 2-3 in shard 3; the target in shard 1."""
    experts = "mtp.layers.0.mlp.experts."
    if name.startswith(experts):
        late = name.startswith(f"{experts}1.down_proj.weight_")
        return 3 if late or int(name[len(experts) :].split(".")[0]) >= 2 else 2
    return 2 if name.startswith("mtp.") or name.endswith("embed_tokens.weight") else 1


#: the whole two-rank run (two sglang imports + four loads) must end within this
RUN_TIMEOUT = 600.0
#: the checkpoint tensors the plugin dequantizes feed these draft parameters
QUANTIZED_PARAMS = {
    DENSE: (
        "model.layers.0.qkv_proj.weight",
        "model.layers.0.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ),
    MOE: (
        "model.layers.0.qkv_proj.weight",
        "model.layers.0.mlp.experts.w13_weight",
        "model.layers.0.mlp.experts.w2_weight",
    ),
}
#: the draft's lm_head is shared from the target at serve time; its own load never fills it
NOT_LOADED = {"lm_head.weight"}


class TwoRanks:
    """The two spawned ranks of one run; ``wait()`` returns their output folder."""

    def __init__(self, out_dir: str) -> None:
        from support.sharded import write_sharded

        self.out_dir = out_dir
        folders = {tag: fixture_dir(name) for tag, (name, _) in LOADS.items()}
        for tag in SHARDED:
            folders[tag] = os.path.join(out_dir, f"{tag}-checkpoint")
            write_sharded(
                fixture_dir(LOADS[tag][0]), folders[tag], moe_over_shards, filler={1: 300}
            )
        layouts = tuple(
            Layout(tag, folders[tag], ep, free_port()) for tag, (_, ep) in LOADS.items()
        )
        ctx = multiprocessing.get_context("spawn")  # the start method sglang forces
        self.procs = [
            ctx.Process(target=run_rank, args=(RankJob(r, WORLD, layouts, out_dir),), daemon=True)
            for r in range(WORLD)
        ]
        self.started = time.monotonic()
        for proc in self.procs:
            proc.start()
        self._done = False
        self._failure: str | None = None

    def wait(self) -> str:
        if not self._done:
            self._failure = self._join()
            self._done = True
        assert self._failure is None, self._failure
        return self.out_dir

    def _join(self) -> str | None:
        deadline = self.started + RUN_TIMEOUT
        # a rank that failed leaves its peer waiting in a collective: stop at once
        while time.monotonic() < deadline and any(p.is_alive() for p in self.procs):
            if any(p.exitcode not in (None, 0) for p in self.procs):
                break
            time.sleep(0.2)
        hung = [p.is_alive() for p in self.procs]
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        self.seconds = time.monotonic() - self.started
        for rank, proc in enumerate(self.procs):
            if proc.exitcode != 0:
                state = "killed after the deadline or a peer's failure" if hung[rank] else ""
                return f"rank {rank} exit {proc.exitcode} {state}: {self._error(rank)}"
        return None

    def _error(self, rank: int) -> str:
        path = os.path.join(self.out_dir, f"rank{rank}.error")
        return open(path).read()[-3000:] if os.path.exists(path) else ""

    def report(self, name: str) -> dict:
        with open(os.path.join(self.wait(), name)) as handle:
            return json.load(handle)

    def shards(self, tag: str) -> list[dict[str, torch.Tensor]]:
        return [load_file(os.path.join(self.wait(), f"{tag}.rank{r}.safetensors")) for r in (0, 1)]


@pytest.fixture(scope="module")
def ranks():
    # not pytest's tmp_path: its base folders rotate under concurrent pytest sessions
    with tempfile.TemporaryDirectory(prefix="mtp-tp2-") as out_dir:
        run = TwoRanks(out_dir)
        yield run
        for proc in run.procs:  # a failed test must not leave ranks behind
            if proc.is_alive():
                proc.kill()


@pytest.fixture(scope="module")
def world_size_one():
    """The same plugin's load of each fixture at world size 1, in this process."""
    return {}


@pytest.fixture
def ws1(world_size_one, load_draft):
    def get(name: str) -> dict[str, torch.Tensor]:
        if name not in world_size_one:
            model = load_draft(fixture_dir(name))
            world_size_one[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
        return world_size_one[name]

    return get


# -- gathering shards the way sglang cut them ---------------------------------------------


def _rows(name: str, tensor: str) -> int:
    folder = fixture_dir(name)
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        with safe_open(os.path.join(folder, file), framework="pt") as handle:
            if tensor in handle.keys():
                return int(handle.get_slice(tensor).get_shape()[0])
    raise KeyError(tensor)


def merged(part_rows: list[int], dim: int) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """Fused column-parallel parameter: each rank holds ``[part0_r; part1_r; ...]`` along
    ``dim``, every part cut in WORLD equal pieces (qkv_proj, gate_up_proj, expert w13)."""

    def gather(shards: list[torch.Tensor]) -> torch.Tensor:
        per_rank = [rows // WORLD for rows in part_rows]
        pieces = [torch.split(shard, per_rank, dim=dim) for shard in shards]
        return torch.cat(
            [torch.cat([p[i] for p in pieces], dim=dim) for i in range(len(part_rows))], dim=dim
        )

    return gather


def concat(dim: int) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """Row-parallel weights (dim 1), vocab-parallel embedding (dim 0), expert-parallel (dim 0)."""
    return lambda shards: torch.cat(shards, dim=dim)


def gather_rules(name: str, tag: str) -> dict[str, Callable | None]:
    """Parameter -> how its WORLD shards rebuild the world-size-1 tensor (None: replicated)."""
    attn = "mtp.layers.0.self_attn."
    qkv = [_rows(name, f"{attn}{p}_proj.weight") for p in ("q", "k", "v")]
    rules: dict[str, Callable | None] = {
        "fc.weight": None,
        "pre_fc_norm_embedding.weight": None,
        "pre_fc_norm_hidden.weight": None,
        "model.embed_tokens.weight": concat(0),
        "model.layers.0.qkv_proj.weight": merged(qkv, 0),
        "model.layers.0.o_proj.weight": concat(1),
        "model.layers.0.input_layernorm.weight": None,
        "model.layers.0.post_attention_layernorm.weight": None,
        "model.layers.0.q_norm.weight": None,
        "model.layers.0.k_norm.weight": None,
        "model.norm.weight": None,
    }
    if name == DENSE:
        inter = _rows(name, "mtp.layers.0.mlp.gate_proj.weight")
        rules["model.layers.0.mlp.gate_up_proj.weight"] = merged([inter, inter], 0)
        rules["model.layers.0.mlp.down_proj.weight"] = concat(1)
        return rules
    shared = _rows(name, "mtp.layers.0.mlp.shared_expert.gate_proj.weight")
    rules["model.layers.0.mlp.gate.weight"] = None
    rules["model.layers.0.mlp.shared_expert_gate.weight"] = None
    rules["model.layers.0.mlp.shared_expert.gate_up_proj.weight"] = merged([shared, shared], 0)
    rules["model.layers.0.mlp.shared_expert.down_proj.weight"] = concat(1)
    if tag.endswith("ep2"):  # whole experts per rank, in expert order
        rules["model.layers.0.mlp.experts.w13_weight"] = concat(0)
        rules["model.layers.0.mlp.experts.w2_weight"] = concat(0)
    else:  # every expert on both ranks, cut like the dense MLP
        inter = _rows(name, "mtp.layers.0.mlp.experts.0.gate_proj.weight")
        rules["model.layers.0.mlp.experts.w13_weight"] = merged([inter, inter], 1)
        rules["model.layers.0.mlp.experts.w2_weight"] = concat(2)
    return rules


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", list(LOADS))
def test_gathered_shards_equal_world_size_one_bit_for_bit(ranks, ws1, tag):
    """First in the file: the world-size-1 loads here overlap the two ranks' start-up."""
    name = LOADS[tag][0]
    reference = ws1(name)
    shards = ranks.shards(tag)
    rules = gather_rules(name, tag)
    assert set(reference) - NOT_LOADED == set(rules), "a draft parameter has no gather rule"
    for rank_params in shards:
        assert set(rank_params) == set(reference)
    for param, rule in rules.items():
        want = reference[param]
        pieces = [s[param] for s in shards]
        if rule is None:
            for rank, piece in enumerate(pieces):
                assert torch.equal(piece.view(torch.int16), want.view(torch.int16)), (rank, param)
            continue
        got = rule(pieces)
        assert got.shape == want.shape, (param, tuple(got.shape), tuple(want.shape))
        assert got.dtype == want.dtype == torch.bfloat16, param
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{tag}: {param}"
    for param in QUANTIZED_PARAMS[name]:
        assert reference[param].abs().max().item() < 1.0, f"{param} is not dequantized at ws1"


def test_each_rank_activated_the_plugin_itself(ranks):
    """Fresh interpreters: no hook inherited; sglang's load_plugins() applied ours in each."""
    pids = set()
    for rank in range(WORLD):
        process = ranks.report(f"rank{rank}.process.json")
        assert process["plugins_loaded_before"] is False
        hook = process["hook"]
        assert hook["registered"] and hook["applied"] and hook["wrapped"], hook
        assert hook["hooks"] == ["sglang_mtp_dequant[Qwen3_5ForCausalLMMTP]"], hook
        pids.add(process["pid"])
    assert len(pids) == WORLD and os.getpid() not in pids


@pytest.mark.parametrize("tag", list(LOADS))
def test_ranks_are_the_layout_sglang_computed(ranks, tag):
    ep = LOADS[tag][1]
    for rank in range(WORLD):
        got = ranks.report(f"{tag}.rank{rank}.json")["ranks"]
        assert got["tp_rank"] == got["published_tp_rank"] == rank and got["tp_size"] == WORLD
        assert (got["moe_ep_size"], got["moe_tp_size"]) == (ep, WORLD // ep)
        assert (got["moe_ep_rank"], got["moe_tp_rank"]) == ((rank, 0) if ep == 2 else (0, rank))


#: what each rank's INFO line says: under EP=2 a rank decodes only the 2 experts it keeps (of
#: 4 experts x 3 projections) and passes the other 6 tensors on undecoded (its FusedMoE drops them)
DECODED = {
    "dense_tp2": ("dequantized 7 tensors (W8A8_DYNAMIC x7)", "0 expert tensors left"),
    "moe_tp2": ("dequantized 15 tensors (W8A8_DYNAMIC x15)", "0 expert tensors left"),
    "moe_tp2_ep2": ("dequantized 9 tensors (W8A8_DYNAMIC x9)", "6 expert tensors left"),
    "moe_tp2_shards_ep2": (
        "dequantized 9 tensors (W8A8_DYNAMIC x9)",
        "6 expert tensors left",
        "; streamed 2 of 3 weight files, skipped 1 holding no draft tensor",
    ),
}


@pytest.mark.parametrize("tag", list(LOADS))
def test_hook_dequantized_what_each_rank_keeps(ranks, tag):
    """One INFO line per rank per load (and no complaint from the completeness audit or the
    value guard): the hook ran there and decoded the quantized tensors this rank keeps."""
    for rank in range(WORLD):
        log = ranks.report(f"{tag}.rank{rank}.json")["plugin_log"]
        assert len(log) == 1 and all(part in log[0] for part in DECODED[tag]), log


@pytest.mark.parametrize("tag", list(LOADS))
def test_stock_sglang_loads_raw_codes_on_every_rank(ranks, tag):
    """Without the hook, each rank's shard of each quantized projection holds int8 codes."""
    name = LOADS[tag][0]
    for rank in range(WORLD):
        absmax = ranks.report(f"{tag}.rank{rank}.json")["stock_absmax"]
        for param in QUANTIZED_PARAMS[name]:
            assert absmax[param] >= 100, (rank, param, absmax[param])


def test_every_rank_holds_a_different_shard_of_the_quantized_projections(ranks):
    """Guards the test itself: the two ranks' shards really differ (no accidental replication)."""
    for tag, (name, _) in LOADS.items():
        rank0, rank1 = ranks.shards(tag)
        for param in QUANTIZED_PARAMS[name]:
            assert not torch.equal(rank0[param], rank1[param]), (tag, param)
