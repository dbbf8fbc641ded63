"""The draft streams only the files that hold its tensors: its start-up follows the draft's
size, not the checkpoint's.

Usage::

    choice = choose_files(folder, files, keeps)   # a draft load, and the doctor offline
    choice.kept, choice.summary()           # "streamed 1 of 5 weight files, skipped 4 ..."
    walk = count_walk(choice, keeps)        # tensors and files, stock and with the plugin

Why: sglang streams the draft every tensor of the target's checkpoint and its ``load_weights``
drops all but its own; the index says which file holds each name (rules: ``choose_files``).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from itertools import compress

from ..formats.checkpoint import header_names, index_shards
from ..formats.config import read_json
from ..formats.naming import NameRule
from .settings import env_choice

NARROW_ENV = "SGLANG_MTP_DEQUANT_NARROW"
_SETTINGS = {"on": True, "1": True, "off": False, "0": False}
INDEX_PATTERN = "*.safetensors.index.json"


def narrowing_enabled() -> bool:
    """``SGLANG_MTP_DEQUANT_NARROW``: ``on`` (default) or ``off``; a typo stops the start-up."""
    return _SETTINGS[env_choice(NARROW_ENV, "on", ("on", "off", "1", "0"))]


@dataclass(frozen=True)
class FileChoice:
    """Which of the files sglang resolved a draft load streams, and why."""

    folder: str
    resolved: tuple[str, ...]  # the files sglang resolved, in its order
    kept: tuple[str, ...]  # the files the draft load streams (a subsequence)
    indexes: tuple[str, ...] = ()  # the index files the choice was made from
    not_narrowed: str | None = None  # why nothing was narrowed
    indexed_draft: bool = True  # the index lists a draft tensor

    @property
    def skipped(self) -> tuple[str, ...]:
        kept = set(self.kept)
        return tuple(f for f in self.resolved if f not in kept)

    def summary(self) -> str:
        """``streamed K of N weight files`` and, if any, which were skipped and on what ground."""
        said = f"streamed {len(self.kept)} of {len(self.resolved)} weight files"
        if self.skipped:
            by = ", ".join(self.indexes)
            said += f", skipped {len(self.skipped)} holding no draft tensor by {by}"
        elif self.not_narrowed:
            said += f" (not narrowed: {self.not_narrowed})"
        return said

    def detail(self) -> str | None:
        """The guard's line when a narrowed load leaves a parameter unwritten, or None."""
        if not self.skipped:
            return None
        names = ", ".join(os.path.basename(f) for f in self.skipped[:4])
        more = f" and {len(self.skipped) - 4} more" if len(self.skipped) > 4 else ""
        nothing = (
            ""
            if self.indexed_draft
            else " (the index lists no draft tensor at all: does the "
            "checkpoint hold the MTP layer?)"
        )
        return (
            f"the plugin {self.summary()} ({names}{more}){nothing}; if one of them holds a "
            f"draft tensor, the index is wrong: fix it, or set {NARROW_ENV}=off to stream "
            "every file"
        )


def choose_files(
    folder: str,
    files: list[str] | tuple[str, ...],
    keeps: NameRule,
    indexes: dict[str, object] | None = None,
) -> FileChoice:
    """The files of ``files`` a draft whose ``load_weights`` keeps ``keeps`` needs: those an
    index of ``folder`` maps a kept name to, or no index lists; no readable index: all."""
    resolved = tuple(files)
    if not narrowing_enabled():
        return FileChoice(folder, resolved, resolved, not_narrowed=f"{NARROW_ENV}=off")
    indexes = read_indexes(folder) if indexes is None else indexes
    if not indexes:
        return FileChoice(folder, resolved, resolved)
    listed: set[str] = set()
    needed: set[str] = set()
    for name, raw in sorted(indexes.items()):
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        shards = index_shards(weight_map)
        if shards is None or not isinstance(weight_map, dict):
            return FileChoice(folder, resolved, resolved, not_narrowed=f"{name} unreadable")
        listed |= shards
        needed.update(compress(weight_map.values(), map(keeps, weight_map)))
    listed, needed = {os.path.normpath(s) for s in listed}, {os.path.normpath(s) for s in needed}
    kept = tuple(f for f in resolved if _under(f, folder) not in listed - needed)
    return FileChoice(folder, resolved, kept, tuple(sorted(indexes)), indexed_draft=bool(needed))


def read_indexes(folder: str) -> dict[str, object]:
    """Index file name -> its parsed JSON (None: unreadable), parsed once per load."""
    found: dict[str, object] = {}
    for path in glob.glob(os.path.join(glob.escape(folder), INDEX_PATTERN)):
        try:
            found[os.path.basename(path)] = read_json(path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            found[os.path.basename(path)] = None
    return found


def _under(path: str, folder: str) -> str:
    """``path`` as named under ``folder`` (lexically: a snapshot's symlinks stay themselves)."""
    return os.path.normpath(os.path.relpath(path, folder))


@dataclass(frozen=True)
class Walk:
    """How many tensors and files a draft load walks, stock and with the plugin."""

    stock_files: int
    stock_tensors: int
    plugin_files: int
    plugin_tensors: int
    choice: FileChoice
    missed: dict[str, str] = field(default_factory=dict)  # skipped file -> a draft tensor in it

    def to_json(self) -> dict[str, object]:
        return {
            "stock": {"files": self.stock_files, "tensors": self.stock_tensors},
            "plugin": {"files": self.plugin_files, "tensors": self.plugin_tensors},
            "skipped_files": [os.path.basename(f) for f in self.choice.skipped],
            "narrowed_by": list(self.choice.indexes) if self.choice.skipped else [],
            "not_narrowed": self.choice.not_narrowed,
            "draft_tensors_in_skipped_files": self.missed,
        }


def count_walk(choice: FileChoice, keeps: NameRule) -> Walk:
    """The tensors each load walks (from headers), and any draft tensor a skipped file holds."""
    counts: dict[str, int] = {}
    missed: dict[str, str] = {}
    skipped = set(choice.skipped)
    for path in choice.resolved:
        names = header_names(path)
        counts[path] = len(names)
        if path in skipped:
            found = next((n for n in names if keeps(n)), None)
            if found is not None:
                missed[path] = found
    return Walk(
        stock_files=len(choice.resolved),
        stock_tensors=sum(counts.values()),
        plugin_files=len(choice.kept),
        plugin_tensors=sum(counts[f] for f in choice.kept),
        choice=choice,
        missed=missed,
    )
