"""A few entries of a large JSON object, read out of its bytes without parsing the rest.

Usage::

    found = scan_object(data)                   # None: not a file this reader is sure of
    found.entries(("mtp",))                     # top-level "name": "string" pairs whose name
                                                # holds a needle: {"mtp.fc.weight": "W8A8", ...}
    found.member("weight_map").entries(("mtp",))    # the same in a nested object
    found.scalar("group_size")                  # one top-level value, parsed (None: absent)
    found.member("weight_map").values_held(shards)  # which of ``shards`` some name maps to

Why: an index or a ModelSlim description lists every tensor of the checkpoint (hundreds of
thousands in a large MoE export), and the draft wants a few dozen of them; a pass of
``bytes.find`` over the bytes keeps the draft's start-up independent of the target's size.
Exact or nothing: what the reader accepts, on ``scan_object``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .config import parse_json

MAX_OBJECTS = 64
_WS = b" \t\r\n"
_QUOTE = b'"'
#: every character JSON text outside strings can hold: whitespace, structure, numbers and
#: the literals true, false, null
_OUTSIDE_STRINGS = frozenset(" \t\r\n:,[]{}0123456789+-.eE" + "truefalsn")


class NotScannable(Exception):
    """The bytes are not of a shape this reader answers for exactly: parse the whole file."""


@dataclass
class ScannedObject:
    """One JSON object of ``data``: its braces' positions and its nested objects by key."""

    data: bytes
    start: int
    end: int
    members: dict[str, ScannedObject] = field(default_factory=dict)
    #: needle -> where it starts in this object's own text: each needle is searched once per
    #: object, however many callers ask (the narrowing and the plan read the same index)
    _hits: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def member(self, key: str) -> ScannedObject:
        """The nested object that is ``key``'s value (``NotScannable`` if there is none)."""
        try:
            return self.members[key]
        except KeyError:
            raise NotScannable(f"no object under {key!r}") from None

    def entries(self, needles: Iterable[str]) -> dict[str, str]:
        """Every ``"name": "value"`` of this object (not of its nested ones) whose name holds
        one of ``needles``."""
        needles = _fewest(needles)
        for needle in needles:
            if needle not in self._hits:
                self._hits[needle] = list(self._find_all(needle.encode()))
        return self._entries_at(
            sorted({p for needle in needles for p in self._hits[needle]}), needles
        )

    def _entries_at(self, hits: list[int], needles: frozenset[str]) -> dict[str, str]:
        """The entries whose names hold the ``needles`` found at ``hits``."""
        data = self.data
        # a needle with a character no JSON text outside strings holds can only be inside a
        # string; for any other, where the hit is is told by counting quotes from the start
        local = all(set(needle) - _OUTSIDE_STRINGS for needle in needles)
        found: dict[str, str] = {}
        seen: set[int] = set()
        quotes, counted = 0, self.start
        for hit in hits:
            if not local:
                quotes += data.count(_QUOTE, counted, hit)
                counted = hit
                if quotes % 2 == 0:
                    continue  # in a literal, outside every string
            opened = data.rfind(_QUOTE, self.start, hit)
            if opened in seen:
                continue
            seen.add(opened)
            closed = data.find(_QUOTE, hit, self.end)
            value = self._value_after(closed)
            if value is not None:
                found[data[opened + 1 : closed].decode("utf-8")] = value
        return found

    def scalar(self, key: str) -> object:
        """``key``'s value at this object's top level, parsed; None if the key is absent."""
        for opened in self._find_all(_QUOTE + key.encode() + _QUOTE):
            colon = _skip_ws(self.data, opened + len(key) + 2)
            if self.data[colon : colon + 1] != b":":
                continue  # the same text as a value
            first = _skip_ws(self.data, colon + 1)
            if self.data[first : first + 1] in (b"{", b"["):
                raise NotScannable(f"{key!r} holds a container")
            stop = min(_find_or(self.data, stop, first + 1, self.end) for stop in (b",", b"}"))
            if self.data[first : first + 1] == _QUOTE:
                stop = self.data.find(_QUOTE, first + 1, self.end) + 1
            try:
                return json.loads(self.data[first:stop])
            except ValueError as exc:
                raise NotScannable(f"{key!r}: {exc}") from exc
        return None

    def values_held(self, values: Iterable[str]) -> set[str]:
        """Which of ``values`` some name of this object (one with no nested object) maps to.

        Each is searched from where the one before it was found, then from the start: an
        index listing its shards in order is read about once for all of them.
        """
        if self.members:
            raise NotScannable("values of an object with nested objects")
        held: set[str] = set()
        cursor = self.start + 1
        for value in values:
            needle = _QUOTE + value.encode() + _QUOTE
            found = self._value_at(needle, cursor, self.end)
            if found < 0:
                found = self._value_at(needle, self.start + 1, min(cursor + len(needle), self.end))
            if found >= 0:
                held.add(value)
                cursor = found
        return held

    def _value_at(self, needle: bytes, lo: int, hi: int) -> int:
        """The first place in ``[lo, hi)`` where ``needle`` is a value (after a colon), or -1."""
        at = self.data.find(needle, lo, hi)
        while at >= 0:
            before = _skip_ws_back(self.data, at - 1)
            if self.data[before : before + 1] == b":":
                return at
            at = self.data.find(needle, at + 1, hi)
        return -1

    def _value_after(self, closed: int) -> str | None:
        """The string value of the name whose closing quote is at ``closed``; None if that
        string is itself a value."""
        data = self.data
        colon = _skip_ws(data, closed + 1)
        if data[colon : colon + 1] != b":":
            return None
        first = _skip_ws(data, colon + 1)
        if data[first : first + 1] != _QUOTE:
            raise NotScannable(f"{data[self.start : closed + 1][-80:]!r} holds no string")
        return data[first + 1 : data.find(_QUOTE, first + 1, self.end)].decode("utf-8")

    def _find_all(self, needle: bytes) -> Iterator[int]:
        """Where ``needle`` starts in this object's own text (its nested objects left out)."""
        pattern = re.compile(re.escape(needle))  # sre's literal search: fewer passes than find
        for lo, hi in self._own_spans():
            for match in pattern.finditer(self.data, lo, hi):
                yield match.start()

    def _own_spans(self) -> list[tuple[int, int]]:
        spans, lo = [], self.start + 1
        for child in sorted(self.members.values(), key=lambda c: c.start):
            spans.append((lo, child.start))
            lo = child.end + 1
        spans.append((lo, self.end))
        return spans


@dataclass
class JsonFile:
    """One JSON file's bytes, parsed whole or scanned, each at most once per load."""

    path: str
    data: bytes
    _parsed: object = field(default=None, repr=False)
    _scanned: ScannedObject | None | bool = field(default=False, repr=False)

    @classmethod
    def read(cls, path: str) -> JsonFile:
        """Raises ``OSError`` as ``open`` does."""
        with open(path, "rb") as handle:
            return cls(path, handle.read())

    def parsed(self) -> object:
        """The whole JSON (raises as ``config.read_json`` does)."""
        if self._parsed is None:
            self._parsed = parse_json(self.data)
        return self._parsed

    def scanned(self) -> ScannedObject | None:
        """The top-level object for ``entries``, or None (then use ``parsed``)."""
        if self._scanned is False:
            self._scanned = scan_object(self.data)
        return self._scanned if isinstance(self._scanned, ScannedObject) else None


def _fewest(needles: Iterable[str]) -> frozenset[str]:
    """``needles`` without those holding another: a name holding ``embed_tokens.weight``
    holds ``embed_tokens``, so the shorter one's hits are all the entries (one pass less)."""
    unique = frozenset(needles)
    return frozenset(n for n in unique if not any(o != n and o in n for o in unique))


def scan_object(data: bytes) -> ScannedObject | None:
    """The top-level object of ``data`` and its nested objects, or None if ``data`` is not of
    the shape named below (then parse it whole).

    Why: parsing the whole file costs per tensor; finding the draft's names costs a pass of
    ``bytes.find``/``count`` over the bytes, in C.

    Exact or nothing: the reader answers only for a file with no backslash (so every ``"`` delimits
    a string), braces only outside strings, at most ``MAX_OBJECTS`` objects, each nested object the
    value of a key; a needle is a substring every wanted name contains, so every wanted entry is
    among the hits. Any entry it reads that is not a string value, and any shape it does not know,
    raises ``NotScannable`` (or ``scan_object`` returns None): the caller parses the whole file.
    """
    if b"\\" in data:
        return None
    opening, closing = _positions(data, b"{"), _positions(data, b"}")
    if opening is None or closing is None:
        return None
    braces = sorted([(p, b"{") for p in opening] + [(p, b"}") for p in closing])
    stack: list[ScannedObject] = []
    root: ScannedObject | None = None
    middle = len(data) // 2
    for at, brace in braces:
        # both ends of a JSON text are outside strings: count quotes from the nearer one
        quotes = data.count(_QUOTE, 0, at) if at < middle else data.count(_QUOTE, at + 1)
        if quotes % 2:
            return None  # a brace inside a string
        if brace == b"{":
            stack.append(ScannedObject(data, at, -1))
            continue
        if not stack:
            return None
        done = stack.pop()
        done.end = at
        if not stack:
            if root is not None:
                return None
            root = done
            continue
        key = _owning_key(data, done.start)
        if key is None or key in stack[-1].members:
            return None
        stack[-1].members[key] = done
    if stack or root is None:
        return None
    if _skip_ws(data, 0) != root.start or _skip_ws(data, root.end + 1) != len(data):
        return None
    return root


def _owning_key(data: bytes, opened: int) -> str | None:
    """The key whose value is the object opening at ``opened`` (None: not a key's value)."""
    colon = _skip_ws_back(data, opened - 1)
    if data[colon : colon + 1] != b":":
        return None
    closed = _skip_ws_back(data, colon - 1)
    if data[closed : closed + 1] != _QUOTE:
        return None
    return data[data.rfind(_QUOTE, 0, closed) + 1 : closed].decode("utf-8")


def _positions(data: bytes, char: bytes) -> list[int] | None:
    """Where ``char`` is in ``data``; None past ``MAX_OBJECTS`` of them."""
    found: list[int] = []
    at = data.find(char)
    while at >= 0:
        if len(found) == MAX_OBJECTS:
            return None
        found.append(at)
        at = data.find(char, at + 1)
    return found


def _find_or(data: bytes, needle: bytes, lo: int, hi: int) -> int:
    at = data.find(needle, lo, hi)
    return hi if at < 0 else at


def _skip_ws(data: bytes, at: int) -> int:
    while at < len(data) and data[at] in _WS:
        at += 1
    return at


def _skip_ws_back(data: bytes, at: int) -> int:
    while at >= 0 and data[at] in _WS:
        at -= 1
    return at
