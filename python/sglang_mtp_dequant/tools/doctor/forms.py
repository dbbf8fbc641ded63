"""The four launch forms users type for a ModelSlim checkpoint's MTP draft, and sglang's rule.

Usage::

    form = form_of(args.quantization, args.speculative_draft_model_quantization)  # F1 .. F4
    draft_quantization("0.5.23", "modelslim", None)        # "modelslim": built quantized
    rule_for("0.5.17").draft_default_at                    # "server_args.py:4081-4082"
    outcome = plugin_outcome_for_quantized_draft(description, "Qwen3_5ForCausalLMMTP")

Why: the forms build the draft differently (issue 45). On sglang 0.5.14 to 0.5.23 an unset
``--speculative-draft-model-quantization`` takes the target's ``--quantization`` and the
draft's ``ModelConfig`` never auto-detects ModelSlim (each release's wheel read: ``RULES``):
F1 flagless and F3 ``unquant`` build it unquantized, F2 ``--quantization modelslim`` and F4
draft ``modelslim`` quantized. The doctor builds the draft with the installed sglang for the
user's flags (that is the answer); the table says why, per release.

``plugin_outcome_for_quantized_draft`` is the plugin's contract for F2 / F4 when the description
marks layers FLOAT (built unquantized, loaded as stored; a layer part FLOAT stops the start-up
naming it and the form that works), from the description alone: for MoE layers it is the
serving hook's own plan (``serving/float_layers.py``), so the doctor and the server agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...formats.description import EXPERT_ENTRY, FLOAT, moe_layer_plan

QUANTIZATION = "--quantization"
DRAFT_QUANTIZATION = "--speculative-draft-model-quantization"


@dataclass(frozen=True)
class Form:
    """One way to launch: its key, the quantization flags it is, and how users call it."""

    key: str
    flags: tuple[str, ...]
    label: str


FORMS = (
    Form("F1", (), "flagless (ModelSlim auto-detected for the target)"),
    Form("F2", (QUANTIZATION, "modelslim"), "--quantization modelslim"),
    Form("F3", (DRAFT_QUANTIZATION, "unquant"), "--speculative-draft-model-quantization unquant"),
    Form(
        "F4", (DRAFT_QUANTIZATION, "modelslim"), "--speculative-draft-model-quantization modelslim"
    ),
)
BY_KEY = {form.key: form for form in FORMS}
#: the forms whose draft sglang builds unquantized (bf16) and the plugin dequantizes
UNQUANTIZED_FORMS = ("F1", "F3")


def form_of(quantization: str | None, draft: str | None) -> Form | None:
    """The form of a launch's two quantization flags (as given, before sglang resolves them);
    None for any other quantization (another quantizer's launch)."""
    if draft == "unquant":
        return BY_KEY["F3"]
    if draft == "modelslim":
        return BY_KEY["F4"]
    if draft is None and quantization == "modelslim":
        return BY_KEY["F2"]
    if draft is None and quantization in (None, "unquant"):
        return BY_KEY["F1"]
    return None


@dataclass(frozen=True)
class ReleaseRule:
    """What one sglang release does with the draft's quantization, read from its wheel."""

    release: str
    #: where an unset draft quantization is given the target's --quantization
    draft_default_at: str
    #: where the draft's ModelConfig declines ModelSlim auto-detection
    no_autodetect_at: str
    #: what a ModelSlim build does with a MoE layer whose experts the description marks FLOAT
    float_moe: str


_VALUE_ERROR = (
    "ValueError: Unsupported ModelSlim MoE schemes for layer <layer>: W13='FLOAT', W2='FLOAT' "
    "(modelslim.py get_moe_scheme)"
)
_NONE_SCHEME = (
    "WARNING Unsupported FusedMoe modelslim scheme, then AttributeError: 'NoneType' object has "
    "no attribute 'create_weights' (modelslim.py get_moe_scheme returns None)"
)
#: release -> (file:line of the copy, model_config.py line of the draft's no-autodetect, FLOAT MoE)
_READ = {
    "0.5.14": ("server_args.py:2800-2801", 1127, _NONE_SCHEME),
    "0.5.15": ("server_args.py:3036-3037", 1135, _NONE_SCHEME),
    "0.5.16": ("server_args.py:3412-3413", 1195, _VALUE_ERROR),
    "0.5.17": ("server_args.py:4081-4082", 1243, _VALUE_ERROR),
    "0.5.18": ("server_args.py:4281-4282", 1277, _VALUE_ERROR),
    "0.5.19": ("arg_groups/serving_hook.py:629-634", 1341, _VALUE_ERROR),
    "0.5.20": ("arg_groups/serving_hook.py:628-633", 1541, _VALUE_ERROR),
    "0.5.21": ("arg_groups/serving_hook.py:628-633", 1637, _VALUE_ERROR),
    "0.5.22": ("arg_groups/serving_hook.py:664-669", 1716, _VALUE_ERROR),
    "0.5.23": ("arg_groups/serving_hook.py:685-690", 1825, _VALUE_ERROR),
}
RULES = {
    release: ReleaseRule(release, at, f"configs/model_config.py:{line}", float_moe)
    for release, (at, line, float_moe) in _READ.items()
}
NEWEST_READ = "0.5.23"


def rule_for(release: str) -> ReleaseRule:
    """The rule of ``release`` (a newer one: the newest read, and ``read`` says it was not)."""
    numbers = tuple(int(p) for p in re.findall(r"\d+", release)[:3])
    key = ".".join(str(n) for n in numbers)
    return RULES.get(key, RULES[NEWEST_READ])


def rule_was_read(release: str) -> bool:
    numbers = re.findall(r"\d+", release)[:3]
    return ".".join(numbers) in RULES


def draft_quantization(release: str, quantization: str | None, draft: str | None) -> str | None:
    """The quantization sglang ``release`` builds the draft with for the two flags as given:
    an explicit draft flag wins (``unquant`` is none), else the target's ``--quantization``
    (``unquant`` is none); ModelSlim is never auto-detected for the draft. Identical in every
    release read (``RULES``): the rule's place moved, not its meaning."""
    rule_for(release)  # a release outside the table answers as the newest read
    chosen = draft if draft is not None else quantization
    return None if chosen in (None, "unquant") else chosen


def why_built(release: str, quantization: str | None, draft: str | None) -> str:
    """One sentence: where sglang ``release`` took the draft's quantization from."""
    rule = rule_for(release)
    if draft is not None:
        return f"{DRAFT_QUANTIZATION} {draft} given"
    if quantization not in (None, "unquant"):
        return (
            f"{QUANTIZATION} {quantization} copied to the unset draft quantization "
            f"(sglang {rule.release} {rule.draft_default_at})"
        )
    return (
        f"no quantization flag: ModelSlim is auto-detected for the target only, never for the "
        f"draft (sglang {rule.release} {rule.no_autodetect_at})"
    )


# -- the plugin's contract for a draft built quantized (F2 / F4) ------------------------------

_PROJ = re.compile(r"^(?P<module>.+)\.(?P<proj>q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$")


@dataclass(frozen=True)
class QuantizedDraftOutcome:
    """What the plugin does with a draft sglang builds quantized (F2 / F4)."""

    #: MoE layers (description prefix) all FLOAT: built unquantized, loaded as floats
    float_layers: tuple[str, ...] = ()
    #: layer -> why it cannot be built right (part FLOAT, part quantized): start-up stops
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def serves(self) -> bool:
        return not self.refused

    def way_out(self) -> str:
        return (
            f"launch F1 (no quantization flag) or F3 ({DRAFT_QUANTIZATION} unquant): sglang then "
            "builds the draft unquantized and the plugin dequantizes its quantized layers"
        )


def _is_mtp(name: str) -> bool:
    return name.startswith("mtp.")


def plugin_outcome_for_quantized_draft(
    description: Mapping[str, object],
    draft_class: str,
    is_draft: Callable[[str], bool] | None = None,
) -> QuantizedDraftOutcome:
    """What the plugin does with ``draft_class`` built quantized from a checkpoint described by
    ``description``. MoE layers: the serving hook's own decision (``float_layers.moe_layer_plan``,
    the code that runs in the server): all experts FLOAT built unquantized, part FLOAT refused.
    A fused linear (``DEFAULT_PACKED``) part FLOAT, part quantized is refused too (sglang builds one
    method per fused layer). ``is_draft``: which description entries are the draft's (default:
    ``mtp.*``, the Qwen MTP layout; NextN drafts pass their layer's rule)."""
    from ...serving.parameter_names import DEFAULT_PACKED

    wanted = is_draft or _is_mtp
    plan = moe_layer_plan(description)
    float_layers = [layer for layer in plan.built_unquantized if wanted(f"{layer}.")]
    refused = [
        (p.layer, f"{draft_class}: {p.summary()}") for p in plan.refused if wanted(f"{p.layer}.")
    ]
    fused: dict[str, set[str]] = {}
    for name, scheme in description.items():
        proj = _PROJ.match(name) if isinstance(scheme, str) and wanted(name) else None
        if proj and not EXPERT_ENTRY.match(name):
            layer = next(f for f, parts in DEFAULT_PACKED.items() if proj["proj"] in parts)
            fused.setdefault(f"{proj['module']}.{layer}", set()).add(str(scheme))
    for layer, schemes in sorted(fused.items()):
        if FLOAT in schemes and len(schemes) > 1:
            quantized = "/".join(sorted(schemes - {FLOAT}))
            refused.append((layer, f"{draft_class}: part FLOAT, part {quantized}"))
    return QuantizedDraftOutcome(tuple(float_layers), tuple(sorted(refused)))


def built_as_plugin_builds(outcome: QuantizedDraftOutcome) -> Callable[[Any], None]:
    """An ``adjust_quant_config`` (``cpu_sglang.build_draft``) that builds the draft on meta as
    the plugin's contract says: each MoE layer of ``outcome.float_layers`` gets no ModelSlim
    method (``get_quant_method`` answers None, so sglang's ``FusedMoE`` builds its own
    unquantized method, as without a quant config); every other layer is sglang's answer."""

    def adjust(quant_config: Any) -> None:
        original = quant_config.get_quant_method

        def get_quant_method(layer: Any, prefix: str) -> Any:
            if hasattr(layer, "num_experts") and _described_as(quant_config, prefix) in set(
                outcome.float_layers
            ):
                return None
            return original(layer, prefix)

        quant_config.get_quant_method = get_quant_method

    return adjust


def _described_as(quant_config: Any, prefix: str) -> str:
    """The description prefix of the MoE layer sglang builds as ``prefix`` (its own prefix
    resolution, asked for expert 0's first projection)."""
    from ...serving.sglang_private import resolve_quant_prefix

    for first in ("gate_proj", "w1"):
        found = resolve_quant_prefix(quant_config, f"{prefix}.0.{first}")
        if f"{found}.weight" in quant_config.quant_description:
            return found.removesuffix(f".0.{first}")
    return prefix
