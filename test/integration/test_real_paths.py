"""Checkpoints where users really keep them: Hugging Face and ModelScope caches, by hub id.

The issue this answers: the plugin refused checkpoints stock sglang loads when they sat in
the Hugging Face cache (snapshot files are symlinks into ``../../blobs/``), whether launched
by hub id or by snapshot path, and with ``--download-dir`` it looked in the default cache only.

Everything here goes through the real code paths, offline (``HF_HUB_OFFLINE``): a cache built
the way ``huggingface_hub`` builds it (``hub_cache.make_hf_cache``, checked with
``huggingface_hub.scan_cache_dir``), resolved by sglang's own ``DefaultModelLoader`` (hub id,
``--download-dir``, ``--revision``, ``model.safetensors.index.json`` filtering, ModelScope
under ``SGLANG_USE_MODELSCOPE``), streamed into sglang's real Qwen3.5 draft class through the
plugin loaded by ``load_plugins()``. Expected values come from ``reference.py`` applied to the
fixture's own files, never from the plugin, and are compared bit for bit in the parameter's
dtype. Nothing is written outside pytest's ``tmp_path``: the default cache, sglang's lock
files and ModelScope's home all live there.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from support.checkpoints import open_checkpoint
from support.hub_cache import config_only, make_hf_cache, make_modelscope_cache
from support.paths import fixture_dir
from support.reference import (
    DENSE_PROJECTIONS,
    dequantize_fp32,
    dequantize_int4_fp32,
    description,
    load_all,
)

#: every real fixture the Qwen3.5 draft class loads
Q35_FIXTURES = (
    "q35_dense_w8a8_dynamic",
    "q35_dense_w8a8_static",
    "q35_dense_w8a16_asym",
    "q35_dense_w8a8_dynamic_pergroup",
    "q35moe_w8a8_dynamic",
    "q35_dense_w4a8_dynamic",
    "q35_dense_float_mtp",
)
#: dense int8, MoE, int4: the fixtures doctor and verify are run on, from each location
SUBSET = ("q35_dense_w8a8_dynamic", "q35moe_w8a8_dynamic", "q35_dense_w4a8_dynamic")
DENSE = "q35_dense_w8a8_dynamic"
SHARD = "quant_model_weights-00001-of-00001.safetensors"
INDEX = "quant_model_weights.safetensors.index.json"
W13 = "model.layers.0.mlp.experts.w13_weight"
W2 = "model.layers.0.mlp.experts.w2_weight"
EXPERTS = "mtp.layers.0.mlp.experts."


def repo_id(name: str, how: str) -> str:
    """One hub id per fixture and test: sglang caches configs by model id for the whole
    session (``get_config`` is an LRU cache), so a reused id could take its config from
    another test's cache instead of this test's."""
    return f"acme/{name}-{how}"


# -- the independent reference ---------------------------------------------------------------


def expected_sources(folder: str) -> dict[str, set[str]]:
    """Draft parameter -> the checkpoint tensors sglang's draft class writes into it."""
    tensors = load_all(folder)
    out = {p: set(ps) for p, ps in DENSE_PROJECTIONS.items() if all(n in tensors for n in ps)}
    experts = [n for n in tensors if n.startswith(EXPERTS) and n.endswith("_proj.weight")]
    if experts:
        out[W13] = {n for n in experts if n.endswith(("gate_proj.weight", "up_proj.weight"))}
        out[W2] = {n for n in experts if n.endswith("down_proj.weight")}
    return out


def reference_values(folder: str) -> dict[tuple[str, int | None], torch.Tensor]:
    """(draft parameter, expert index or None) -> its fp32 value, computed by ``reference.py``
    from the checkpoint's own tensors: the projections of the dense drafts, and for the MoE
    draft its attention projections and every routed expert."""
    tensors, desc = load_all(folder), description(folder)
    version = desc.get("version")

    def value(name: str) -> torch.Tensor:
        scheme = desc[name]
        if scheme == "FLOAT":
            return tensors[name].float()
        if scheme.startswith("W4"):
            return dequantize_int4_fp32(tensors, name, scheme, version)
        return dequantize_fp32(tensors, name, scheme)

    out: dict[tuple[str, int | None], torch.Tensor] = {}
    for param, parts in DENSE_PROJECTIONS.items():
        if all(p in tensors for p in parts):
            out[(param, None)] = torch.cat([value(p) for p in parts])
    expert = "mtp.layers.0.mlp.experts.{}.{}_proj.weight"
    e = 0
    while expert.format(e, "gate") in tensors:
        gate, up, down = (value(expert.format(e, p)) for p in ("gate", "up", "down"))
        out[(W13, e)] = torch.cat([gate, up])
        out[(W2, e)] = down
        e += 1
    return out


def assert_loaded_like_reference(model, name: str) -> None:
    """Every reference value equals the loaded parameter bit for bit, in its own dtype."""
    params = dict(model.named_parameters())
    expected = reference_values(fixture_dir(name))
    assert len(expected) >= (4 if "moe" not in name else 2 + 2 * 4), sorted(expected)
    for (param, index), want in expected.items():
        got = params[param].detach()
        got = got if index is None else got[index]
        assert torch.equal(got, want.to(got.dtype)), f"{name}: {param}[{index}]"


def streamed_source(which: int = -1):
    """A resolution sglang's loader made inside the newest plugin load (the newest by
    default): the folder and the files it streamed."""
    from sglang_mtp_dequant.serving.load import last_draft_load

    return last_draft_load().resolutions[which]


def plugin_records(caplog, level: str | None = None) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "sglang_mtp_dequant" and (level is None or r.levelname == level)
    ]


def assert_planned_from(caplog, name: str, folder: str) -> None:
    """sglang streamed from ``folder``; the plugin's one INFO line names it (a float draft,
    with nothing to dequantize, gets no line at all); no WARNING from the plugin."""
    assert not plugin_records(caplog, "WARNING"), [r.getMessage() for r in caplog.records]
    assert streamed_source().folder == folder  # what sglang resolved and streamed
    info = [r.getMessage() for r in plugin_records(caplog, "INFO")]
    if name == "q35_dense_float_mtp":
        assert info == []  # nothing to dequantize: the plugin stays silent
    else:
        assert len(info) == 1 and f" draft from {folder}: dequantized " in info[0], info


# -- the environment: a default cache in tmp_path, offline -------------------------------------


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything tries to reach a host other than this one (a name lookup
    or a connection), even if the caller swallows the error: every test here is offline."""
    import socket

    local = ("127.0.0.1", "::1", "localhost", "", socket.gethostname())
    attempts: list[object] = []
    real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in local:
            attempts.append(address)
            raise OSError(f"test_real_paths: no network ({address})")
        return real_connect(sock, address)

    def lookup(host, *args, **kwargs):
        if host not in local and host is not None:
            attempts.append(host)
            raise socket.gaierror(f"test_real_paths: no network ({host})")
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    yield
    assert attempts == [], f"network access attempted: {attempts}"


@pytest.fixture
def hub(sglang_cpu, no_network, tmp_path, monkeypatch):
    """The default Hugging Face cache, in ``tmp_path``, offline (HF_HUB_OFFLINE=1).

    huggingface_hub, transformers and sglang read ``constants.HF_HUB_CACHE`` and
    ``constants.HF_HUB_OFFLINE`` at call time. sglang's lock file for a hub id goes to
    ``--download-dir`` or, without one, to ``weight_utils.temp_dir`` (the system temp dir):
    pointed at ``tmp_path`` too. ``SGLANG_IS_IN_CI`` would let sglang delete cache files.
    """
    import huggingface_hub.constants as constants
    import sglang.srt.model_loader.weight_utils as weight_utils

    default = tmp_path / "hf-default-cache"
    locks = tmp_path / "sglang-locks"
    default.mkdir()
    locks.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(default))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SGLANG_IS_IN_CI", raising=False)
    monkeypatch.delenv("SGLANG_USE_MODELSCOPE", raising=False)
    monkeypatch.setattr(weight_utils, "temp_dir", str(locks))
    return default


# -- the cache itself ----------------------------------------------------------------------------


def test_made_cache_is_what_huggingface_hub_builds(no_network, tmp_path):
    """scan_cache_dir (huggingface_hub's own validator) reads the cache without a warning:
    one repo, one revision under refs/main, every file a relative symlink into blobs/; and
    snapshot_download, offline, accepts it as complete (it checks trees/<commit>.json)."""
    from hashlib import sha256

    from huggingface_hub import scan_cache_dir, snapshot_download
    from huggingface_hub.utils.sha import git_hash

    cache = tmp_path / "hub"
    snapshot = make_hf_cache(cache, "acme/tiny-q35", fixture_dir(DENSE))
    info = scan_cache_dir(cache_dir=cache)
    assert info.warnings == []
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == ("acme/tiny-q35", "model")
    (revision,) = repo.revisions
    assert revision.refs == frozenset({"main"})
    assert str(revision.snapshot_path) == snapshot
    source = sorted(os.listdir(fixture_dir(DENSE)))
    assert sorted(f.file_name for f in revision.files) == source
    for cached in revision.files:
        link = os.path.join(snapshot, cached.file_name)
        original = os.path.join(fixture_dir(DENSE), cached.file_name)
        target = os.readlink(link)
        assert not os.path.isabs(target) and target.startswith("../../blobs/"), target
        assert cached.blob_path.parent.name == "blobs"
        with open(original, "rb") as handle:
            data = handle.read()
        lfs = cached.file_name.endswith(".safetensors")  # the etag: sha256, else git's sha1
        assert cached.blob_path.name == (sha256(data).hexdigest() if lfs else git_hash(data))
        assert cached.size_on_disk == os.path.getsize(original)
        with open(link, "rb") as got:
            assert got.read() == data
    assert repo.size_on_disk == sum(
        os.path.getsize(os.path.join(fixture_dir(DENSE), f)) for f in source
    )
    found = snapshot_download("acme/tiny-q35", cache_dir=cache, local_files_only=True)
    assert found == os.path.realpath(snapshot)


# -- loads by hub id, by --download-dir, by snapshot path --------------------------------------


@pytest.mark.parametrize("name", Q35_FIXTURES)
def test_hub_id_from_the_default_cache(load_draft, hub, caplog, name):
    """``--model-path acme/<name>`` with the repo in the default cache, offline."""
    repo = repo_id(name, "default-cache")
    snapshot = make_hf_cache(hub, repo, fixture_dir(name))
    model = load_draft(repo)
    assert_loaded_like_reference(model, name)
    assert_planned_from(caplog, name, snapshot)


@pytest.mark.parametrize("name", Q35_FIXTURES)
def test_hub_id_from_download_dir(load_draft, hub, tmp_path, caplog, name):
    """``--download-dir DIR``: the weights are in DIR; the default cache holds only the JSON
    files transformers fetched there (what an online launch leaves), under the same commit,
    so planning from the default cache would find no weights at all."""
    repo = repo_id(name, "download-dir")
    download_dir = tmp_path / "download-dir"
    snapshot = make_hf_cache(download_dir, repo, fixture_dir(name))
    configs = config_only(snapshot, hub, repo)
    assert os.path.basename(configs) == os.path.basename(snapshot)
    assert not [f for f in os.listdir(configs) if f.endswith(".safetensors")]
    model = load_draft(repo, download_dir=str(download_dir))
    assert_loaded_like_reference(model, name)
    assert_planned_from(caplog, name, snapshot)


@pytest.mark.parametrize("name", Q35_FIXTURES)
def test_snapshot_path(load_draft, hub, tmp_path, caplog, name):
    """``--model-path <cache>/models--acme--x/snapshots/<commit>``: a folder of symlinks."""
    snapshot = make_hf_cache(tmp_path / "elsewhere", repo_id(name, "path"), fixture_dir(name))
    assert os.path.islink(os.path.join(snapshot, INDEX))
    model = load_draft(snapshot)
    assert_loaded_like_reference(model, name)
    assert_planned_from(caplog, name, snapshot)


def test_draft_path_is_a_hub_id(load_draft, hub, tmp_path, caplog):
    """``--speculative-draft-model-path acme/x`` beside a float target folder: the plan comes
    from the draft's snapshot, not the target's files."""
    from sglang_mtp_dequant.serving.context import draft_launch

    target = tmp_path / "target"
    shutil.copytree(fixture_dir("q35_dense_float_mtp"), target)
    draft = repo_id(DENSE, "draft-path")
    snapshot = make_hf_cache(hub, draft, fixture_dir(DENSE))
    model = load_draft(draft, target_path=str(target), draft_path=draft)
    assert draft_launch().path == draft
    assert_loaded_like_reference(model, DENSE)
    assert_planned_from(caplog, DENSE, snapshot)


# -- --revision ------------------------------------------------------------------------------


@pytest.fixture
def two_revisions(hub):
    """One repo, two commits: main (W8A8_DYNAMIC) and branch v2 (W8A16, float32 config)."""
    repo = "acme/revisions"
    main = make_hf_cache(hub, repo, fixture_dir(DENSE))
    v2 = make_hf_cache(hub, repo, fixture_dir("q35_dense_w8a16_asym"), ref="v2")
    assert main != v2
    return repo, main, v2


def test_revision_picks_the_commit(two_revisions):
    """sglang's resolution of --revision: a branch through refs/, a commit hash directly."""
    from huggingface_hub import scan_cache_dir

    from sglang_mtp_dequant.tools.resolve import resolve_checkpoint

    repo, main, v2 = two_revisions
    cache = os.path.dirname(os.path.dirname(os.path.dirname(main)))
    scanned = scan_cache_dir(cache_dir=cache)
    assert scanned.warnings == []
    revisions = {str(r.snapshot_path): r.refs for r in next(iter(scanned.repos)).revisions}
    assert revisions == {main: frozenset({"main"}), v2: frozenset({"v2"})}
    for revision, snapshot in (
        (None, main),
        ("main", main),
        ("v2", v2),
        (os.path.basename(v2), v2),
        (os.path.basename(main), main),
    ):
        source = resolve_checkpoint(repo, revision=revision)
        assert source.folder == snapshot, revision
        assert source.files == (os.path.join(snapshot, SHARD),)


def test_revision_is_loaded(load_draft, two_revisions, caplog):
    """``--revision v2``: sglang's config (float32 -> fp16 draft) and weights of that commit."""
    repo, _, v2 = two_revisions
    model = load_draft(repo, revision="v2")
    assert model.model.layers[0].o_proj.weight.dtype == torch.float16
    assert_loaded_like_reference(model, "q35_dense_w8a16_asym")
    assert_planned_from(caplog, "q35_dense_w8a16_asym", v2)


@pytest.mark.parametrize(
    "repo, revision, in_download_dir",
    [
        ("acme/revisions", "v9", False),  # the repo is cached, that branch is not
        ("acme/revisions", "0" * 40, False),  # nor that commit
        ("acme/not-downloaded", None, False),
        ("acme/not-downloaded", None, True),
    ],
)
def test_not_cached_is_a_clear_error_without_network(
    two_revisions, tmp_path, repo, revision, in_download_dir
):
    """What is not in the local cache is an error naming the path (and the --download-dir
    looked in), from resolve_checkpoint and from the doctor, and nothing asks the network."""
    from sglang_mtp_dequant.errors import CheckpointFormatError
    from sglang_mtp_dequant.tools.doctor import diagnose
    from sglang_mtp_dequant.tools.resolve import resolve_checkpoint

    download_dir = str(tmp_path / "download-dir") if in_download_dir else None
    with pytest.raises(CheckpointFormatError) as caught:
        resolve_checkpoint(repo, revision=revision, download_dir=download_dir)
    assert caught.value.file == repo
    assert "sglang found no local copy of it as a hub model" in caught.value.problem
    assert (f"(nor in --download-dir {download_dir})" in caught.value.problem) == in_download_dir
    assert (f"at revision {revision!r}" in caught.value.problem) == (revision is not None)
    report = diagnose(repo, revision=revision, download_dir=download_dir)
    assert report.verdict == "error" and report.folder == "" and report.files == 0
    if revision is None:
        # a repo in no cache at all: the doctor says so before importing sglang (preflight),
        # naming every cache it looked in
        (problem,) = report.problems
        assert problem.startswith(f"{repo}: is neither a folder nor a hub model in a local cache")
        assert download_dir is None or f"{download_dir}," in problem
    else:  # the repo is cached, that revision is not: sglang's own resolution says so
        assert report.problems == [str(caught.value)]


# -- index files, judged as sglang judges them ---------------------------------------------------


def test_snapshot_index_of_plain_names_over_blob_symlinks(hub):
    """The index names files of its own folder; each is a symlink to a blob outside it."""
    snapshot = make_hf_cache(hub, repo_id(DENSE, "index"), fixture_dir(DENSE))
    with open(os.path.join(snapshot, INDEX)) as handle:
        assert set(json.load(handle)["weight_map"].values()) == {SHARD}
    ckpt = open_checkpoint(snapshot)
    assert ckpt.files == [os.path.join(snapshot, SHARD)]
    blobs = os.path.join(os.path.dirname(os.path.dirname(snapshot)), "blobs")
    assert os.path.dirname(os.path.realpath(ckpt.files[0])) == os.path.realpath(blobs)
    assert {info.file for info in ckpt.tensors.values()} == {os.path.join(snapshot, SHARD)}
    assert len(ckpt.tensors) > 20


@pytest.mark.parametrize("where", ["parent", "absolute", "blob"])
def test_index_entry_outside_the_folder_is_refused(hub, tmp_path, where):
    """An entry that climbs out of the folder, or is absolute, is refused naming the index,
    even when the file it names exists (``../../blobs/<etag>`` from a snapshot)."""
    from sglang_mtp_dequant.errors import CheckpointFormatError

    snapshot = make_hf_cache(tmp_path / "cache", repo_id(DENSE, where), fixture_dir(DENSE))
    blob = os.readlink(os.path.join(snapshot, SHARD))
    entry = {
        "parent": "../x.safetensors",
        "absolute": os.path.realpath(os.path.join(snapshot, SHARD)),
        "blob": blob,
    }[where]
    assert os.path.isfile(os.path.join(snapshot, entry)) == (where != "parent")
    index_path = os.path.join(snapshot, INDEX)
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"]["mtp.fc.weight"] = entry
    os.remove(index_path)  # a symlink into blobs: replace it, leave the blob alone
    with open(index_path, "w") as handle:
        json.dump(index, handle)
    with pytest.raises(CheckpointFormatError) as caught:
        open_checkpoint(snapshot)
    assert caught.value.file == index_path
    assert f"maps 'mtp.fc.weight' to {entry!r}, outside the checkpoint folder" in str(caught.value)


def test_stray_file_not_in_model_safetensors_index(
    load_draft, hub, copy_checkpoint, monkeypatch, caplog
):
    """sglang streams only the files ``model.safetensors.index.json`` lists: a stray
    ``*.safetensors`` beside them (here a conflicting copy of an MTP tensor) is not streamed,
    so the plan must not read it either."""
    from sglang_mtp_dequant.errors import CheckpointFormatError
    from sglang_mtp_dequant.formats.checkpoint import Checkpoint
    from sglang_mtp_dequant.serving.context import WeightSource

    planned: list[WeightSource] = []  # what the plugin's plan opened during the load
    real_open = Checkpoint.open.__func__

    def recording_open(cls, source, *args, **kwargs):
        planned.append(source)
        return real_open(cls, source, *args, **kwargs)

    folder = copy_checkpoint(DENSE)
    shard = os.path.join(folder, SHARD)
    names = list(load_file(shard))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": {n: SHARD for n in names}}, handle)
    stray = os.path.join(folder, "consolidated.safetensors")
    save_file({"mtp.layers.0.mlp.up_proj.weight": torch.zeros(3, 5)}, stray)
    # the stray file matters if read: planned from every *.safetensors, the names conflict
    with pytest.raises(CheckpointFormatError, match="holds 'mtp.layers.0.mlp.up_proj.weight'"):
        Checkpoint.open(WeightSource(folder, folder, (stray, shard), "every file"))
    monkeypatch.setattr(Checkpoint, "open", classmethod(recording_open))
    model = load_draft(folder)
    assert_loaded_like_reference(model, DENSE)
    assert_planned_from(caplog, DENSE, folder)
    assert streamed_source().files == (shard,)  # what sglang streamed
    assert [source.files for source in planned] == [(shard,)]  # what the plan read
    assert open_checkpoint(folder).files == [shard]  # the doctor's view: the same


# -- a sharded export in the cache: the draft streams its own shards only --------------------


def test_sharded_hub_snapshot_streams_only_the_drafts_shards(hub, sglang_cpu, tmp_path, caplog):
    """A sharded V1 export (the MTP layer over two shards, target layers alone in another)
    cached as ``huggingface_hub`` caches it, loaded by hub id with sglang's own
    ``DefaultModelLoader.load_model``: the load streams the snapshot's own symlinks of the
    draft's shards (the index names them, never the blobs they point to), and the draft holds
    the reference values bit for bit."""
    from sglang_mtp_dequant.tools.cpu_sglang import draft_model_config, publish_context
    from support.cpu_sglang import load_model
    from support.sharded import write_sharded

    def shard_of(name: str) -> int:  # the embedding (the draft loads it too) beside the MTP
        if name.startswith("mtp.") or name.endswith("embed_tokens.weight"):
            return 3 if ".mlp." in name else 2
        return 1

    source = write_sharded(fixture_dir(DENSE), str(tmp_path / "sharded"), shard_of,
                           filler={1: 300})  # fmt: skip
    repo = repo_id(DENSE, "sharded")
    snapshot = make_hf_cache(hub, repo, os.path.dirname(source[0]))
    caplog.set_level(logging.INFO)
    publish_context(repo)
    model = load_model(draft_model_config(repo))
    assert_loaded_like_reference(model, DENSE)
    streamed = streamed_source()
    assert streamed.folder == snapshot
    assert streamed.files == tuple(os.path.join(snapshot, os.path.basename(f)) for f in source[1:])
    assert all(os.path.islink(f) for f in streamed.files)
    (line,) = [r.getMessage() for r in plugin_records(caplog, "INFO")]
    assert line.endswith("streamed 2 of 3 weight files, skipped 1 holding no draft tensor by "
                         "quant_model_weights.safetensors.index.json"), line  # fmt: skip


# -- ModelScope ------------------------------------------------------------------------------


@pytest.fixture
def modelscope_home(hub, tmp_path, monkeypatch):
    """ModelScope's home and cache in ``tmp_path`` (it writes a session file into its home
    and reads its configuration once per process: reset for the test)."""
    import modelscope_hub.config as ms_config

    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope-default-cache"))
    monkeypatch.setattr(ms_config, "_default_config", None)
    return tmp_path / "modelscope-home"


def test_modelscope_cache_folder_as_local_path(load_draft, hub, tmp_path, caplog):
    """modelscope 1.40's cache: plain files in models/<org>--<name>/snapshots/master/."""
    folder = make_modelscope_cache(tmp_path / "ms", "acme/ms-local", fixture_dir(DENSE))
    assert folder.endswith(os.path.join("models", "acme--ms-local", "snapshots", "master"))
    assert not any(os.path.islink(os.path.join(folder, f)) for f in os.listdir(folder))
    model = load_draft(folder)
    assert_loaded_like_reference(model, DENSE)
    assert_planned_from(caplog, DENSE, folder)


def test_modelscope_model_id_resolved_by_sglang(modelscope_home, tmp_path, monkeypatch, caplog):
    """``SGLANG_USE_MODELSCOPE=1 --model-path acme/x --download-dir <modelscope cache>``:
    sglang's loader asks ModelScope (offline) for the folder; the plugin plans from it.

    The ModelConfig is built from the local folder (sglang's server-args hook would ask
    ModelScope online for the config); the weights stream through sglang's own loader with
    the model id, so sglang's ModelScope resolution is the one exercised.
    """
    from support.cpu_sglang import new_draft, path_weights

    caplog.set_level(logging.INFO)
    cache = tmp_path / "ms"
    model_id = "acme/ms-q35-w8a8"
    folder = make_modelscope_cache(cache, model_id, fixture_dir(DENSE))
    _, model = new_draft(folder)
    monkeypatch.setenv("SGLANG_USE_MODELSCOPE", "1")
    type(model).load_weights(model, path_weights(model_id, download_dir=str(cache)))
    source = streamed_source()
    assert (source.requested, source.folder) == (model_id, folder)
    assert source.files == (os.path.join(folder, SHARD),)
    assert_loaded_like_reference(model, DENSE)
    assert_planned_from(caplog, DENSE, folder)


# -- doctor and verify ---------------------------------------------------------------------------


@pytest.fixture
def sglang_log(tmp_path) -> str:
    """Where the CLI sends sglang's own output (never the system temp dir in tests)."""
    return str(tmp_path / "sglang.log")


LOCATIONS = ("snapshot", "hub-id", "download-dir")
#: what the doctor counts for each fixture: draft tensors, to dequantize, kept float
DOCTOR_COUNTS = {
    "q35_dense_w8a8_dynamic": (15, 7, 8),
    "q35moe_w8a8_dynamic": (29, 15, 14),
    "q35_dense_w4a8_dynamic": (15, 7, 8),
}


def report_lines(out: str, command: str, snapshot: str) -> list[str]:
    """The report's lines (verify prints its progress before it), after checking that its
    second line names the snapshot sglang resolved."""
    lines = out.splitlines()
    first = next(
        i for i, line in enumerate(lines) if line.startswith(f"sglang-mtp-dequant {command}: ")
    )
    lines = lines[first:]
    assert lines[1].startswith(f"  resolved: {snapshot} (sglang "), lines[1]
    return lines


@pytest.fixture
def located(hub, tmp_path):
    """A fixture as a user has it: (the CLI's path arguments, the snapshot they resolve to)."""

    def locate(name: str, how: str) -> tuple[list[str], str]:
        repo = repo_id(name, f"cli-{how}")
        if how == "snapshot":
            snapshot = make_hf_cache(tmp_path / "elsewhere", repo, fixture_dir(name))
            return [snapshot], snapshot
        if how == "hub-id":
            return [repo], make_hf_cache(hub, repo, fixture_dir(name))
        download_dir = tmp_path / "download-dir"
        snapshot = make_hf_cache(download_dir, repo, fixture_dir(name))
        config_only(snapshot, hub, repo)
        return [repo, "--download-dir", str(download_dir)], snapshot

    return locate


@pytest.mark.parametrize("how", LOCATIONS)
@pytest.mark.parametrize("name", SUBSET)
def test_doctor(located, capsys, sglang_log, name, how):
    """The issue's report was ``safetensors files: 0`` on a snapshot: now the snapshot sglang
    resolves is printed, its one shard counted, and the verdict is ok."""
    from sglang_mtp_dequant.tools.cli import main

    args, snapshot = located(name, how)
    code = main(["doctor", *args, "--log", sglang_log])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = report_lines(out, "doctor", snapshot)
    assert "  safetensors files: 1; draft dtype: bfloat16" in lines
    total, dequantize, keep = DOCTOR_COUNTS[name]
    assert f"  {total} draft tensors: {dequantize} dequantize, {keep} keep, 0 error" in lines
    assert lines[-1] == "verdict: ok - the plugin loads this draft as correct float weights"


@pytest.mark.parametrize("how", LOCATIONS)
@pytest.mark.parametrize("name", SUBSET)
def test_verify(located, capsys, sglang_log, name, how):
    """verify resolves the same snapshot and finds every compared parameter exact."""
    from sglang_mtp_dequant.tools.cli import main

    args, snapshot = located(name, how)
    code = main(["verify", *args, "--log", sglang_log])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = report_lines(out, "verify", snapshot)
    assert "  streamed 1 of 1 weight files (those holding draft tensors)" in out
    verdict = lines[-1]
    assert verdict.startswith("verdict: ok - "), verdict
    checked = int(verdict.split("verdict: ok - ")[1].split()[0])
    table = lines[lines.index("") + 2 : lines.index("", lines.index("") + 1)]
    assert checked == len(table) > 0
    assert all(row.endswith(" exact") for row in table), table
    params = {row.split()[0] for row in table}
    assert {param for param, _ in reference_values(fixture_dir(name))} <= params


@pytest.mark.parametrize("name", SUBSET)
def test_verify_rows_name_the_decoded_checkpoint_tensors(located, sglang_cpu, name):
    """On a snapshot, verify's rows say which checkpoint tensors fed each parameter and
    whether they were codes; the verdict counts the decoded parameters."""
    from sglang_mtp_dequant.tools.verify import render_verify, run_verify

    args, _ = located(name, "snapshot")
    report = run_verify(args[0])
    rows = {row.parameter: row for row in report.rows}
    desc = description(fixture_dir(name))
    decoded = 0
    for param, parts in expected_sources(fixture_dir(name)).items():
        quantized = any(desc[p] != "FLOAT" for p in parts)
        decoded += quantized
        row = rows[param]
        assert (set(row.sources), row.quantized, row.check) == (parts, quantized, "exact"), row
    assert decoded >= 3
    assert render_verify(report).endswith(f"({decoded} of them decoded from codes)")


def test_console_script_in_a_fresh_process(tmp_path):
    """The console script as a user runs it, where no sglang context exists yet: a hub id
    found only in ``--download-dir`` (the default cache is empty), offline. The system temp
    dir is ``tmp_path/tmp`` for the child, and nothing may be left there."""
    import subprocess
    import sys

    download_dir, default, tmp = (tmp_path / d for d in ("download-dir", "empty-cache", "tmp"))
    default.mkdir()
    tmp.mkdir()
    repo = "acme/fresh-process"
    snapshot = make_hf_cache(download_dir, repo, fixture_dir(DENSE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SGLANG_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(default), TMPDIR=str(tmp))
    script = os.path.join(os.path.dirname(sys.executable), "sglang-mtp-dequant")
    log = str(tmp_path / "sglang.log")
    done = subprocess.run(
        [script, "doctor", repo, "--download-dir", str(download_dir), "--log", log],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = report_lines(done.stdout, "doctor", snapshot)
    assert "  safetensors files: 1; draft dtype: bfloat16" in lines
    assert lines[-1] == "verdict: ok - the plugin loads this draft as correct float weights"
    assert os.listdir(tmp) == [] and os.listdir(default) == []


# -- weights that do not come through DefaultModelLoader ----------------------------------------


@pytest.mark.parametrize("name", [DENSE, "q35_dense_float_mtp"])
def test_fallback_when_sglang_reports_no_files(sglang_cpu, copy_checkpoint, caplog, name):
    """Another loader streams the weights (here sglang's safetensors_weights_iterator fed
    directly): the plugin resolves the launch folder itself, still dequantizes, and says so
    in one WARNING; a float draft needs no plan and logs nothing."""
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    from support.cpu_sglang import new_draft

    folder = copy_checkpoint(name)  # a path sglang has never resolved in this session
    _, model = new_draft(folder)
    caplog.set_level(logging.INFO)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    type(model).load_weights(model, safetensors_weights_iterator(files))
    assert_loaded_like_reference(model, name)
    warnings = [r.getMessage() for r in plugin_records(caplog, "WARNING")]
    if name == "q35_dense_float_mtp":
        assert plugin_records(caplog) == []
        return
    assert len(warnings) == 1, warnings
    assert "sglang's DefaultModelLoader did not report the draft's weight files" in warnings[0]
    assert f"planning from {folder}, resolved by sglang " in warnings[0]
    assert streamed_source(0).folder == folder  # the fallback's own resolution
