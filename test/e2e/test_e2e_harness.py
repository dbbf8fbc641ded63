"""``make e2e`` on bad input: a clear message in seconds, a non-zero exit, no process left.

The harness (``e2e/run.py``) is run as users run it, as a command. Its passing
run (four real sglang servers, minutes on this CPU) is ``make e2e`` / ``make e2e-short``,
which CI runs at every landing (``.ci/run``); these tests cover what must fail fast.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from e2e.server import RUN_MARK, TEMP_PREFIX

from support.paths import E2E, ROOT

#: the harness as users run it: ``python -m e2e`` from the repository root
HARNESS = ("-m", "e2e")

FLOAT, W8A8 = os.path.join(E2E, "float"), os.path.join(E2E, "w8a8")
MOE_FLOAT, MOE_W8A8 = os.path.join(E2E, "moe_float"), os.path.join(E2E, "moe_w8a8")
HYBRID_FLOAT, HYBRID_W8A8 = os.path.join(E2E, "hybrid_float"), os.path.join(E2E, "hybrid_w8a8")


def run_harness(*args: str, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, *HARNESS, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    return out, time.perf_counter() - started


def server_temp_dirs() -> set[str]:
    """The servers' own temporary folders now in the temp dir (``e2e.server.TEMP_PREFIX``)."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(TEMP_PREFIX)}


def server_processes(log_dir) -> list[str]:
    """Live processes of any server whose log is under ``log_dir``: the launcher and every
    process it spawned inherit ``RUN_MARK`` (set to the server's log path) in their
    environment."""
    mark = f"{RUN_MARK}={log_dir}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z" and any(entry.startswith(mark) for entry in environ):
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                found.append(f"{pid}: " + handle.read().replace(b"\0", b" ").decode()[:200])
    return found


def test_the_bundled_default_is_what_the_harness_serves():
    """The default TARGET / DRAFT exist, and the draft really holds int8 MTP codes."""
    from safetensors import safe_open

    with open(os.path.join(FLOAT, "config.json")) as handle:
        config = json.load(handle)
    assert config["full_attention_interval"] == 1
    assert set(config["layer_types"]) == {"full_attention"}
    with safe_open(os.path.join(W8A8, "quant_model_weights-00001-of-00001.safetensors"), "np") as f:
        codes = [n for n in f.keys() if n.startswith("mtp.") and f.get_slice(n).get_dtype() == "I8"]  # noqa: SIM118
    assert len(codes) == 7, codes


def test_the_bundled_moe_default_is_what_the_harness_serves():
    """``--family moe``: a Qwen3.5-MoE, every layer full attention, whose ModelSlim draft holds
    int8 codes for its attention, every routed expert, the shared expert and its gate, and
    keeps the router float."""
    from safetensors import safe_open

    with open(os.path.join(MOE_FLOAT, "config.json")) as handle:
        config = json.load(handle)
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["full_attention_interval"] == 1
    assert set(config["layer_types"]) == {"full_attention"}
    experts = config["num_experts"]
    with safe_open(os.path.join(MOE_FLOAT, "model.safetensors"), "np") as f:
        names = set(f.keys())  # noqa: SIM118
    # the MTP layer's experts one per tensor (Qwen3.5-MoE's release layout), the backbone's fused
    assert {f"mtp.layers.0.mlp.experts.{e}.up_proj.weight" for e in range(experts)} <= names
    assert "model.layers.0.mlp.experts.gate_up_proj" in names
    shard = os.path.join(MOE_W8A8, "quant_model_weights-00001-of-00001.safetensors")
    with safe_open(shard, "np") as f:
        dtypes = {n: f.get_slice(n).get_dtype() for n in f.keys() if n.startswith("mtp.")}  # noqa: SIM118
    codes = {n for n, d in dtypes.items() if d == "I8"}
    assert len(codes) == 4 + 3 * experts + 3 + 1, sorted(codes)
    assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in codes
    assert "mtp.layers.0.mlp.shared_expert_gate.weight" in codes
    assert dtypes["mtp.layers.0.mlp.gate.weight"] == "BF16"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--target", "/nonexistent/float"], "TARGET /nonexistent/float does not exist"),
        (["--draft", "/nonexistent/w8a8"], "DRAFT /nonexistent/w8a8 does not exist"),
        (
            ["--draft", os.path.join(W8A8, "quant_model_weights-00001-of-00001.safetensors")],
            "is a file, not a folder",
        ),
        (["--draft", FLOAT], "every mtp.* tensor is float: there is nothing for the plugin"),
        (
            ["--family", "moe", "--draft", MOE_FLOAT],
            "every mtp.* tensor is float: there is nothing for the plugin",
        ),
    ],
    ids=["target-missing", "draft-missing", "draft-is-a-file", "draft-float", "moe-draft-float"],
)
def test_bad_folders_are_refused_in_seconds(args, said):
    out, seconds = run_harness(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stdout
    assert seconds < 10, seconds


def test_a_draft_without_mtp_tensors_is_refused(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    draft = tmp_path / "no_mtp"
    draft.mkdir()
    shutil.copy(os.path.join(W8A8, "config.json"), draft)
    save_file({"model.norm.weight": np.ones(4, np.float32)}, str(draft / "model.safetensors"))
    out, seconds = run_harness("--draft", str(draft))
    assert out.returncode == 2
    assert f"DRAFT {draft} has no mtp.* tensors" in out.stdout
    assert seconds < 10


def test_a_port_in_use_is_refused_before_a_server_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out, seconds = run_harness("--port", str(port), "--log-dir", str(tmp_path))
    assert out.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in out.stdout
    assert seconds < 30  # the prompts (sglang's corpus) are read first
    assert not server_processes(tmp_path)


@pytest.mark.slow
def test_a_server_that_dies_during_start_up_is_reported_with_its_log(tmp_path):
    """A target sglang cannot build (an unknown architecture): the server exits during
    start-up; the harness says so with the log's tail, exits 1, leaves no process."""
    target = tmp_path / "broken"
    shutil.copytree(FLOAT, target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    out, _ = run_harness("--target", str(target), "--log-dir", str(tmp_path / "logs"), timeout=600)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "the reference server exited with status" in out.stdout
    assert "last lines:" in out.stdout and "NoSuchModelForCausalLM" in out.stdout
    assert not server_processes(tmp_path / "logs")


@pytest.mark.slow
def test_ctrl_c_during_start_up_stops_the_server(tmp_path):
    """SIGINT while the first server starts (its launcher and a spawned child alive): exit
    130 and no process of it left."""
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, *HARNESS, "--log-dir", str(log_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(server_processes(log_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(server_processes(log_dir)) >= 2, "the server never spawned its processes"
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed assertion above: stop it the other documented way
            proc.terminate()
            proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout[-3000:]
    assert "interrupted; every server started has been stopped" in stdout
    assert not server_processes(log_dir)


def test_the_bundled_hybrid_is_qwen35s_layer_pattern():
    """``--family hybrid``: three Gated DeltaNet layers then one full-attention layer (the key
    sglang reads, ``full_attention_interval: 4``), and its ModelSlim export quantizes what
    msmodelslim's Qwen3.5 recipe does: attention and MLP linears (the MTP layer's included),
    never the GDN projections."""
    from safetensors import safe_open

    with open(os.path.join(HYBRID_FLOAT, "config.json")) as handle:
        config = json.load(handle)
    assert config["full_attention_interval"] == 4
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    with open(os.path.join(HYBRID_W8A8, "quant_model_description.json")) as handle:
        description = json.load(handle)
    gdn = {n: k for n, k in description.items() if ".linear_attn." in n}
    assert gdn and set(gdn.values()) == {"FLOAT"}
    shard = os.path.join(HYBRID_W8A8, "quant_model_weights-00001-of-00001.safetensors")
    with safe_open(shard, "np") as f:
        codes = {n for n in f.keys() if f.get_slice(n).get_dtype() == "I8"}  # noqa: SIM118
    assert len([n for n in codes if n.startswith("mtp.")]) == 7
    assert not [n for n in codes if ".linear_attn." in n]


def test_a_model_and_a_target_exclude_each_other():
    out, seconds = run_harness("--model", W8A8, "--target", FLOAT)
    assert out.returncode == 2
    assert "exclude each other" in out.stderr
    assert seconds < 10


@pytest.mark.parametrize(
    "folder, said",
    [
        (FLOAT, "every mtp.* tensor is float: there is nothing for the plugin"),
        ("no-description", "has no quant_model_description.json"),
    ],
    ids=["float-folder", "no-description"],
)
def test_a_model_that_is_not_one_modelslim_folder_is_refused(tmp_path, folder, said):
    if folder == "no-description":
        folder = str(tmp_path / "w8a8")
        shutil.copytree(W8A8, folder)
        os.remove(os.path.join(folder, "quant_model_description.json"))
    out, seconds = run_harness("--model", folder)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"MODEL {folder}" in out.stdout and said in out.stdout
    assert seconds < 10


def broken_draft(folder, missing: str) -> str:
    """The bundled one-folder checkpoint with ``missing`` (an MTP weight_scale) removed from
    its weights, index and description: a ModelSlim folder that can serve garbage."""
    from support.checkpoints import dropping, edit_description, edit_tensors

    shutil.copytree(W8A8, folder)
    edit_tensors(os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors"),
                 dropping(missing))  # fmt: skip
    edit_description(str(folder), dropping(missing))
    path = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(path) as handle:
        index = json.load(handle)
    del index["weight_map"][missing]
    with open(path, "w") as handle:
        json.dump(index, handle)
    return str(folder)


@pytest.mark.slow
def test_a_draft_the_plugin_refuses_stops_the_run_at_its_first_server(tmp_path):
    """``make e2e MODEL=<folder whose MTP lacks a weight_scale>``: the plugin server is the
    first to start, the plugin's guard refuses the draft during its load, the server exits;
    the harness exits 1 well within one server's start timeout, shows the guard's message
    (the tensor, what to do) from the server's own log, and leaves no process."""
    missing = "mtp.layers.0.self_attn.o_proj.weight_scale"
    model = broken_draft(tmp_path / "w8a8_no_scale", missing)
    log_dir = tmp_path / "logs"
    timeout = 400
    temp_dirs = server_temp_dirs()
    out, seconds = run_harness(
        "--model", model, "--log-dir", str(log_dir), "--start-timeout", str(timeout),
        timeout=timeout + 60,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:]
    assert seconds < timeout
    assert "the plugin server exited with status" in out.stdout
    said = out.stdout.split("the plugin said:", 1)[1]
    assert f"has no {missing}" in said and "What to do" in said, said[:2000]
    assert not server_processes(log_dir)
    assert server_temp_dirs() == temp_dirs  # the server's TMPDIR, sglang's sockets in it, gone
