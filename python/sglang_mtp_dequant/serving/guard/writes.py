"""The completeness audit: which parts of each draft parameter did sglang's loaders write?

Usage::

    with WriteRecorder(model, from_target=("embed_tokens", "lm_head")) as writes:
        stream = DequantizingStream(..., observer=writes.on_streamed)
        model.load_weights(writes.follow(stream.apply(weights)))
    writes.unwritten()        # {"model.layers.0.qkv_proj.weight": "shard 'k'", ...}
    writes.skipped_names()    # draft checkpoint names that reached no parameter
    writes.fed_by["model.layers.0.qkv_proj.weight"]   # the names that wrote it

Why: sglang's draft ``load_weights`` skip names they do not know and never check that every
parameter was written, so a checkpoint missing one projection or expert serves uninitialised
memory.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from ..sglang_private import expert_map, swap_weight_loader, weight_loader_slot

_ALL = ("all",)
Item = TypeVar("Item")
#: what one recorder does with one call of a parameter's loader: (args, kwargs, source name)
Listener = Callable[[tuple, dict, str | None], None]

#: parameter token -> the checkpoint tokens sglang's loaders write into it in one call
CONCATENATED = {"fused_qkv_a_proj_with_mqa": ("q_a_proj", "kv_a_proj_with_mqa")}
#: parameter token -> the checkpoint tokens sglang copies into it without its ``weight_loader``
#: (0.5.23's DSA indexer ``wk_weights_proj``, on CUDA)
WRITTEN_WITHOUT_LOADER = {"wk_weights_proj": ("wk", "weights_proj")}


class _Tap:
    """One parameter's loader before any recorder, and the recorders listening to it (nested
    recorders share it: ``verify`` records a load whose hook records it too)."""

    def __init__(self, param: torch.nn.Parameter, original: Callable[..., Any]) -> None:
        self.original = original
        self.listeners: list[Listener] = []
        self.attributes, self.slot = vars(param), weight_loader_slot(param)
        self.unbound = _Credited(self.call, None)

    def call(self, source: str | None, *args: Any, **kwargs: Any) -> Any:
        """The original loader's result; the listeners told."""
        result = self.original(*args, **kwargs)
        for listener in self.listeners:
            listener(args, kwargs, source)
        return result


class _Credited(functools.partial):
    """A parameter's loader as sglang read it while processing checkpoint tensor ``source``."""

    __slots__ = ()

    @property
    def tap(self) -> _Tap:
        return self.func.__self__  # type: ignore[attr-defined]

    @property
    def __wrapped__(self) -> Callable[..., Any]:  # functools' convention: what this wraps
        return self.tap.original


class WriteRecorder:
    """Records every write sglang's loaders make into the draft's parameters, for one load: the
    part written, credited to the draft name the stream handed on last when the loader was read."""

    def __init__(self, model: torch.nn.Module, from_target: Iterable[str] = ()) -> None:
        from_target = tuple(from_target)
        optional = optional_parameters(model)
        self.params = {
            name: param
            for name, param in model.named_parameters()
            if not any(token in from_target for token in name.split(".")) and name not in optional
        }
        self.written: dict[str, set[tuple]] = {name: set() for name in self.params}
        #: parameter -> the streamed checkpoint names whose writes reached it, in write order
        self.fed_by: dict[str, list[str]] = {name: [] for name in self.params}
        self._credited: set[tuple[str, str]] = set()
        self._expected: dict[str, set[tuple] | None] = {}
        self._taps: list[_Tap] = []
        self._joined: list[tuple[_Tap, Listener]] = []
        self._undo: list[Callable[[], Any]] = []
        self._streamed: dict[str, None] = {}
        self._fed: set[str] = set()
        self._lock = threading.Lock()  # DeepSeek's thread pool records concurrently

    def __enter__(self) -> WriteRecorder:
        from sglang.srt.model_loader.weight_utils import default_weight_loader

        for name, param in self.params.items():
            current = getattr(param, "weight_loader", default_weight_loader)
            if isinstance(current, _Credited):  # an outer recorder's: listen to its tap
                tap = current.tap
            else:
                tap = _Tap(param, current)
                self._undo.append(swap_weight_loader(param, tap.unbound))
            owner = _owner(tap.original)
            self._expected[name] = _expected_parts(owner, name)
            listener = functools.partial(self._record, name, _part_reader(owner))
            tap.listeners.append(listener)
            self._taps.append(tap)
            self._joined.append((tap, listener))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for tap, listener in self._joined:
            tap.listeners.remove(listener)
        for undo in reversed(self._undo):  # only the taps this recorder installed
            undo()
        self._joined.clear()
        self._undo.clear()
        self._credit_written_without_loader()

    def on_streamed(self, name: str, tensor: torch.Tensor) -> None:
        """The stream hands ``name`` on: loaders read until the next name are credited to it."""
        self._streamed[name] = None
        for tap in self._taps:
            tap.attributes[tap.slot] = _Credited(tap.call, name)

    def follow(self, weights: Iterable[Item]) -> Iterator[Item]:
        """``weights`` unchanged, the loaders unbound after the last tensor."""
        yield from weights
        for tap in self._taps:
            tap.attributes[tap.slot] = tap.unbound

    def observe(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        is_draft: Callable[[str], bool] = lambda name: True,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``weights`` unchanged, each draft name told to the recorder as sglang pulls it."""
        for name, tensor in weights:
            if is_draft(name):
                self.on_streamed(name, tensor)
            yield name, tensor

    def _record(
        self,
        name: str,
        part_of: Callable[[tuple, dict], tuple | None],
        args: tuple,
        kwargs: dict,
        source: str | None,
    ) -> None:
        part = part_of(args, kwargs)
        sources = [] if source is None else _concatenated_with(name, source, self._streamed)
        with self._lock:
            if part is not None:
                self.written[name].add(part)
            for each in sources:
                self._credit(name, each)

    def _credit(self, parameter: str, source: str) -> None:
        self._fed.add(source)
        if (parameter, source) not in self._credited:
            self._credited.add((parameter, source))
            self.fed_by[parameter].append(source)

    def _credit_written_without_loader(self) -> None:
        """``WRITTEN_WITHOUT_LOADER``: a streamed ``...<module>.<part>.<x>`` no loader took fed
        the one parameter ``...<module>.<token>.weight``, written when ``<x>`` is ``weight``."""
        for token, parts in WRITTEN_WITHOUT_LOADER.items():
            targets = [n for n in self.params if n.split(".")[-2:] == [token, "weight"]]
            if len(targets) != 1:
                continue
            (target,) = targets
            module = target.split(".")[-3:-2]
            self._expected[target] = {("copied", part) for part in parts}
            for source in [n for n in self._streamed if n not in self._fed]:
                tokens = source.split(".")
                if tokens[-3:-2] == module and tokens[-2] in parts:
                    self._credit(target, source)
                    if tokens[-1] == "weight":
                        self.written[target].add(("copied", tokens[-2]))

    def unwritten(self) -> dict[str, str]:
        """parameter -> which of its parts no loader wrote (parameters fully written omitted)."""
        missing = {}
        for name in self.params:
            expected = self._expected.get(name)
            done = self.written[name]
            if _ALL in done:
                continue
            if expected is None:
                if not done:
                    missing[name] = "no write at all"
                continue
            left = sorted(expected - done, key=repr)
            if left:
                missing[name] = _describe_parts(left, len(expected))
        return missing

    def written_parameters(self) -> set[str]:
        return {name for name, parts in self.written.items() if parts}

    def skipped_names(self) -> list[str]:
        """Streamed draft names whose tensor reached no parameter's loader."""
        return [n for n in self._streamed if n not in self._fed]


def optional_parameters(model: torch.nn.Module) -> set[str]:
    """Parameters a correct checkpoint may lack: the zero ``bias`` ``ModelSlimConfig`` gives every
    RMSNorm once a description lists any ``norm.bias`` (only anti-outlier norms store one)."""
    return {
        f"{name}.bias" if name else "bias"
        for name, module in model.named_modules()
        if getattr(module, "ignore_anti", False)
        and isinstance(getattr(module, "bias", None), torch.nn.Parameter)
    }


def _concatenated_with(parameter: str, source: str, streamed: Iterable[str]) -> list[str]:
    """``source`` and, for a ``CONCATENATED`` parameter, its streamed partners."""
    parts = CONCATENATED.get(parameter.rpartition(".")[0].rpartition(".")[2])  # <module>.weight
    if not parts:
        return [source]
    tokens = source.split(".")
    found = [source]
    for i, token in enumerate(tokens):
        if token in parts:
            for other in parts:
                partner = ".".join([*tokens[:i], other, *tokens[i + 1 :]])
                if other != token and partner in streamed:
                    found.append(partner)
    return found


def _owner(loader: Callable[..., Any]) -> Any:
    """The module a loader is a bound method of (through a ``functools.partial``), or None."""
    if isinstance(loader, functools.partial):
        loader = loader.func
    return getattr(loader, "__self__", None)


def _arg(args: tuple, kwargs: dict, index: int, *names: str) -> Any:
    for key in names:
        if key in kwargs:
            return kwargs[key]
    return args[index] if len(args) > index else None


def _part_reader(module: Any) -> Callable[[tuple, dict], tuple | None]:
    """How to read, from one weight_loader call, which part of the parameter it wrote."""
    mapping = expert_map(module) if module is not None else None
    if mapping is not None:

        def expert_part(args: tuple, kwargs: dict) -> tuple | None:
            expert = _arg(args, kwargs, 4, "expert_id")
            shard = _arg(args, kwargs, 3, "shard_id")
            if expert is None:
                return _ALL
            local = mapping(int(expert))
            return None if local < 0 else (local, shard)  # another rank's: nothing written

        return expert_part
    if module is not None and hasattr(module, "output_sizes"):

        def shard_part(args: tuple, kwargs: dict) -> tuple | None:
            shard = _arg(args, kwargs, 2, "loaded_shard_id")
            return _ALL if shard is None else ("shard", shard)

        return shard_part
    return lambda args, kwargs: _ALL


def _expected_parts(module: Any, name: str) -> set[tuple] | None:
    """Every part a complete load writes into parameter ``name``; None: one write is complete."""
    if module is not None and expert_map(module) is not None:
        last = name.rpartition(".")[2]
        shards = (
            ("w1", "w3") if last.startswith("w13") else ("w2",) if last.startswith("w2") else None
        )
        if shards is None:
            return None
        count = int(getattr(module, "num_local_experts", 0))
        return {(e, s) for e in range(count) for s in shards}
    if module is not None and hasattr(module, "output_sizes"):
        if hasattr(module, "total_num_kv_heads"):  # QKVParallelLinear
            return {("shard", s) for s in ("q", "k", "v")}
        return {("shard", i) for i in range(len(module.output_sizes))}
    return None


def _describe_parts(parts: list[tuple], total: int) -> str:
    if parts[0][0] == "shard":
        return "shard " + ", ".join(repr(p[1]) for p in parts) + f" of {total}"
    if parts[0][0] == "copied":
        return "rows of " + ", ".join(repr(p[1]) for p in parts) + f" of {total}"
    experts = sorted({p[0] for p in parts})
    shown = ", ".join(str(e) for e in experts[:8]) + (" ..." if len(experts) > 8 else "")
    return f"{len(parts)} of {total} expert shards (local experts {shown})"
