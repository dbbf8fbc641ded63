"""The end-to-end run's pass conditions, each read from what sglang itself returned or logged.

Usage::

    failures = check_outputs(results, plan.reference_of, SPEC_KEYS)
    failures += check_logs(results, plan.draft_folder) + check_shims(results)
    failures += check_moe_logs(results)                  # the MoE family only
    bars = Bars.of(results); failures += bars.failures()

``results`` maps a run's label (reference, float, stock, plugin, ...) to what its server
returned (``run.RunResult``, whose ``run`` is the ``server.ServerRun``). A failure is a
sentence saying what was expected and what came.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

#: the plugin's INFO line for one draft load (``serving/plugin.py``), up to the folder
PLUGIN_LINE = re.compile(r"sglang-mtp-dequant: (\S+) draft from (\S+): dequantized (\d+) tensors")
#: the feature branch's INFO line (upstream/series/, PR 1's ``qwen3_5_mtp.py``)
BRANCH_LINE = re.compile(
    r"Dequantized (\d+) ModelSlim W8A8_DYNAMIC draft weights \(\S+\) from (\S+)"
)
#: the run of the quantized draft with the fix: the plugin's, or the feature branch's
FIXED = ("plugin", "branch")

#: the accept-length bars (sglang's own, completion tokens per verify step): the float draft
#: reaches FLOAT_MIN, stock's draft of raw codes stays under STOCK_MAX, and a fixed draft
#: reaches ACCEPT_SHARE of the float draft's (the e2e runs, the forms table, ``make accept``)
FLOAT_MIN, STOCK_MAX, ACCEPT_SHARE = 2.0, 1.3, 0.97

SHIM_MARK = "sglang-mtp-dequant e2e shim:"
#: ``site/e2e_shim_npu_check.py``'s line: the draft module's ``is_npu`` answered True
DRAFT_NPU_CHECK_LINE = (
    "sglang.srt.models.qwen3_5_mtp.is_npu answers True (as on the NPU step 01 runs on)"
)
TREE_KERNELS = ("sgl_build_tree_kernel_triton ran", "verify_tree_greedy_triton ran")
#: where a release keeps them (site/sitecustomize.py): sglang 0.5.23, or 0.5.17 to 0.5.22
TREE_MODULES = ("sglang.kernels.ops.speculative.spec_tree", "sglang.srt.speculative.eagle_utils")
#: the site shim's line for sglang's MoE experts computing one layer (``site/sitecustomize.py``)
MOE_LINE = re.compile(
    re.escape(f"{SHIM_MARK} sglang.srt.layers.moe.fused_moe_native.moe_forward_native ran for ")
    + r"(\S+)"
)
#: FusedMoE layer names: the target's layers, and the MTP draft's (built under ``mtp``)
TARGET_MOE, DRAFT_MOE = "model.layers.", "mtp."
#: what every server given ``--quantization modelslim`` (target or draft) must log: the CPU
#: stand-ins of ``site/e2e_shim_modelslim.py`` and ``site/e2e_shim_npu_ops.py`` took effect
MODELSLIM_SHIM_LINES = (
    "ModelSlimConfig accepts float32 for the CPU run",
    "sglang's NPU packed-module mapping applied by _get_quantization_config",
    "torch.ops.npu.npu_dynamic_quant ran on the CPU stand-in",
    "torch.ops.npu.npu_quant_matmul ran on the CPU stand-in",
)
#: the GDN fixes (``site/e2e_shim_gdn.py``) every hybrid server needs, and those EAGLE adds
GDN_FIXES = (
    "float32-chunk",
    "fla-device-ctx",
    "device-context",
    "autotune-one-config",
    "fla-op-aliases",
    "sm-count",
)
GDN_SPECULATIVE_FIXES = ("scatter-device-check",)


def fixed_label(results: dict) -> str:
    """The label of the run that serves the quantized draft with the fix."""
    return next(label for label in FIXED if label in results)


def _log(result) -> str:
    with open(result.log_path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def check_outputs(results: dict, reference_of: dict[str, str], spec_keys: tuple[str, ...]):
    """Every speculative run emits its reference run's tokens, and reports sglang's figures."""
    failures = []
    for label, reference_label in reference_of.items():
        if label not in results or reference_label not in results:
            continue
        reference, run = results[reference_label], results[label]
        for i, (want, got) in enumerate(zip(reference.generations, run.generations, strict=True)):
            failures += compare_tokens(f"{label}: prompt {i}", reference_label, want, got)
            missing = [k for k in spec_keys if k not in got.meta]
            if missing:
                failures.append(f"{label}: prompt {i}: sglang's meta_info lacks {missing}")
    return failures


def compare_tokens(what: str, reference_label: str, want, got) -> list[str]:
    """A failure if ``got``'s output ids are not exactly ``want``'s."""
    if got.output_ids == want.output_ids:
        return []
    first = first_difference(want.output_ids, got.output_ids)
    return [
        f"{what} differs from the {reference_label} run from token {first} on "
        f"({got.output_ids[first : first + 8]} vs {want.output_ids[first : first + 8]})"
    ]


def first_difference(want: list[int], got: list[int]) -> int:
    """The index of the first token where ``got`` leaves ``want``."""
    for index, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return index
    return min(len(want), len(got))


def check_logs(results: dict, draft_folder: str, expect_fix: bool = True) -> list[str]:
    """The fix acted exactly where it should (the plugin's line, or the branch's; with TP, in
    every rank; nowhere in a launch form whose draft sglang builds quantized,
    ``expect_fix=False``), and the CPU tree shim took effect in every speculative server."""
    fixed = fixed_label(results)
    rule = PLUGIN_LINE if fixed == "plugin" else BRANCH_LINE
    failures = []
    lines = {label: rule.findall(_log(r)) for label, r in results.items()}
    naming = [m for m in lines[fixed] if os.path.abspath(m[1]) == draft_folder]
    ranks = results[fixed].run.tp_size
    if not expect_fix:
        if lines[fixed]:
            failures.append(
                f"{fixed}: the draft is built quantized in this form, yet the fix dequantized "
                f"something: {lines[fixed]}"
            )
    elif len(naming) < ranks:
        failures.append(
            f"{fixed}: {len(naming)} {'plugin' if fixed == 'plugin' else 'feature-branch'} "
            f"line(s) naming {draft_folder} in {results[fixed].log_path}, one per rank "
            f"expected ({ranks}; found {lines[fixed]})"
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
    for label, result in results.items():
        if not result.run.speculative:
            continue
        text = _log(result)
        for kernel in TREE_KERNELS:
            if not any(f"{SHIM_MARK} {module}.{kernel}" in text for module in TREE_MODULES):
                failures.append(
                    f"{label}: the CPU tree shim did not take effect ('{kernel}' not logged): "
                    "sglang's greedy tree verification would be a silent no-op"
                )
    return failures


def check_shims(results: dict, hybrid: bool = False) -> list[str]:
    """The NPU stand-ins announced themselves in every server given ModelSlim quantization,
    and (``hybrid``) every GDN fix its server needs in every server."""
    failures = []
    for label, result in results.items():
        text = _log(result)
        wanted = []
        run = result.run
        if run.target_modelslim or run.draft_built == "modelslim":
            wanted += [f"{SHIM_MARK} {line}" for line in MODELSLIM_SHIM_LINES]
        if run.draft_npu_check:
            wanted.append(f"{SHIM_MARK} {DRAFT_NPU_CHECK_LINE}")
        if hybrid:
            fixes = GDN_FIXES + (GDN_SPECULATIVE_FIXES if run.speculative else ())
            wanted += [f"{SHIM_MARK} gdn fix {fix}:" for fix in fixes]
        missing = [line for line in wanted if line not in text]
        if missing:
            failures.append(
                f"{label}: CPU stand-ins that did not announce themselves in "
                f"{result.log_path}: {missing}"
            )
    return failures


def check_moe_logs(results: dict) -> list[str]:
    """The MoE family's routed experts ran through sglang's FusedMoE layers: the target's in
    every server, the MTP draft's in every speculative one (the site shim logs each layer's
    first call of sglang's expert computation)."""
    failures = []
    for label, result in results.items():
        layers = set(MOE_LINE.findall(_log(result)))
        wanted = [TARGET_MOE] + ([DRAFT_MOE] if result.run.speculative else [])
        for prefix in wanted:
            if not any(layer.startswith(prefix) for layer in layers):
                failures.append(
                    f"{label}: no MoE layer named {prefix}* computed its experts in "
                    f"{result.log_path} (layers seen: {sorted(layers)})"
                )
    return failures


def _same_tokens(results: dict, label: str, other: str) -> bool:
    """Whether runs ``label`` and ``other`` emitted the same tokens (True if either is absent)."""
    if label not in results or other not in results:
        return True
    ids = [[g.output_ids for g in results[x].generations] for x in (label, other)]
    return ids[0] == ids[1]


@dataclass
class Bars:
    """sglang's accept lengths of the speculative runs against the issue's bounds.

    ``ceiling`` is the float draft's run, or without one (a one-folder run with no float
    folder, ``--short``) the draft built quantized (``quantized_draft``, or in a form whose draft
    sglang builds quantized, F2/F4, ``stock`` itself): the run the fixed one must come close to.
    ``stock_broken``: stock sglang builds the form's draft unquantized over the codes (F1/F3,
    the two-folder form), so stock must stay under ``stock_max``; otherwise (F2/F4) stock
    serves the quantized draft and must come close to the ceiling like the fixed run.
    """

    float: float | None
    stock: float
    fixed: float  # the plugin's run, or the feature branch's
    quantized_draft: float | None = None
    fixed_label: str = "plugin"
    float_min: float = FLOAT_MIN
    stock_max: float = STOCK_MAX
    plugin_share_min: float = ACCEPT_SHARE
    #: stock's target served the plugin's target's tokens (else the stock bound says nothing:
    #: stock's draft is then checked against a different, broken target)
    stock_target_same: bool = True
    stock_broken: bool = True

    @classmethod
    def of(cls, results: dict, float_min: float = FLOAT_MIN, stock_broken: bool = True) -> Bars:
        def length(label: str) -> float | None:
            return (results[label].accept_length or 0.0) if label in results else None

        fixed = fixed_label(results)
        return cls(
            float=length("float"),
            stock=length("stock") or 0.0,
            fixed=length(fixed) or 0.0,
            quantized_draft=length("quantized_draft"),
            fixed_label=fixed,
            float_min=float_min,
            stock_target_same=_same_tokens(results, "stock_reference", "reference"),
            stock_broken=stock_broken,
        )

    @property
    def ceiling_label(self) -> str:
        if self.float is not None:
            return "float"
        if self.quantized_draft is not None or self.stock_broken:
            return "quantized_draft"
        return "stock"

    @property
    def ceiling(self) -> float:
        value = {"float": self.float, "quantized_draft": self.quantized_draft}.get(
            self.ceiling_label, self.stock
        )
        assert value is not None, "a run needs a float or a quantized-draft run"
        return value

    def failures(self) -> list[str]:
        out = []
        if self.ceiling < self.float_min:
            out.append(f"{self.ceiling_label} accept length {self.ceiling:.3f} < {self.float_min}")
        if self.stock_broken and self.stock_target_same and self.stock > self.stock_max:
            out.append(f"stock accept length {self.stock:.3f} > {self.stock_max}")
        # the fixed run, and each other run that serves a working draft and is not the ceiling
        checked = [(self.fixed_label, self.fixed)]
        if self.quantized_draft is not None and self.ceiling_label != "quantized_draft":
            checked.append(("quantized_draft", self.quantized_draft))
        if not self.stock_broken and self.ceiling_label != "stock":
            checked.append(("stock", self.stock))
        bound = self.plugin_share_min * self.ceiling
        for label, value in checked:
            if value < bound:
                out.append(
                    f"{label} accept length {value:.3f} < {self.plugin_share_min} x "
                    f"{self.ceiling_label} ({bound:.3f})"
                )
        return out

    def to_json(self) -> dict:
        return asdict(self)
