"""The guard: refuse a loaded draft that would serve garbage, whatever the checkpoint claimed.

Usage::

    with WriteRecorder(model, from_target=spec.from_target) as writes:
        model.load_weights(writes.follow(stream.apply(weights)))  # (load.py does this)
    check_loaded_draft(model, load)   # load: the DraftLoad that ran it; raises, warns or passes

``SGLANG_MTP_DEQUANT_GUARD`` = ``error`` (default: stop the start-up) | ``warn`` (log the same
message once and go on) | ``off`` (skip the check).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import torch

from ...formats.plan import DequantPlan
from ..plain_parts import meant_for, quant_owned
from ..settings import env_choice
from .report import (
    MODE_ENV,
    Finding,
    MisloadedDraftError,
    Source,
    SourceIndex,
)
from .values import code_evidence, nonfinite_rows
from .writes import WriteRecorder


class DraftLoadRecord(Protocol):
    """What the guard reads of a draft load (``load.DraftLoad``, which runs the guard)."""

    class_name: str
    folder: str | None
    quantization: str | None
    plan: DequantPlan | None
    writes: WriteRecorder | None

    def sources(self) -> list[Source]: ...

    def narrowing_detail(self) -> str | None: ...


logger = logging.getLogger("sglang_mtp_dequant")

MODES = ("error", "warn", "off")

__all__ = [
    "MODE_ENV",
    "Finding",
    "MisloadedDraftError",
    "WriteRecorder",
    "check_loaded_draft",
    "guard_mode",
    "inspect_parameters",
]


def guard_mode() -> str:
    """The mode from ``SGLANG_MTP_DEQUANT_GUARD``; a typo stops the start-up, not the guard."""
    return env_choice(MODE_ENV, "error", MODES)


def inspect_parameters(
    params: Mapping[str, torch.Tensor], sources: SourceIndex | None = None
) -> list[Finding]:
    """Every float parameter holding codes or NaN, or fed by raw codes nothing decoded."""
    findings = []
    for name, param in params.items():
        if not param.is_floating_point():
            continue
        fed = sources.sources_of(name) if sources is not None else []
        evidence = code_evidence(param)
        bad_rows = nonfinite_rows(param) if evidence is None else 0
        if evidence is not None or bad_rows or any(s.raw_codes for s in fed):
            findings.append(
                Finding(
                    name, param.dtype, tuple(param.shape), evidence, None, bad_rows, sources=fed
                )
            )
    return findings


def check_loaded_draft(model: torch.nn.Module, load: DraftLoadRecord) -> list[Finding]:
    """Run both checks on a draft sglang just loaded; raise, warn or pass per the mode."""
    mode = guard_mode()
    if mode == "off":
        return []
    writes = load.writes
    assert writes is not None, "check_loaded_draft runs on a load that recorded its writes"
    packed = getattr(model, "packed_modules_mapping", None)
    sources = SourceIndex(load.sources(), packed, writes.fed_by)
    unwritten = writes.unwritten()
    findings = [
        Finding(
            name,
            writes.params[name].dtype,
            tuple(writes.params[name].shape),
            unwritten=what,
            sources=sources.sources_of(name),
            meant=meant_for(name, writes.skipped_names()),
        )
        for name, what in unwritten.items()
    ]
    # values of the complete ones, except those a quantization method owns (codes by design)
    owned = quant_owned(model)
    written = {
        n: writes.params[n]
        for n in sorted(writes.written_parameters())
        if n not in unwritten and n not in owned
    }
    findings += inspect_parameters(written, sources)
    if not findings:
        return []
    narrowed = load.narrowing_detail() if unwritten else None
    error = MisloadedDraftError(
        findings,
        load.class_name,
        load.folder,
        writes.skipped_names(),
        _built_as(load),
        note=narrowed,
    )
    if mode == "warn":
        logger.warning("%s (continuing: %s=warn)", error, MODE_ENV)
        return findings
    raise error


def _built_as(load: DraftLoadRecord) -> str | None:
    """``compressed_tensors; config.json: ...``, None for a draft built unquantized."""
    if load.quantization is None:
        return None
    declared = load.plan.checkpoint.declared if load.plan is not None else None
    return f"{load.quantization}; config.json: {declared.label}" if declared else load.quantization
