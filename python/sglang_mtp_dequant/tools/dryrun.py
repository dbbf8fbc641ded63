"""How sglang builds a checkpoint's draft, and what its loaders would write, without a weight.

Usage::

    built = build_meta_draft(source.folder)      # sglang's ModelConfig, quant config, class
    built.quant_config         # None: built unquantized (the plugin's hook acts)
    coverage = simulate_load(built, checkpoint, plan, spec)    # through the plugin's stream
    coverage = simulate_load(built, checkpoint, None, spec)    # stock sglang (a quantized draft)
    coverage.unwritten, coverage.skipped, coverage.codes_in_float

Both answers are sglang's own code: the draft built on ``meta`` for the user's launch, its
``load_weights`` fed a meta tensor per header, under the server's write recorder. Loaders decide
by names and shapes, never values, so the record is a real load's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ..formats.checkpoint import Checkpoint, dtype_name, is_code_dtype
from ..formats.plan import DequantPlan
from ..serving.drafts import DraftSpec, draft_dtype
from ..serving.guard import WriteRecorder
from ..serving.plain_parts import quant_owned
from ..serving.plugin import bypassed
from ..serving.stream import DequantizingStream

if TYPE_CHECKING:
    from .launch import Launch


@dataclass
class Built:
    """sglang's draft for a checkpoint, built on the meta device."""

    model_config: Any
    model: torch.nn.Module

    @property
    def class_name(self) -> str:
        return type(self.model).__name__

    @property
    def quantization(self) -> str | None:
        """What sglang's draft ``ModelConfig`` resolved (before the class's own rule)."""
        return self.model_config.quantization

    @property
    def quant_config(self) -> str | None:
        """The quantization the built draft keeps (what the plugin's hook looks at)."""
        config = getattr(self.model, "quant_config", None)
        return None if config is None else str(config.get_name())

    @property
    def dtype(self) -> str:
        return dtype_name(draft_dtype(self.model))

    def applies_rotation(self) -> bool:
        """Whether sglang's class has a QuaRot step (``rot_weight``, DeepSeek's NextN)."""
        return any(hasattr(module, "rot_weight") for module in self.model.modules())


@dataclass
class Coverage:
    """The write record of a dry-run load."""

    class_name: str
    dtype: str
    unwritten: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    #: float parameter -> the code tensors (name, dtype) stock sglang copies into it
    codes_in_float: dict[str, list[str]] = field(default_factory=dict)


def build_meta_draft(
    folder: str,
    launch: Launch | None = None,
    adjust_quant_config: Callable[[Any], None] | None = None,
) -> Built:
    """sglang's draft for ``folder`` on ``meta``, for ``launch``; raises what sglang raises."""
    from .cpu_sglang import build_draft, draft_model_config, prepare_cpu_process
    from .launch import default_launch
    from .target_check import rmsnorm_kept

    launch = launch or default_launch(folder)
    prepare_cpu_process(folder, **launch.server_args())
    model_config = draft_model_config(folder)
    # RMSNorm restored: a description listing a norm.bias patches it for the whole process
    with launch.platform(), bypassed(), rmsnorm_kept():
        model = build_draft(model_config, "meta", adjust_quant_config)
    return Built(model_config, model)


def draft_architecture(folder: str) -> str | None:
    """The draft class sglang's draft ``ModelConfig`` names for ``folder``, or None."""
    from .cpu_sglang import draft_model_config

    try:
        return str(draft_model_config(folder).hf_config.architectures[0])
    except Exception:  # noqa: BLE001 - the build's own error says why
        return None


def simulate_load(
    built: Built,
    checkpoint: Checkpoint,
    plan: DequantPlan | None,
    spec: DraftSpec | None,
    quantized: bool = False,
) -> Coverage:
    """Dry-run sglang's load of the draft, through the plugin's stream with ``plan`` (keeping
    undecoded codes where ``quantized``), or as stock; raises what the class's loader raises."""
    model = built.model
    from_target = spec.from_target if spec is not None else ("embed_tokens", "lm_head")
    names = spec.draft_names(model) if spec is not None else (lambda n: n in checkpoint.tensors)
    dtypes = {n: i.dtype for n, i in checkpoint.tensors.items()}
    with WriteRecorder(model, from_target) as writes:
        stream = None
        if plan is not None:
            stream = DequantizingStream(
                lambda: plan,
                draft_dtype(model),
                names,
                observer=writes.on_streamed,
                refuse_raw_codes=not quantized,
            )
            weights = stream.apply(_header_tensors(checkpoint))
        else:
            weights = writes.observe(_header_tensors(checkpoint))
        with bypassed():  # sglang's own load_weights (fed the plugin's stream if planned)
            cast(Any, model).load_weights(writes.follow(weights))
    coverage = Coverage(built.class_name, built.dtype, writes.unwritten(), writes.skipped_names())
    owned = quant_owned(model)  # codes by design
    decoded = set(plan.to_dequantize) if plan is not None else set()
    for parameter, sources in writes.fed_by.items():
        param = writes.params.get(parameter)
        if param is None or parameter in owned or not param.is_floating_point():
            continue
        if is_code_dtype(param.dtype):
            continue
        codes = [
            s for s in sources if s not in decoded and is_code_dtype(dtypes.get(s, torch.float32))
        ]
        if codes:
            coverage.codes_in_float[parameter] = codes
    return coverage


def _header_tensors(checkpoint: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """Each recorded tensor as a meta tensor of its header's dtype and shape, in file order."""
    for name, info in checkpoint.tensors.items():
        if isinstance(info.dtype, torch.dtype):
            yield name, torch.empty(info.shape, dtype=info.dtype, device="meta")
