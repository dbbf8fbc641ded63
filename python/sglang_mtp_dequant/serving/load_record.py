"""One draft load as the hook saw it: the record the guard, the log line and benchmarks read.

Usage::

    load = context.last_draft_load()       # the newest draft load of this process
    load.class_name, load.folder, load.stats.dequantized, load.writes.unwritten()
    load.sources()                          # every draft tensor as it streamed: dtype, file, type
    load.summary()                          # the INFO line, or None when nothing was decoded

Why a record: the guard, the log line, the CLI and the benchmarks all read the same facts of a
load; one typed value, made once by the hook when sglang's ``load_weights`` returns, is what
each of them takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.checkpoint import dtype_name, is_code_dtype
from ..formats.plan import DequantPlan
from .guard.report import Source
from .guard.writes import WriteRecorder
from .narrowing import DraftNarrowing
from .stream import DequantizingStream, StreamStats


@dataclass
class DraftLoad:
    """What one draft load streamed, decoded and wrote (see the module docstring)."""

    class_name: str
    #: the folder sglang's loader resolved for the draft (None: not known, e.g. no plan)
    folder: str | None
    #: the dtype the draft's float parameters were built in (what decoded weights became)
    dtype: torch.dtype
    #: the per-tensor decisions (None: the stream was empty or no source was found)
    plan: DequantPlan | None
    #: draft checkpoint name -> the dtype it streamed as
    streamed: dict[str, torch.dtype]
    stats: StreamStats
    writes: WriteRecorder
    #: wall seconds of sglang's ``load_weights``, decoding included
    seconds: float
    #: the quantization the draft was built with (None: unquantized, the plugin decodes)
    quantization: str | None = None
    #: which of the resolved weight files the load streamed (None: not narrowed by the hook)
    narrowing: DraftNarrowing | None = None

    @classmethod
    def of(
        cls,
        class_name: str,
        folder: str | None,
        stream: DequantizingStream,
        writes: WriteRecorder,
        seconds: float,
        quantization: str | None = None,
        narrowing: DraftNarrowing | None = None,
    ) -> DraftLoad:
        return cls(
            class_name,
            folder,
            stream.dtype,
            stream.plan,
            dict(stream.streamed),
            stream.stats,
            writes,
            seconds,
            quantization,
            narrowing,
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
                f"nn.Linear parts that no quantization method reads ({', '.join(decoded)}) were "
                f"decoded ({schemes}) by compressed-tensors to {dtype_name(self.dtype)}, "
                f"{stats.companions_consumed} companion tensors consumed; every other tensor "
                f"went to sglang's own loaders as it was ({self.seconds:.3f} s whole load)"
            )
        return (
            f"sglang-mtp-dequant: {self.class_name} draft from {self.folder}: dequantized "
            f"{stats.dequantized} tensors ({schemes}) to {dtype_name(self.dtype)}, "
            f"{stats.quantized_bytes} quantized bytes, {stats.companions_consumed} companion "
            f"tensors consumed, {stats.left_to_other_ranks} expert tensors left to other "
            f"ranks, {stats.seconds:.3f} s decoding ({self.seconds:.3f} s whole load)"
            + (f"; {self.narrowing.summary()}" if self.narrowing and self.narrowing.skipped else "")
        )

    @property
    def skipped_files(self) -> int:
        """Weight files sglang resolved that this load did not stream (``narrowing.py``)."""
        return self.narrowing.skipped if self.narrowing is not None else 0

    def narrowing_detail(self) -> str | None:
        """What the guard says beside a parameter left unwritten by a narrowed load."""
        return self.narrowing.detail() if self.narrowing is not None else None

    def already_float_summary(self) -> str | None:
        """The INFO line of a load whose quantized tensors arrived float (decoded upstream)."""
        if not self.stats.already_float:
            return None
        return (
            f"sglang-mtp-dequant: {self.stats.already_float} quantized draft tensors arrived "
            "already float (dequantized upstream); left as they were"
        )
