"""The sglang pull-request stack (upstream/series/ = PR 1, upstream/stack/*/ = the follow-ups)
against the pinned release, and against the plugin.

One implementation, not two: the branch's decode arithmetic (its
``python/sglang/srt/layers/quantization/modelslim/modelslim_draft.py``) must give the same bits
as the plugin's schemes on every scheme the branch covers. The branch is materialized here from
the pinned wheel exactly as ``make upstream-tree`` does (``upstream/tree.py``: sha256 checked,
baseline commit checked against ``upstream/BASE``, series applied with ``git am``), in a
temporary folder; the wheel is downloaded with pip into ``.cache/upstream/`` when absent (the
test fails, never skips, when it cannot be had).

"Current" means: ``git format-patch --zero-commit --no-signature`` of the branch that ``git am``
built from the committed series reproduces the committed files byte for byte, and the folder
holds nothing else (``upstream/tree.py`` docstring). Nothing in the series is generated, so
there is no generated part to compare with a source.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import tree

ROOT = Path(__file__).resolve().parent.parent

BRANCH_MODULE = "python/sglang/srt/layers/quantization/modelslim/modelslim_draft.py"


@pytest.fixture(scope="module")
def branch_tree(tmp_path_factory):
    base = tree.read_base()
    repo = tmp_path_factory.mktemp("upstream") / "sglang"
    info = tree.build_tree(repo, base, python=sys.executable)
    return repo, base, info


def test_series_applies_to_the_pinned_base_with_git_am(branch_tree):
    repo, base, info = branch_tree
    assert info["rebuilt_baseline"] and info["applied_series"]
    assert tree.git(repo, "rev-parse", f"{tree.TAG}^{{commit}}") == base["baseline_commit"]
    patches = tree.series_files()
    assert patches, "upstream/series/ holds no patch"
    assert len(info["commits"]) == len(patches)
    assert tree.git(repo, "status", "--porcelain") == ""
    # the branch touches only sglang's own paths
    touched = tree.git(repo, "diff", "--name-only", f"{tree.TAG}..HEAD").splitlines()
    assert touched and all(p.startswith(("python/sglang/", "test/registered/")) for p in touched)


def test_pr1_alone_is_the_qwen3_5_mtp_change_within_its_budget(branch_tree):
    """upstream/series/ is PR 1: qwen3_5_mtp.py and its one registered test, nothing else,
    within the line budget (issue #24: 200 + 250, 450 in all)."""
    repo, _, _ = branch_tree
    numstat = tree.git(repo, "diff", "--numstat", tree.TAG, tree.step_ref("series"))
    added = {path: int(n) for n, _, path in (line.split("\t") for line in numstat.splitlines())}
    model = "python/sglang/srt/models/qwen3_5_mtp.py"
    test = "test/registered/unit/models/test_qwen3_5_mtp_w8a8_dequant.py"
    assert set(added) == {model, test}
    assert added[model] <= 200 and added[test] <= 250 and sum(added.values()) <= 450, added
    assert [name for name, _ in tree.steps()][0] == "series" and len(tree.steps()) >= 2


def test_plugin_steps_aside_per_class_for_pr1_alone(monkeypatch):
    """With PR 1 alone sglang fixes Qwen3.5's MTP only: the plugin must step aside for a
    ``load_weights`` from a module defining PR 1's error type, and for no other."""
    import types

    from sglang_mtp_dequant.serving import plugin

    fixed = types.ModuleType("sglang_pr1_fixed_module")
    setattr(fixed, plugin.UPSTREAM_FIX_MARKER, ValueError)
    monkeypatch.setitem(sys.modules, fixed.__name__, fixed)
    monkeypatch.setattr(plugin, "UPSTREAM_FIX", "sglang_mtp_dequant_no_such_module")

    def load_weights(self, weights):
        return weights

    assert not plugin.sglang_dequantizes_drafts(load_weights)
    load_weights.__module__ = fixed.__name__
    assert plugin.sglang_dequantizes_drafts(load_weights)
    assert not plugin.sglang_dequantizes_drafts(None)


def test_committed_series_is_current(branch_tree):
    repo, base, _ = branch_tree
    assert tree.check_current(repo, base) == []


def _branch_decoder(repo: Path):
    """The branch's module, loaded from its file (its top level imports only stdlib and
    torch; sglang's own imports are inside the functions that need them)."""
    spec = importlib.util.spec_from_file_location("upstream_modelslim_draft", repo / BRANCH_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plugin():
    """The plugin's scheme registry and header record, wherever the package keeps them."""
    try:
        from sglang_mtp_dequant.formats.checkpoint import TensorInfo
        from sglang_mtp_dequant.formats.schemes import scheme_for
    except ImportError:
        from sglang_mtp_dequant.checkpoint import TensorInfo
        from sglang_mtp_dequant.schemes import scheme_for
    return scheme_for, TensorInfo


def _cases():
    """(scheme, codes, companions, group_size) for every scheme the branch decodes, with
    full-range codes, tiny, huge and tie-making scales, offsets, and each storage form."""
    gen = torch.Generator().manual_seed(17)
    out, inp = 40, 96
    q = torch.randint(-128, 128, (out, inp), dtype=torch.int8, generator=gen)
    q[0, :4] = torch.tensor([-128, 127, 0, 1], dtype=torch.int8)
    scales = {
        "random": torch.rand(out, 1, generator=gen) * 1e-2 + 1e-6,
        "tie": torch.full((out, 1), 1 + 2**-8),
        "subnormal": torch.full((out, 1), 1e-40),
        "overflow": torch.full((out, 1), 3e37),
    }
    group = torch.rand(out, 3, generator=gen) * 1e-2 + 1e-6
    offset = torch.randint(-20, 20, (out, 1), generator=gen).float()
    group_offset = torch.randint(-20, 20, (out, 3), generator=gen).float()
    deq = torch.rand(out, generator=gen) * 1e-3 + 1e-7
    input_scale = torch.tensor([0.0173])

    def affine(scale, offset):
        return {"weight_scale": scale, "weight_offset": offset}

    for label, scale in scales.items():
        yield f"W8A8_DYNAMIC {label}", "W8A8_DYNAMIC", q, affine(scale, 0 * scale), 0
        yield f"W8A16 {label}", "W8A16", q, affine(scale, offset), 0
    v0_scale = scales["random"].bfloat16()
    yield "W8A8_DYNAMIC bf16 V0 scale", "W8A8_DYNAMIC", q, {"weight_scale": v0_scale}, 0
    yield "W8A8_DYNAMIC per group", "W8A8_DYNAMIC", q, affine(group, 0 * group), 32
    yield "W8A16 per group", "W8A16", q, affine(group, group_offset), 32
    static = {
        "input_scale": input_scale,
        "input_offset": torch.tensor([3.0]),
        "quant_bias": torch.randint(-9, 9, (out,), dtype=torch.int32, generator=gen),
    }
    yield "W8A8 f32 deq_scale", "W8A8", q, {"deq_scale": deq, **static}, 0
    bits = deq.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    yield "W8A8 int64 deq_scale", "W8A8", q, {"deq_scale": bits, **static}, 0
    v0 = affine(v0_scale, torch.zeros(out, 1).bfloat16())
    yield "W8A8_MIX V0", "W8A8_MIX", q, {"deq_scale": deq, **static, **v0}, 0
    yield "W8A8_MIX V1", "W8A8_MIX", q, {"deq_scale": deq, **static}, 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_branch_and_plugin_decode_bit_identically(branch_tree, dtype):
    branch = _branch_decoder(branch_tree[0])
    scheme_for, TensorInfo = _plugin()
    ints = {2: torch.int16, 4: torch.int32}[torch.finfo(dtype).bits // 8]
    checked = set()
    for label, scheme, q, companions, group_size in _cases():
        info = TensorInfo("mtp.x.weight", "x.safetensors", q.dtype, tuple(q.shape))
        plugin = scheme_for(scheme).prepare(info, dict(companions), group_size).decompress(q, dtype)
        ours = branch.decode_modelslim_weight(
            "mtp.x.weight", scheme, q, dict(companions), group_size, dtype
        )
        assert ours.dtype == plugin.dtype == dtype, label
        assert torch.equal(ours.view(ints), plugin.view(ints)), label
        checked.add(scheme)
    assert checked == set(branch.SUPPORTED_TYPES)


@pytest.mark.slow
def test_plugin_steps_aside_on_the_patched_tree(branch_tree, load_draft, tmp_path):
    """The plugin over sglang with the fix: one INFO line saying it steps aside, sglang's own
    dequantization does the work, and the draft gets the same bits as the plugin alone gives
    on stock sglang (no double dequantization: a second decode of bf16 weights is refused by
    neither side, it would change every value)."""
    import os
    import subprocess

    from safetensors.torch import load_file

    from support.paths import fixture_dir

    repo = branch_tree[0]
    folder = fixture_dir("q35_dense_w8a8_dynamic")
    env = dict(os.environ, PYTHONPATH=str(repo / "python"), SGLANG_PLUGINS="mtp_dequant")
    cmd = [sys.executable, str(ROOT / "upstream" / "load_draft.py"), "--out", str(tmp_path)]
    proc = subprocess.run(
        cmd + ["--expect", "both", folder], env=env, capture_output=True, text=True, timeout=1800
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    ours = [line for line in output.splitlines() if line.startswith("sglang_mtp_dequant ")]
    assert len(ours) == 1, ours
    assert "INFO" in ours[0] and "leaves the Qwen3_5ForCausalLMMTP draft load to it" in ours[0]
    assert "Dequantized 7 ModelSlim draft weights (W8A8_DYNAMIC x7)" in output
    loaded = load_file(str(tmp_path / "q35_dense_w8a8_dynamic.safetensors"))
    alone = dict(load_draft(folder).named_parameters())  # stock sglang + plugin, this process
    compared = 0
    for key, value in loaded.items():
        if value.is_floating_point() and value.isnan().all():
            continue  # taken from the target after loading (lm_head): no loader writes it
        want = alone[key.split("/", 1)[1]].detach()
        assert torch.equal(value, want), key
        compared += 1
    assert compared == len(loaded) - 1
