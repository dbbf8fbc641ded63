"""Checkpoints laid out as users hold them: a Hugging Face hub cache and a ModelScope cache.

Usage::

    snapshot = make_hf_cache(tmp_path / "hub", "acme/tiny-q35-w8a8", fixture_dir(NAME))
    # <hub>/models--acme--tiny-q35-w8a8/{blobs/<etag>, refs/main, trees/<commit>.json,
    #                                    snapshots/<commit>/<file> -> ../../blobs/<etag>}
    folder = make_modelscope_cache(tmp_path / "ms", "acme/tiny-q35-w8a8", fixture_dir(NAME))

``make_hf_cache`` writes what ``huggingface_hub`` 1.x writes when it downloads a repo
(``file_download.py``: relative symlinks from each snapshot file into ``blobs``, named by the
file's etag: the sha256 of an LFS file's content, the git blob sha1 of any other file;
``refs/main`` holds the commit without a newline; ``trees/<commit>.json`` lists the files).
The tests check it with ``huggingface_hub.scan_cache_dir`` and load from it offline.
``make_modelscope_cache`` writes modelscope 1.40's layout: plain files in
``<cache>/models/<org>--<name>/snapshots/master/``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

#: stored as LFS objects (the default .gitattributes of a new hub repo, the part we need)
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def git_blob_sha1(data: bytes) -> str:
    """``git hash-object``: the etag of a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    lines = ("version https://git-lfs.github.com/spec/v1", f"oid sha256:{sha256}", f"size {size}")
    return ("\n".join(lines) + "\n").encode()


def make_hf_cache(
    cache_dir: str | os.PathLike,
    repo_id: str,
    source: str | os.PathLike,
    ref: str = "main",
    commit: str | None = None,
) -> str:
    """Put the files of folder ``source`` into ``cache_dir`` as the cached hub repo ``repo_id``
    at ``commit`` (by default one derived from their content); return the snapshot folder."""
    src = Path(source)
    repo = Path(cache_dir) / ("models--" + "--".join(repo_id.split("/")))
    files = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        data = path.read_bytes()
        if any(fnmatch.fnmatch(path.name, p) for p in LFS_PATTERNS):
            sha = hashlib.sha256(data).hexdigest()
            info = {"etag": sha, "blob_id": git_blob_sha1(_lfs_pointer(sha, len(data)))}
            info.update(lfs_sha256=sha, lfs_size=len(data))
        else:
            info = {"etag": git_blob_sha1(data)}
            info["blob_id"] = info["etag"]
        files[rel] = (path, len(data), info)
    if commit is None:
        listing = "".join(f"{rel}\0{info['etag']}\n" for rel, (_, _, info) in files.items())
        commit = hashlib.sha1(listing.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for rel, (path, _, info) in files.items():
        blob = repo / "blobs" / info["etag"]
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot.joinpath(*rel.split("/"))
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)  # no newline: huggingface_hub reads it unstripped
    tree = {
        rel: {"size": size, **{k: v for k, v in info.items() if k != "etag"}}
        for rel, (_, size, info) in files.items()
    }
    (repo / "trees").mkdir(exist_ok=True)
    (repo / "trees" / f"{commit}.json").write_text(
        json.dumps({"format_version": 1, "files": tree}, indent=1)
    )
    return str(snapshot)


def make_modelscope_cache(
    cache_dir: str | os.PathLike, model_id: str, source: str | os.PathLike
) -> str:
    """Copy folder ``source`` into ``cache_dir`` as modelscope 1.40 caches ``model_id``."""
    org, name = model_id.split("/")
    folder = Path(cache_dir) / "models" / f"{org}--{name}" / "snapshots" / "master"
    shutil.copytree(source, folder)
    return str(folder)


def config_only(snapshot: str, into: str | os.PathLike, repo_id: str) -> str:
    """The default cache as an online ``--download-dir`` launch leaves it: transformers
    fetched the repo's JSON files there (config.json first), the weights went elsewhere."""
    staging = Path(into) / ".config-only-source"
    staging.mkdir(parents=True)
    for name in os.listdir(snapshot):
        if name.endswith(".json"):
            shutil.copyfile(os.path.join(snapshot, name), staging / name)
    try:
        return make_hf_cache(into, repo_id, staging, commit=os.path.basename(snapshot))
    finally:
        shutil.rmtree(staging)
