"""A draft sglang builds quantized: sglang's own load, recorded and guarded.

Usage (the hook in ``plugin.py`` calls it when ``model.quant_config`` is set)::

    result = load_quantized_draft(original, spec, model, weights, *args, **kwargs)

Why: on CUDA sglang builds a compressed-tensors (or ModelOpt, ...) draft quantized, and its
quantized layers consume their codes, but every MTP class builds ``fc`` / ``eh_proj`` as a
plain ``nn.Linear`` that no quantization method owns. An export that quantized it too hands
sglang codes with nowhere to go: packed ``fc.weight_packed`` is skipped (``fc.weight`` stays
uninitialised memory), int8 ``fc.weight`` is copied into the bf16 parameter with its scale
dropped. Nothing in sglang notices. So the stream stays exactly sglang's except for the
tensors of those plain ``nn.Linear`` parts, which are decoded where a library decodes their
format (compressed-tensors, ``formats/library.py``) and refused before any write where none
does; every parameter write is recorded and, once ``load_weights`` returns, the guard refuses
a parameter never written and a plain float parameter holding codes (``guard/``). Parameters a
quantization method owns are checked for writes only: their values are codes by design.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from . import context
from .drafts import DraftSpec, draft_dtype
from .guard import WriteRecorder, check_loaded_draft
from .load_record import DraftLoad
from .narrowing import DraftNarrowing, narrowing_line
from .plain_parts import feeds_plain_linear, plain_linears
from .stream import DequantizingStream

logger = logging.getLogger("sglang_mtp_dequant")


def load_quantized_draft(
    original: Callable[..., Any],
    spec: DraftSpec,
    model: torch.nn.Module,
    weights: Any,
    planner_class: Callable[..., Any],
    narrowed: DraftNarrowing,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """sglang's ``load_weights`` of a quantized draft, under the write recorder and the guard
    (see the module docstring). ``planner_class`` is the hook's ``DraftPlanner``: the files
    sglang streams, planned for the names that feed a plain ``nn.Linear`` only."""
    is_draft = spec.draft_names(model)
    linears = plain_linears(model)
    planner = planner_class(
        is_draft, narrowed, wanted=lambda n: is_draft(n) and feeds_plain_linear(n, linears)
    )
    with WriteRecorder(model, spec.from_target) as writes:
        stream = DequantizingStream(
            planner.plan,
            draft_dtype(model),
            is_draft,
            missing_plan_hint=planner.missing_hint(),
            observer=writes.on_streamed,
            refuse_raw_codes=False,
        )
        started = time.perf_counter()
        result = original(model, stream.apply(weights), *args, **kwargs)
        seconds = time.perf_counter() - started
    config = getattr(model, "quant_config", None)
    quant = str(config.get_name()) if config is not None else None
    load = DraftLoad.of(spec.class_name, planner.folder, stream, writes, seconds, quant, narrowed)
    context.record_draft_load(load)
    check_loaded_draft(model, load)
    for line in (load.summary() or narrowing_line(spec.class_name, narrowed),):
        if line is not None:
            logger.info("%s", line)
    return result
