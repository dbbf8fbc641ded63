"""The end-to-end run's pass conditions, each read from what sglang itself returned or logged.

Usage::

    failures = check_outputs(results, SPEC_KEYS) + check_logs(results, draft_folder)
    failures += check_moe_logs(results)                  # the MoE family only
    bars = Bars.of(results); failures += bars.failures()

``results`` maps a run's label (reference, float, stock, plugin) to what its server returned
(``e2e_server.RunResult``). A failure is a sentence saying what was expected and what came.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

#: the plugin's INFO line for one draft load (``serving/plugin.py``), up to the folder
PLUGIN_LINE = re.compile(r"sglang-mtp-dequant: (\S+) draft from (\S+): dequantized (\d+) tensors")
#: the feature branch's INFO line (upstream/series/, ``modelslim_draft.py``)
BRANCH_LINE = re.compile(
    r"Dequantized (\d+) ModelSlim draft weights \(.*\) to \S+ for a draft built unquantized, "
    r"from (\S+)"
)
#: the run of the quantized draft with the fix: the plugin's, or the feature branch's
FIXED = ("plugin", "branch")

SHIM_MARK = "sglang-mtp-dequant e2e shim:"
TREE_KERNELS = ("sgl_build_tree_kernel_triton ran", "verify_tree_greedy_triton ran")
#: the site shim's line for sglang's MoE experts computing one layer (``site/sitecustomize.py``)
MOE_LINE = re.compile(
    re.escape(f"{SHIM_MARK} sglang.srt.layers.moe.fused_moe_native.moe_forward_native ran for ")
    + r"(\S+)"
)
#: FusedMoE layer names: the target's layers, and the MTP draft's (built under ``mtp``)
TARGET_MOE, DRAFT_MOE = "model.layers.", "mtp."


def speculative(results: dict) -> tuple[str, str, str]:
    """The labels of the float, stock and fixed runs present in ``results``."""
    fixed = next(label for label in FIXED if label in results)
    return "float", "stock", fixed


def _log(result) -> str:
    with open(result.log_path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def check_outputs(results: dict, spec_keys: tuple[str, ...]) -> list[str]:
    """Every speculative run emits the reference run's tokens, and reports sglang's figures."""
    failures = []
    reference = results["reference"]
    for label in speculative(results):
        run = results[label]
        for i, (want, got) in enumerate(zip(reference.generations, run.generations, strict=True)):
            if got.output_ids != want.output_ids:
                first = first_difference(want.output_ids, got.output_ids)
                failures.append(
                    f"{label}: prompt {i} differs from the run without speculation from token "
                    f"{first} on ({got.output_ids[first : first + 8]} vs "
                    f"{want.output_ids[first : first + 8]})"
                )
            missing = [k for k in spec_keys if k not in got.meta]
            if missing:
                failures.append(f"{label}: prompt {i}: sglang's meta_info lacks {missing}")
    return failures


def first_difference(want: list[int], got: list[int]) -> int:
    """The index of the first token where ``got`` leaves ``want``."""
    for index, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return index
    return min(len(want), len(got))


def check_logs(results: dict, draft_folder: str) -> list[str]:
    """The fix acted exactly where it should (the plugin's line, or the branch's), and the CPU
    tree shim took effect in every speculative server."""
    fixed = speculative(results)[2]
    rule = PLUGIN_LINE if fixed == "plugin" else BRANCH_LINE
    failures = []
    lines = {label: rule.findall(_log(r)) for label, r in results.items()}
    if not [m for m in lines[fixed] if os.path.abspath(m[1]) == draft_folder]:
        failures.append(
            f"{fixed}: no {'plugin' if fixed == 'plugin' else 'feature-branch'} line naming "
            f"{draft_folder} in {results[fixed].log_path} (found {lines[fixed]})"
        )
    for label in results:
        if label != fixed and lines[label]:
            failures.append(f"{label}: the fix dequantized something: {lines[label]}")
    if fixed == "branch":
        for label, r in results.items():
            if PLUGIN_LINE.findall(_log(r)):
                failures.append(f"{label}: the plugin acted, but it was switched off")
    return failures + _check_tree_shim(results)


def _check_tree_shim(results: dict) -> list[str]:
    failures = []
    for label in speculative(results):
        text = _log(results[label])
        for kernel in TREE_KERNELS:
            if f"{SHIM_MARK} sglang.kernels.ops.speculative.spec_tree.{kernel}" not in text:
                failures.append(
                    f"{label}: the CPU tree shim did not take effect ('{kernel}' not logged): "
                    "sglang's greedy tree verification would be a silent no-op"
                )
    return failures


def check_moe_logs(results: dict) -> list[str]:
    """The MoE family's routed experts ran through sglang's FusedMoE layers: the target's in
    every server, the MTP draft's in every speculative one (the site shim logs each layer's
    first call of sglang's expert computation)."""
    failures = []
    for label, result in results.items():
        layers = set(MOE_LINE.findall(_log(result)))
        wanted = [TARGET_MOE] + ([DRAFT_MOE] if label in speculative(results) else [])
        for prefix in wanted:
            if not any(layer.startswith(prefix) for layer in layers):
                failures.append(
                    f"{label}: no MoE layer named {prefix}* computed its experts in "
                    f"{result.log_path} (layers seen: {sorted(layers)})"
                )
    return failures


@dataclass
class Bars:
    """sglang's accept lengths of the three speculative runs against the issue's bounds."""

    float: float
    stock: float
    fixed: float  # the plugin's run, or the feature branch's
    fixed_label: str = "plugin"
    float_min: float = 2.0
    stock_max: float = 1.3
    plugin_share_min: float = 0.97

    @classmethod
    def of(cls, results: dict) -> Bars:
        labels = speculative(results)
        values = [results[label].accept_length or 0.0 for label in labels]
        return cls(*values, fixed_label=labels[2])

    def failures(self) -> list[str]:
        out = []
        if self.float < self.float_min:
            out.append(f"float accept length {self.float:.3f} < {self.float_min}")
        if self.stock > self.stock_max:
            out.append(f"stock accept length {self.stock:.3f} > {self.stock_max}")
        if self.fixed < self.plugin_share_min * self.float:
            out.append(
                f"{self.fixed_label} accept length {self.fixed:.3f} < {self.plugin_share_min} "
                f"x float ({self.plugin_share_min * self.float:.3f})"
            )
        return out

    def to_json(self) -> dict:
        return asdict(self)
