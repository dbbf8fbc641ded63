"""The training text: the Python source files of the pinned sglang wheel, as bytes.

Why this corpus: it is on every machine that can run ``make accept`` (the Makefile installs
``sglang==0.5.23``), needs no download, and is pinned, so two machines train on the same
bytes. Source code is also repetitive enough for a 2-million-parameter model to learn to
predict two tokens ahead in a few minutes, which is what an MTP draft needs.

Tokens are bytes (vocabulary 256): no tokenizer to train, ship or version.
Every ``HOLDOUT_EVERY``-th file (in sorted path order) is held out; prompts and the
evaluation windows come only from held-out files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass

import torch

HOLDOUT_EVERY = 15
TRAIN_BYTES = 4_000_000
SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, one long stream
    heldout: torch.Tensor  # uint8, one long stream
    heldout_files: list[bytes]
    sha256: str
    source: str


def sglang_source_root() -> str:
    """The folder of the installed sglang wheel's package (found without importing it).

    Asked of the installed distribution, not of the import path: a source tree put first on
    ``PYTHONPATH`` (the feature branch's, ``make upstream-test``) must not change the corpus.
    """
    try:
        root = str(importlib.metadata.distribution("sglang").locate_file("sglang"))
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError("sglang is not installed in this environment: run `make venv`") from exc
    if not os.path.isdir(root):
        raise RuntimeError(f"the installed sglang distribution has no package folder at {root}")
    return root


def load_corpus() -> Corpus:
    """Read sglang's ``srt`` sources, split them by file, and cut the training stream."""
    root = sglang_source_root()
    paths = []
    for folder, _dirs, files in os.walk(os.path.join(root, "srt")):
        paths.extend(os.path.join(folder, f) for f in files if f.endswith(".py"))
    paths.sort(key=lambda p: os.path.relpath(p, root))
    train_parts: list[bytes] = []
    heldout_parts: list[bytes] = []
    size = 0
    for index, path in enumerate(paths):
        with open(path, "rb") as handle:
            data = handle.read()
        if not data.strip():
            continue
        if index % HOLDOUT_EVERY == 0:
            heldout_parts.append(data)
        elif size < TRAIN_BYTES:
            train_parts.append(data)
            size += len(data) + len(SEPARATOR)
    train = SEPARATOR.join(train_parts)[:TRAIN_BYTES]
    heldout = SEPARATOR.join(heldout_parts)
    digest = hashlib.sha256(train + b"\0" + heldout).hexdigest()
    return Corpus(
        train=torch.frombuffer(bytearray(train), dtype=torch.uint8),
        heldout=torch.frombuffer(bytearray(heldout), dtype=torch.uint8),
        heldout_files=heldout_parts,
        sha256=digest,
        source=f"{root}/srt/**/*.py",
    )


def line_start_windows(stream: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """``count`` windows of ``length`` bytes, evenly spread, each starting after a newline.

    Fixed positions (no randomness) make the prompt set the same on every run.
    """
    data = stream.numpy().tobytes()
    last_start = len(data) - length - 1
    windows = []
    for i in range(count):
        start = (i * last_start) // count
        newline = data.find(b"\n", start, last_start)
        start = newline + 1 if newline >= 0 else start
        windows.append(stream[start : start + length].to(torch.long))
    return torch.stack(windows)


def random_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """A training batch of ``batch`` random windows of ``length`` bytes."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    offsets = torch.arange(length)
    return stream[starts[:, None] + offsets[None, :]].to(torch.long)
