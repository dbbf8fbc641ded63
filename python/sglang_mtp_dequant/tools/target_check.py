"""The target's linear layers sglang builds unquantized over quantized codes, for a launch.

Usage::

    report = check_target(folder, launch)     # after prepare_cpu_process(folder, ...)
    report.problems()   # ["target Qwen3_5ForCausalLM: ... refused at start-up ..."]
    report.notes()      # ["... in_proj_qkvz = in_proj_qkv + in_proj_z ... the plugin supplies ..."]

Why: a target layer built unquantized over int8 codes serves garbage however the draft loads.
The answer comes from sglang's own unhooked build on the meta device under the launch's platform
(NPU only: ModelSlim's quantized methods run nowhere else), then ``serving/target_layers.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..serving import sglang_private, target_layers
from ..serving.float_layers import builds_as_the_plugin
from ..serving.target_layers import UnservedLayer

if TYPE_CHECKING:
    from .launch import Launch

logger = logging.getLogger("sglang_mtp_dequant")
#: how many layers a note names before counting the rest (a doctor line stays readable)
SHOWN = 3


@dataclass
class TargetCheck:
    """What stock sglang and the plugin make of the target's linear layers."""

    class_name: str = ""
    #: why the target was not checked ("" when it was)
    not_checked: str = ""
    stock: list[UnservedLayer] = field(default_factory=list)
    supplied: dict[str, list[str]] = field(default_factory=dict)
    #: still unquantized over codes once supplied: decoded as they stream, or refused
    decoded: list[UnservedLayer] = field(default_factory=list)
    refused: list[UnservedLayer] = field(default_factory=list)
    #: what the operator can do about ``refused``, read under the launch's platform
    remedy: str = ""
    #: (model, ModelConfig): sglang's meta build the check read (verify loads its layers)
    built: tuple[Any, Any] | None = field(default=None, repr=False)

    def notes(self) -> list[str]:
        if self.not_checked:
            return [f"target layers not checked: {self.not_checked}"]
        if not self.stock:
            return []
        names = ", ".join(f"{n} = {' + '.join(s)}" for n, s in self.supplied.items())
        fixed = len(self.stock) - len(self.decoded) - len(self.refused)
        said = [f"the plugin supplies {names} to sglang's NPU packed-module mapping, so {fixed} "
                "of them get their ModelSlim scheme"] if self.supplied else []  # fmt: skip
        if self.decoded:
            said.append(f"the plugin decodes {len(self.decoded)} of them as they stream")
        return [
            f"target {self.class_name}: stock sglang builds {len(self.stock)} linear layer(s) "
            f"with the unquantized method over quantized codes ({_layers(self.stock)}): their "
            f"codes would load as weights{_vision(self.stock)}; "
            + ("; ".join(said) or "the plugin has no mapping to supply for them")
        ]

    def outcome(self) -> TargetOutcome | None:
        """The target's cell of the doctor's form table, or None when stock builds it right."""
        if self.not_checked or not self.stock:
            return None
        served = len(self.stock) - len(self.refused)
        return TargetOutcome(
            stock=f"{len(self.stock)} target layer(s) load raw codes ({_layers(self.stock[:1])})"
            + _vision(self.stock),
            plugin=(
                f"refused at start-up: {len(self.refused)} target layer(s) no method takes and "
                f"the plugin does not decode ({_layers(self.refused[:1])})"
                if self.refused
                else f"{served} target layer(s) served right"
                + (f" ({len(self.decoded)} decoded as they stream)" if self.decoded else "")
                + (": images answered right" if any(u.vision for u in self.decoded) else "")
            ),
            plugin_serves=not self.refused,
        )

    def problems(self) -> list[str]:
        if not self.refused:
            return []
        return [
            f"target {self.class_name}: {len(self.refused)} linear layer(s) no ModelSlim method "
            f"takes and the plugin does not decode ({_layers(self.refused)}); the plugin refuses "
            "the start-up (sglang would load their codes as weights): " + self.remedy
        ]


@dataclass(frozen=True)
class TargetOutcome:
    """What stock sglang and the plugin make of a launch's target, in a form-table cell."""

    stock: str  # stock's outcome (stock does not serve it right: there would be no outcome)
    plugin: str
    plugin_serves: bool


def _vision(found: list[UnservedLayer]) -> str:
    """What stock's raw codes in the vision tower mean for the launch."""
    count = sum(u.vision for u in found)
    return (
        f"; {count} of them the vision tower's (built with quant_config=None): every image and "
        "video request would run on raw codes"
        if count
        else ""
    )


def _layers(found: list[UnservedLayer]) -> str:
    shown = [u.line() for u in found[:SHOWN]]
    more = len(found) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def check_target(folder: str, launch: Launch) -> TargetCheck:
    """The target of ``folder`` as sglang builds it for ``launch`` (its context published)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig

    model_config = ModelConfig.from_server_args(
        sglang_private.published_server_args(), model_path=folder
    )
    if model_config.quantization != target_layers.MODELSLIM:
        return TargetCheck(
            not_checked=f"sglang builds the target with quantization "
            f"{model_config.quantization!r}, not ModelSlim"
        )
    if launch.device != "npu":
        return TargetCheck(
            not_checked=f"--device {launch.device}: sglang runs ModelSlim's quantized linear "
            "methods only on Ascend NPU"
        )
    load_config = LoadConfig(load_format="auto")
    with launch.platform(), rmsnorm_kept():
        config = sglang_private.unwrapped(_quantization_config())(model_config, load_config)
        model, prefixes = _build_on_meta(model_config, load_config, config)
        report = TargetCheck(class_name=type(model).__name__)
        report.stock = target_layers.unserved_layers(model, config, prefixes)
        if report.stock:
            report.supplied = target_layers.supply_packed_names(config)
            if report.supplied:
                model, prefixes = _build_on_meta(model_config, load_config, config)
            unserved = target_layers.unserved_layers(model, config, prefixes)
            report.refused = target_layers.refused_layers(unserved, config)
            report.decoded = [u for u in unserved if u not in report.refused]
            report.built = (model, model_config)
            if report.refused:
                report.remedy = target_layers.remedy(report.refused, config)
    return report


@contextlib.contextmanager
def rmsnorm_kept() -> Iterator[None]:
    """``RMSNorm`` restored: ``ModelSlimConfig`` patches it process-wide for a ``norm.bias``."""
    from sglang.srt.layers.layernorm import RMSNorm

    saved = {k: RMSNorm.__dict__[k] for k in ("__init__", "forward_npu") if k in RMSNorm.__dict__}
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(RMSNorm, key, value)


def _quantization_config() -> Any:
    import importlib

    module, _, name = sglang_private.QUANTIZATION_CONFIG_TARGET.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _build_on_meta(
    model_config: Any, load_config: Any, quant_config: Any
) -> tuple[Any, dict[int, str]]:
    """sglang's own (unhooked) build of the target on the meta device, and each layer's build
    prefix. All-FLOAT MoE layers are built as the plugin has them (``float_layers``): stock
    stops there (sglang #34211), and the linear layers this check reads are the same."""
    import importlib

    import torch
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    from .cpu_env import generic_rope_on_cpu, placeholder_vllm_rotary

    module, _, name = sglang_private.INITIALIZE_MODEL_TARGET.rpartition(".")
    build = sglang_private.unwrapped(getattr(importlib.import_module(module), name))
    with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            builds_as_the_plugin(quant_config)
            try:
                with target_layers.recorded_prefixes() as prefixes:
                    return build(model_config, load_config, quant_config), prefixes
            finally:
                del quant_config.get_quant_method  # this config object, for this build


def report_into(
    notes: list[str], problems: list[str], folder: str, launch: Launch
) -> TargetCheck | None:
    """``check_target``'s notes and problems added to a report. A target sglang cannot build
    on this CPU adds nothing: it is sglang's failure here, not the checkpoint's, and is logged."""
    try:
        check = check_target(folder, launch)
    except Exception as exc:  # noqa: BLE001 - sglang's own failure to build, logged as is
        logger.info(
            "sglang-mtp-dequant: target layers not checked: sglang could not build the target "
            "here (%s: %s)",
            type(exc).__name__,
            exc,
        )
        return None
    notes.extend(check.notes())
    problems.extend(check.problems())
    return check
