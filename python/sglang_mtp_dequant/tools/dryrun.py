"""What sglang's own loaders would write, for a checkpoint's draft, without reading a weight.

Usage::

    coverage = simulate_load(source, checkpoint, plan, spec)
    coverage.unwritten      # {"model.layers.0.qkv_proj.weight": "shard 'k' of 3"}
    coverage.skipped        # draft checkpoint names the class drops

The doctor's answer to "will every draft parameter be filled?": sglang's own draft class is
built on the ``meta`` device (no memory) and its own ``load_weights`` is fed, through the
plugin's stream, a meta tensor of each draft tensor's header shape and dtype, with the write
recorder the server uses (``guard/writes.py``). Loaders decide by names and shapes, never by
values, so the record is the one a real load would make; no weight byte is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..formats.checkpoint import Checkpoint, WeightSource
from ..formats.plan import DequantPlan
from ..serving.drafts import DraftSpec, draft_dtype
from ..serving.guard import WriteRecorder
from ..serving.plugin import bypassed
from ..serving.stream import DequantizingStream


@dataclass
class Coverage:
    """The write record of a dry-run load."""

    class_name: str
    dtype: str
    unwritten: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def simulate_load(
    source: WeightSource, checkpoint: Checkpoint, plan: DequantPlan, spec: DraftSpec
) -> Coverage:
    """Dry-run sglang's load of the draft of ``source`` (see the module docstring).

    Raises whatever building the class or its loader raises on the meta device.
    """
    from .cpu_sglang import build_draft, draft_model_config, prepare_cpu_process

    prepare_cpu_process(source.folder)
    model = build_draft(draft_model_config(source.folder), device="meta")
    with WriteRecorder(model, spec.from_target) as writes:
        stream = DequantizingStream(
            lambda: plan, draft_dtype(model), spec.draft_names(model), observer=writes.on_streamed
        )
        with bypassed():  # sglang's own load_weights, fed the plugin's stream
            model.load_weights(stream.apply(_header_tensors(checkpoint)))
    dtype = str(draft_dtype(model)).replace("torch.", "")
    return Coverage(type(model).__name__, dtype, writes.unwritten(), writes.skipped_names())


def _header_tensors(checkpoint: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """Each recorded tensor as a meta tensor of its header's dtype and shape, in file order."""
    for name, info in checkpoint.tensors.items():
        if isinstance(info.dtype, torch.dtype):
            yield name, torch.empty(info.shape, dtype=info.dtype, device="meta")
