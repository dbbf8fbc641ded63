"""One hooked draft load, from sglang's resolution of its files to the line it logs.

Usage (the ``load_weights`` hook, ``plugin.py``; the loader hooks, ``plugin.register``)::

    load = DraftLoad(spec, model)      # LoadSetting: how sglang built the draft
    result = load.run(original, model, weights, args, kwargs)   # plan, stream, guard, log
    # inside it, sglang's _prepare_weights (observe_prepare_weights, in LOADER_HOOKS):
    files = in_progress().resolved(WeightSource(...))      # the narrowed files sglang streams
    load = last_draft_load()           # afterwards: load.stats, load.writes, load.summary()

Why one object: every fact of a draft load (the resolution, the narrowing, the plan, the
writes) belongs to that load alone; the resolution arrives through a context variable
(``in_progress``), so the target's load is never mistaken for it (docs/design.md, "The draft
load").
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CheckpointFormatError
from ..formats.checkpoint import Checkpoint, WeightSource, dtype_name, is_code_dtype
from ..formats.naming import NameRule
from ..formats.plan import DequantPlan
from . import context, sglang_private, sources
from .drafts import DraftSpec, draft_dtype
from .guard import WriteRecorder, check_loaded_draft
from .guard.report import Source
from .narrowing import FileChoice, choose_files, narrowing_enabled, read_indexes
from .ownership import ExpertOwnership
from .plain_parts import feeds_plain_linear, plain_linears
from .stream import DequantizingStream, StreamStats

if TYPE_CHECKING:  # Concatenate[..., ...] is Python 3.11's
    from typing import Concatenate

    #: sglang's AROUND hook (``HookRegistry.register``): ``fn(original_fn, *args, **kwargs)``
    #: returning the result in place of ``original_fn(*args, **kwargs)``
    AroundHook = Callable[Concatenate[Callable[..., Any], ...], Any]
    #: ``DefaultModelLoader._prepare_weights(loader, model_name_or_path, revision,
    #: fall_back_to_pt, ...) -> (folder, files, use_safetensors)``
    PrepareWeights = Callable[Concatenate[Any, str, ...], tuple[str, list[str], bool]]
    #: ``maybe_add_mtp_safetensors(files, folder, index_file, hf_config) -> files``
    MtpFile = Callable[Concatenate[list[str], str, ...], list[str]]

logger = logging.getLogger("sglang_mtp_dequant")

#: the hooked draft load running in this context (a context variable: sglang's target load and
#: anything resolved on another thread are not part of it)
_IN_PROGRESS: contextvars.ContextVar[DraftLoad | None] = contextvars.ContextVar(
    "mtp_dequant_draft_load", default=None
)
#: the newest draft load of this process that returned (only the newest: it holds the model's
#: parameters, and a process that builds many drafts must not keep them all)
_last: DraftLoad | None = None


def in_progress() -> DraftLoad | None:
    """The hooked draft load this code runs inside, or None (the target's load, the CLI)."""
    return _IN_PROGRESS.get()


def last_draft_load() -> DraftLoad | None:
    """The newest draft load of this process, or None."""
    return _last


@dataclass(frozen=True)
class LoadSetting:
    """What a load decodes and refuses, by how sglang built the draft.

    Built unquantized: every draft name is planned, undecodable codes refused, other EP ranks'
    experts left undecoded. Built with a quant config: only the names feeding a plain part no
    quantization method owns (``fc`` / ``eh_proj``, or a ModelSlim scheme with no linear
    method) are planned, since sglang would copy their codes in with the scale dropped; every
    other code, and the experts, go to sglang's own loaders.
    """

    #: the checkpoint names the plan decides for
    wanted: NameRule
    #: which experts this rank keeps (None: every expert, or left to sglang's loaders)
    owned: ExpertOwnership | None
    #: refuse a draft weight streaming as codes the plan does not decode
    refuse_raw_codes: bool
    #: the quantization sglang built the draft with (None: built unquantized)
    quantization: str | None

    @classmethod
    def of(cls, model: torch.nn.Module, is_draft: NameRule) -> LoadSetting:
        config = getattr(model, "quant_config", None)
        if config is None:
            return cls(is_draft, ExpertOwnership.of(model), True, None)
        linears = plain_linears(model)
        return cls(
            lambda name: is_draft(name) and feeds_plain_linear(name, linears),
            None,
            False,
            str(config.get_name()),
        )


# -- the loader hooks: sglang's resolution, written into the load in progress -----------------


def observe_prepare_weights(
    original: PrepareWeights, loader: Any, model_name_or_path: str, *args: Any, **kwargs: Any
) -> tuple[str, list[str], bool]:
    """AROUND ``DefaultModelLoader._prepare_weights``: the one hook that changes sglang's
    result. Inside a hooked draft load the file list is narrowed to the files holding the
    draft's tensors (``DraftLoad.resolved``); elsewhere the result is recorded by its path.
    The arguments always pass through unchanged.
    """
    result = original(loader, model_name_or_path, *args, **kwargs)
    folder, files = result[0], result[1]
    source = WeightSource(str(model_name_or_path), folder, tuple(files), context.resolver_name())
    load = in_progress()
    if load is None:
        context.record_resolution(source)
        return result
    streamed = load.resolved(source)
    if len(streamed) != len(files):
        result = (folder, streamed, *result[2:])
    return result


def observe_mtp_file(
    original: MtpFile, files: list[str], folder: str, *args: Any, **kwargs: Any
) -> list[str]:
    """AROUND ``maybe_add_mtp_safetensors``: record the file list it returned for ``folder``."""
    result = original(files, folder, *args, **kwargs)
    if list(result) != list(files):
        load = in_progress()
        if load is not None:
            load.mtp_file_added(folder, tuple(result), context.resolver_name())
        else:
            requested = context.requested_of(folder)
            context.record_resolution(
                WeightSource(requested, folder, tuple(result), context.resolver_name())
            )
    return result


#: the loader hooks plugin.register() installs
LOADER_HOOKS: tuple[tuple[str, AroundHook], ...] = (
    (sglang_private.PREPARE_WEIGHTS_TARGET, observe_prepare_weights),
    (sglang_private.MTP_FILE_TARGET, observe_mtp_file),
)


# -- one draft load --------------------------------------------------------------------------


class DraftLoad:
    """One hooked draft load and, once it returns, its record (see the module docstring)."""

    def __init__(self, spec: DraftSpec, model: torch.nn.Module) -> None:
        self.class_name = spec.class_name
        self.spec = spec
        #: every checkpoint name the class's load_weights keeps: what the narrowing streams
        self.keeps = spec.kept_names(model)
        self.is_draft = spec.draft_names(model)
        self.setting = LoadSetting.of(model, self.is_draft)
        self.quantization = self.setting.quantization
        self.launch = context.draft_launch()
        #: what sglang resolved inside this load, as streamed (narrowed, an mtp file added)
        self.resolutions: list[WeightSource] = []
        #: how each resolution was narrowed
        self.choices: list[FileChoice] = []
        #: folder -> its index files as parsed for the narrowing, until the plan takes them
        self._indexes: dict[str, dict[str, object]] = {}
        # the record, filled in by ``run``
        #: the folder the plan was made from (None: no plan)
        self.folder: str | None = None
        self.dtype = draft_dtype(model)
        self.plan: DequantPlan | None = None
        #: draft checkpoint name -> the dtype it streamed as
        self.streamed: dict[str, torch.dtype] = {}
        self.stats = StreamStats()
        self.writes: WriteRecorder | None = None
        #: wall seconds of sglang's ``load_weights``, decoding included
        self.seconds = 0.0

    # -- the sequence ------------------------------------------------------------------------

    def run(
        self,
        original: Callable[..., Any],
        model: torch.nn.Module,
        weights: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """sglang's ``load_weights`` on the decoding stream, writes recorded, then guard and log."""
        with self._in_progress(), WriteRecorder(model, self.spec.from_target) as writes:
            stream = DequantizingStream(
                self._plan,
                self.dtype,
                self.is_draft,
                owned=self.setting.owned,
                missing_plan_hint=self._missing_hint(),
                observer=writes.on_streamed,
                refuse_raw_codes=self.setting.refuse_raw_codes,
            )
            started = time.perf_counter()
            result = original(model, writes.follow(stream.apply(weights)), *args, **kwargs)
            self.seconds = time.perf_counter() - started
        self.plan, self.streamed, self.stats, self.writes = (
            stream.plan,
            dict(stream.streamed),
            stream.stats,
            writes,
        )
        global _last
        _last = self
        check_loaded_draft(model, self)
        self._log()
        return result

    @contextlib.contextmanager
    def _in_progress(self) -> Iterator[None]:
        token = _IN_PROGRESS.set(self)
        try:
            yield
        finally:
            _IN_PROGRESS.reset(token)
            self._indexes.clear()  # a large index is big: kept only until the plan

    def resolved(self, source: WeightSource) -> list[str]:
        """sglang resolved ``source`` inside this load: the files of it the load streams."""
        indexes = read_indexes(source.folder) if narrowing_enabled() else {}
        choice = choose_files(source.folder, source.files, self.keeps, indexes)
        self.choices.append(choice)
        self._indexes[source.folder] = indexes
        self.resolutions.append(
            WeightSource(source.requested, source.folder, choice.kept, source.how)
        )
        return list(choice.kept)

    def mtp_file_added(self, folder: str, files: tuple[str, ...], how: str) -> None:
        """sglang added an ``mtp.safetensors`` the index does not list to ``folder``'s files."""
        requested = next(
            (s.requested for s in reversed(self.resolutions) if s.folder == folder), folder
        )
        self.resolutions.append(WeightSource(requested, folder, files, how))

    def _plan(self) -> DequantPlan | None:
        """The plan, made on the first tensor: sglang resolves its files only then."""
        source, fallback = self._source()
        if source is None:
            return None
        self.folder = source.folder
        ckpt = Checkpoint.open(
            source, wanted=self.setting.wanted, indexes=self._indexes.pop(source.folder, None)
        )
        plan = DequantPlan.build(ckpt)
        if fallback and (plan.to_dequantize or plan.errors):
            logger.warning(
                "sglang-mtp-dequant: sglang's DefaultModelLoader did not report the draft's "
                "weight files (load format %r); planning from %s, resolved by %s",
                self.launch.load_format if self.launch else "?",
                source.folder,
                source.how,
            )
        plan.raise_first_error()
        return plan

    def _source(self) -> tuple[WeightSource | None, bool]:
        """The files streamed, and whether they were resolved by the plugin (a fallback): this
        load's own resolution; else the draft path's, resolved ahead of the load (sglang's
        start-up prefetch); else the launch path resolved as sglang would (another loader)."""
        if self.resolutions:
            return self.resolutions[-1], False
        if self.launch is None:
            return None, True
        ahead = context.resolution_of(self.launch.path)
        if ahead is not None:
            return ahead, False
        try:
            fallback = sources.resolve_offline(
                self.launch.path,
                download_dir=self.launch.download_dir,
                revision=self.launch.revision,
            )
        except CheckpointFormatError:
            return None, True
        return fallback, True

    def _missing_hint(self) -> str:
        path = self.launch.path if self.launch else "no path in the sglang context"
        return (
            f"sglang-mtp-dequant could not find the files sglang streams (draft checkpoint "
            f"{path}); load it with the default loader from a local folder or a cached hub id"
        )

    def _log(self) -> None:
        summary = self.summary()
        lines = [summary]
        if self.quantization is None:
            lines.append(self.already_float_summary())
        if summary is None:
            lines.append(self.narrowing_line())
        for line in lines:
            if line is not None:
                logger.info("%s", line)

    # -- the record ------------------------------------------------------------------------

    @property
    def skipped_files(self) -> int:
        """Weight files sglang resolved that this load did not stream (``narrowing.py``)."""
        return sum(len(c.skipped) for c in self.choices)

    def narrowing_summary(self) -> str | None:
        """What the load streamed (the log line's clause), or None if it resolved nothing."""
        return "; ".join(c.summary() for c in self.choices) or None

    def narrowing_detail(self) -> str | None:
        """What the guard says beside a parameter left unwritten by a narrowed load."""
        return "; ".join(d for c in self.choices if (d := c.detail()) is not None) or None

    def narrowing_line(self) -> str | None:
        """The INFO line of a load that skipped files (a decoding load says it in its own)."""
        if not self.skipped_files:
            return None
        return (
            f"sglang-mtp-dequant: {self.class_name} draft from {self.choices[-1].folder}: "
            f"{self.narrowing_summary()}"
        )

    def sources(self) -> list[Source]:
        """Every draft name the stream handed on, with its dtype, file and described type."""
        checkpoint = self.plan.checkpoint if self.plan is not None else None
        decoded = set(self.plan.to_dequantize) if self.plan is not None else set()
        out = []
        for name, dtype in self.streamed.items():
            info = checkpoint.tensors.get(name) if checkpoint is not None else None
            out.append(
                Source(
                    name=name,
                    dtype=dtype,
                    file=info.file if info is not None else None,
                    description_type=checkpoint.type_of(name) if checkpoint is not None else None,
                    dequantized=name in decoded and is_code_dtype(dtype),
                )
            )
        return out

    def summary(self) -> str | None:
        """The INFO line of a load that decoded (or left to other ranks) anything."""
        stats = self.stats
        if not (stats.dequantized or stats.left_to_other_ranks):
            return None
        schemes = ", ".join(f"{k} x{v}" for k, v in sorted(stats.schemes.items()))
        if self.quantization is not None:
            decoded = sorted(self.plan.to_dequantize) if self.plan is not None else []
            return (
                f"sglang-mtp-dequant: {self.class_name} draft from {self.folder} is built "
                f"quantized ({self.quantization}); {stats.dequantized} tensor(s) of its plain "
                f"linear parts that no quantization method reads ({', '.join(decoded)}) were "
                f"decoded ({schemes}) by {self._decoder()} to {dtype_name(self.dtype)}, "
                f"{stats.companions_consumed} companion tensors consumed; every other tensor "
                f"went to sglang's own loaders as it was ({self.seconds:.3f} s whole load)"
            )
        return (
            f"sglang-mtp-dequant: {self.class_name} draft from {self.folder}: dequantized "
            f"{stats.dequantized} tensors ({schemes}) to {dtype_name(self.dtype)}, "
            f"{stats.quantized_bytes} quantized bytes, {stats.companions_consumed} companion "
            f"tensors consumed, {stats.left_to_other_ranks} expert tensors left to other "
            f"ranks, {stats.seconds:.3f} s decoding ({self.seconds:.3f} s whole load)"
            + (f"; {self.narrowing_summary()}" if self.skipped_files else "")
        )

    def _decoder(self) -> str:
        """Who decoded a quantized draft's plain parts (``formats/library.py``)."""
        formats = {e.format for e in (self.plan.to_dequantize if self.plan else {}).values()}
        return "compressed-tensors" if formats - {None} else "the plugin's ModelSlim schemes"

    def already_float_summary(self) -> str | None:
        """The INFO line of a load whose quantized tensors arrived float (decoded upstream)."""
        if not self.stats.already_float:
            return None
        return (
            f"sglang-mtp-dequant: {self.stats.already_float} quantized draft tensors arrived "
            "already float (dequantized upstream); left as they were"
        )
