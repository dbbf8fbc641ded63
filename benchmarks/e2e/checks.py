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

SPECULATIVE = ("float", "stock", "plugin")
#: the plugin's INFO line for one draft load (``serving/plugin.py``), up to the folder
PLUGIN_LINE = re.compile(r"sglang-mtp-dequant: (\S+) draft from (\S+): dequantized (\d+) tensors")
SHIM_MARK = "sglang-mtp-dequant e2e shim:"
TREE_KERNELS = ("sgl_build_tree_kernel_triton ran", "verify_tree_greedy_triton ran")
#: the site shim's line for sglang's MoE experts computing one layer (``site/sitecustomize.py``)
MOE_LINE = re.compile(
    re.escape(f"{SHIM_MARK} sglang.srt.layers.moe.fused_moe_native.moe_forward_native ran for ")
    + r"(\S+)"
)
#: FusedMoE layer names: the target's layers, and the MTP draft's (built under ``mtp``)
TARGET_MOE, DRAFT_MOE = "model.layers.", "mtp."


def _log(result) -> str:
    with open(result.log_path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def check_outputs(results: dict, spec_keys: tuple[str, ...]) -> list[str]:
    """Every speculative run emits the reference run's tokens, and reports sglang's figures."""
    failures = []
    reference = results["reference"]
    for label in SPECULATIVE:
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
    """The plugin acted exactly where it should, and the CPU tree shim took effect.

    (sglang's own "Skipping plugin ..." line cannot be required of the stock run: sglang logs
    it before its logging is configured, so it never reaches the server log.)
    """
    failures = []
    plugin_lines = {label: PLUGIN_LINE.findall(_log(r)) for label, r in results.items()}
    named = [m for m in plugin_lines["plugin"] if os.path.abspath(m[1]) == draft_folder]
    if not named:
        failures.append(
            f"plugin: no 'sglang-mtp-dequant: ... draft from {draft_folder}: dequantized' "
            f"line in {results['plugin'].log_path} (found {plugin_lines['plugin']})"
        )
    for label in ("reference", "float", "stock"):
        if plugin_lines[label]:
            failures.append(f"{label}: the plugin dequantized something: {plugin_lines[label]}")
    for label in SPECULATIVE:
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
        wanted = [TARGET_MOE] + ([DRAFT_MOE] if label in SPECULATIVE else [])
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
    plugin: float
    float_min: float = 2.0
    stock_max: float = 1.3
    plugin_share_min: float = 0.97

    @classmethod
    def of(cls, results: dict) -> Bars:
        return cls(*(results[label].accept_length or 0.0 for label in SPECULATIVE))

    def failures(self) -> list[str]:
        out = []
        if self.float < self.float_min:
            out.append(f"float accept length {self.float:.3f} < {self.float_min}")
        if self.stock > self.stock_max:
            out.append(f"stock accept length {self.stock:.3f} > {self.stock_max}")
        if self.plugin < self.plugin_share_min * self.float:
            out.append(
                f"plugin accept length {self.plugin:.3f} < {self.plugin_share_min} x float "
                f"({self.plugin_share_min * self.float:.3f})"
            )
        return out

    def to_json(self) -> dict:
        return asdict(self)
