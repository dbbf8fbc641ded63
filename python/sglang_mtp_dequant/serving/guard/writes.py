"""The completeness audit: which parts of each draft parameter did sglang's loaders write?

Usage::

    with WriteRecorder(model, from_target=("embed_tokens", "lm_head")) as writes:
        stream = DequantizingStream(..., observer=writes.on_streamed)
        model.load_weights(stream.apply(weights))
    writes.unwritten()        # {"model.layers.0.qkv_proj.weight": "shard 'k'", ...}
    writes.skipped_names()    # draft checkpoint names that reached no parameter
    writes.fed_by["model.layers.0.qkv_proj.weight"]   # the names that wrote it

Why: sglang's draft ``load_weights`` skip names they do not know (a log line at best, nothing
at worst) and never check that every parameter was written, so a checkpoint missing one
projection, one expert or ``mtp.fc``, or naming one the class does not expect, starts a
server whose draft holds uninitialised memory. How the writes are recorded and what a part
is, on ``WriteRecorder``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..parameter_names import DEFAULT_PACKED
from ..sglang_private import expert_map, swap_weight_loader

_ALL = ("all",)


class WriteRecorder:
    """Wraps every draft parameter's ``weight_loader`` for one load and records its writes.

    Every write of every hooked class goes through the parameter's ``weight_loader`` attribute, or
    ``getattr(param, "weight_loader", default_weight_loader)`` (sglang 0.5.23, read per class), so
    wrapping that attribute for the length of the load records each write without changing it: the
    wrapper calls the original loader with the same arguments and returns its result.

    What a part is:

    - a stacked linear (``qkv_proj``: shards ``q``/``k``/``v``; ``gate_up_proj``: 0/1; any
      ``MergedColumnParallelLinear``: one per output size); a call without a shard id writes all;
    - a FusedMoE parameter: one per (local expert, shard) this rank keeps, asked of the layer's own
      mapping (a call for an expert another rank keeps writes nothing: the loader returns early);
    - anything else: the whole parameter.

    DeepSeek's loader writes from a thread pool, so the record is locked.
    """

    def __init__(self, model: torch.nn.Module, from_target: Iterable[str] = ()) -> None:
        from_target = tuple(from_target)
        optional = optional_parameters(model)
        self.params = {
            name: param
            for name, param in model.named_parameters()
            if not any(token in from_target for token in name.split(".")) and name not in optional
        }
        #: checkpoint module -> the stacked parameter module the class concatenates it into
        packed = {**DEFAULT_PACKED, **(getattr(model, "packed_modules_mapping", None) or {})}
        self._stacked_into = {
            part: stacked
            for stacked, parts in packed.items()
            if isinstance(parts, (list, tuple))
            for part in parts
        }
        self.written: dict[str, set[tuple]] = {name: set() for name in self.params}
        self._expected: dict[str, set[tuple] | None] = {}
        self._undo: list[Callable[[], Any]] = []
        self._lock = threading.Lock()
        self._main = threading.get_ident()
        self._current: str | None = None
        #: every streamed tensor, weakly: alive means the loader (or a view of it) still holds
        #: it, so no other tensor can occupy its bytes
        self._streamed: dict[str, weakref.ref] = {}
        #: (first byte, end, name) of each streamed tensor, newest last: tensors of one file
        #: can share one storage (a buffered iterator), so bytes, not storages, tell them apart
        self._spans: list[tuple[int, int, str]] = []
        self._fed: set[str] = set()
        #: parameters with a write not traced by its bytes (``_trace_stacked``)
        self._untraced: set[str] = set()
        #: parameter -> the streamed checkpoint names whose writes reached it, in write order
        self.fed_by: dict[str, list[str]] = {name: [] for name in self.params}

    # -- installing -----------------------------------------------------------------------

    def __enter__(self) -> WriteRecorder:
        from sglang.srt.model_loader.weight_utils import default_weight_loader

        for name, param in self.params.items():
            original = getattr(param, "weight_loader", default_weight_loader)
            self._expected[name] = _expected_parts(getattr(original, "__self__", None), name)
            self._undo.append(swap_weight_loader(param, self._recording(name, original)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self._trace_stacked()

    def on_streamed(self, name: str, tensor: torch.Tensor) -> None:
        """The stream hands ``name`` to sglang: writes of this tensor's storage (or a view of
        it) on any thread are its, and so are writes on the loading thread until the next
        name."""
        with self._lock:
            self._current = name
            self._streamed[name] = weakref.ref(tensor)
            start, length = _span(tensor)
            self._spans.append((start, start + length, name))

    def _recording(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        module = getattr(original, "__self__", None)
        part_of = _part_reader(module, name)

        def recording_weight_loader(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            loaded = args[1] if len(args) > 1 else kwargs.get("loaded_weight")
            part = part_of(args, kwargs)
            with self._lock:
                if part is not None:
                    self.written[name].add(part)
                sources, by_bytes = self._sources_of(loaded)
                if not by_bytes:
                    self._untraced.add(name)
                for source in sources:
                    self._fed.add(source)
                    if source not in self.fed_by[name]:
                        self.fed_by[name].append(source)
            return result

        # only the original as __wrapped__ (functools' convention), no name or docstring
        return functools.update_wrapper(recording_weight_loader, original, assigned=(), updated=())

    def _sources_of(self, loaded: object) -> tuple[list[str], bool]:
        """The streamed names a write came from, and whether its bytes told: the tensor itself
        or a view of it, found by the bytes it points into while the streamed tensor is alive
        (DeepSeek's thread pool writes several pulls later); else, on the loading thread, the
        name being processed (a tensor the loader made from it). The other parts of a
        concatenation: ``_trace_stacked``."""
        if isinstance(loaded, torch.Tensor):
            address = _span(loaded)[0]
            for start, end, name in reversed(self._spans):  # recent ones first
                if start <= address < end and self._streamed[name]() is not None:
                    return [name], True
        if threading.get_ident() == self._main and self._current is not None:
            return [self._current], False
        return [], False

    # -- the answer -------------------------------------------------------------------------

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

    def _trace_stacked(self) -> None:
        """What bytes cannot trace: sglang's MLA loaders hold ``q_a_proj`` until
        ``kv_a_proj_with_mqa`` arrives and write the concatenation of the two, a new tensor
        (DeepSeek's from its thread pool). A name stacked (``parameter_names.DEFAULT_PACKED``, the
        class's ``packed_modules_mapping``) into a parameter with the same tail (e.g.
        ``...fused_qkv_a_proj_with_mqa.weight``) that had a write its bytes did not trace,
        and traced to no other write, fed it."""
        written = sorted(self._untraced)
        for name in [n for n in self._streamed if n not in self._fed]:
            tokens = name.split(".")
            for i, token in enumerate(tokens):
                stacked = self._stacked_into.get(token)
                if stacked is None:
                    continue
                tail = ".".join([stacked, *tokens[i + 1 :]])
                for param in written:
                    if param == tail or param.endswith(f".{tail}"):
                        self._fed.add(name)
                        self.fed_by[param].append(name)


def optional_parameters(model: torch.nn.Module) -> set[str]:
    """Parameters sglang builds with their final value that a correct checkpoint may lack.

    When the target's ModelSlim description lists any ``norm.bias`` (static W8A8 with
    anti-outlier), sglang's ``ModelSlimConfig`` patches ``RMSNorm.__init__`` for the whole
    process (``modelslim.npu_wrapper_rmsnorm_init``): every RMSNorm built afterwards, the
    unquantized draft's included, gets a zero ``bias`` and ``ignore_anti = True``. Only the
    norms the anti-outlier pass touched have a bias in the checkpoint; the others keep zero,
    which is what a norm without one computes.
    """
    return {
        f"{name}.bias" if name else "bias"
        for name, module in model.named_modules()
        if getattr(module, "ignore_anti", False)
        and isinstance(getattr(module, "bias", None), torch.nn.Parameter)
    }


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """(first byte, length) of a tensor's elements. A tensor without memory (the doctor's dry
    run on the meta device) gets a one-byte span at its own id: only it can match."""
    try:
        start = tensor.data_ptr()
    except Exception:  # noqa: BLE001 - tensor subclasses without storage
        start = 0
    if not start:
        return id(tensor), 1
    return start, max(1, tensor.numel() * tensor.element_size())


def _arg(args: tuple, kwargs: dict, index: int, *names: str) -> Any:
    for key in names:
        if key in kwargs:
            return kwargs[key]
    return args[index] if len(args) > index else None


def _part_reader(module: Any, name: str) -> Callable[[tuple, dict], tuple | None]:
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
    """Every part a complete load writes into parameter ``name`` of ``module`` (the owner of
    its weight_loader); None: one write is complete."""
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
    experts = sorted({p[0] for p in parts})
    shown = ", ".join(str(e) for e in experts[:8]) + (" ..." if len(experts) > 8 else "")
    return f"{len(parts)} of {total} expert shards (local experts {shown})"
