"""Which routed experts this rank keeps, as sglang's own FusedMoE decides.

Usage::

    owned = ExpertOwnership.of(draft_model)          # None: no MoE layer, or every expert kept
    owned.keeps("mtp.layers.0.mlp.experts.17.up_proj.weight")      # False on the other EP rank
    owned.kept_experts("mtp.layers.0.mlp.experts.gate_up_proj", 256)  # [0, ..., 127]

Why: under expert parallelism every expert streams to every rank and each rank's
``FusedMoE.weight_loader`` drops the others'. The answer is the built layer's own mapping, and
"keep" wherever the layer places experts otherwise (a kept expert costs time, a dropped one
correctness).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..formats import naming
from . import parameter_names
from .sglang_private import expert_map, holds_global_experts


class ExpertOwnership:
    """The FusedMoE layers of one built draft and the experts each keeps on this rank."""

    def __init__(self, layers: list[tuple[tuple[str, ...], torch.nn.Module]]) -> None:
        self.layers = layers
        self._kept: dict[tuple[int, int], bool] = {}

    @classmethod
    def of(cls, model: torch.nn.Module) -> ExpertOwnership | None:
        layers = [
            (parameter_names.tokens(name), module)
            for name, module in model.named_modules()
            if expert_map(module) is not None and hasattr(module, "num_experts")
        ]
        if not layers:
            return None
        owned = cls(layers)
        if all(owned._keeps_all(m) for _, m in layers):
            return None
        return owned

    def keeps(self, name: str) -> bool:
        """Whether this rank's loaders keep the per-expert checkpoint tensor ``name``."""
        expert = naming.expert_id(name)
        if expert is None:
            return True
        module = self._layer_for(name)
        return module is None or self._kept_by(module, expert)

    def kept_experts(self, name: str, count: int) -> list[int] | None:
        """The experts of a fused-experts tensor (``experts.gate_up_proj``, ``count`` experts
        along its first dimension) that this rank keeps; None when it keeps them all."""
        module = self._layer_for(name)
        if module is None:
            return None
        kept = [e for e in range(count) if self._kept_by(module, e)]
        return None if len(kept) == count else kept

    def _layer_for(self, name: str) -> torch.nn.Module | None:
        if len(self.layers) == 1:
            return self.layers[0][1]
        parts = parameter_names.tokens(name)
        for prefix, module in self.layers:
            if parts[: len(prefix)] == prefix:
                return module
        return None  # not attributable: keep (decode) it

    def _kept_by(self, module: torch.nn.Module, expert: int) -> bool:
        key = (id(module), expert)
        if key not in self._kept:
            self._kept[key] = self._keeps_all(module) or _ask(module, expert)
        return self._kept[key]

    @staticmethod
    def _keeps_all(module: torch.nn.Module) -> bool:
        """Placements the plain mapping does not describe: keep every expert."""
        if getattr(module, "uses_expert_location", False) and _expert_location_metadata():
            return True  # EPLB: physical replicas decide, not the mapping
        for param in module.parameters(recurse=False):
            if holds_global_experts(param):
                return True
        return getattr(module, "moe_ep_size", 1) == 1


def _expert_location_metadata() -> object | None:
    try:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        return get_global_expert_location_metadata()
    except Exception:  # noqa: BLE001 - another sglang: treat as present, keep every expert
        return True


def _ask(module: torch.nn.Module, expert: int) -> bool:
    mapping: Callable[[int], int] = expert_map(module)
    try:
        return mapping(expert) != -1
    except Exception:  # noqa: BLE001 - another sglang: keep (decode) rather than guess
        return True
