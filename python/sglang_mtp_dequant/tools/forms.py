"""The four launch forms users type for a ModelSlim checkpoint's MTP draft, and sglang's rule.

Usage::

    FORMS["F2"].flags                           # ("--quantization", "modelslim")
    form_of(args.quantization, args.speculative_draft_model_quantization)   # Form F1 .. F4
    draft_quantization(None, "modelslim")       # "modelslim": sglang builds the draft quantized
    why_built("0.5.17", "modelslim", None)      # where sglang took that from, file:line

Why one home: the doctor, the server harness (``e2e/``) and the benchmarks each launch or answer
the forms. F1 flagless and F3 ``unquant`` build the draft unquantized, F2 and F4 quantized
(``draft_quantization``; where each release applies it: ``RULES``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QUANTIZATION = "--quantization"
DRAFT_QUANTIZATION = "--speculative-draft-model-quantization"
MODELSLIM = "modelslim"
UNQUANT = "unquant"


@dataclass(frozen=True)
class Form:
    """One way to launch: its key and its two quantization flags as given (None: absent)."""

    key: str
    quantization: str | None
    draft: str | None
    label: str  # how users call it

    @property
    def flags(self) -> tuple[str, ...]:
        given = ((QUANTIZATION, self.quantization), (DRAFT_QUANTIZATION, self.draft))
        return tuple(word for flag, value in given if value is not None for word in (flag, value))

    @property
    def draft_built(self) -> str | None:
        """The quantization sglang builds the draft with in this form (None: unquantized)."""
        return draft_quantization(self.quantization, self.draft)


FORMS = {
    form.key: form
    for form in (
        Form("F1", None, None, "flagless"),
        Form("F2", MODELSLIM, None, f"{QUANTIZATION} {MODELSLIM}"),
        Form("F3", None, UNQUANT, f"{DRAFT_QUANTIZATION} {UNQUANT}"),
        Form("F4", None, MODELSLIM, f"{DRAFT_QUANTIZATION} {MODELSLIM}"),
    )
}


def form_of(quantization: str | None, draft: str | None) -> Form | None:
    """The form of a launch's two quantization flags as given; None for another quantizer's."""
    for form in FORMS.values():
        if (form.quantization, form.draft) == (quantization, draft):
            return form
    return FORMS["F1"] if (quantization, draft) == (UNQUANT, None) else None


def draft_quantization(quantization: str | None, draft: str | None) -> str | None:
    """The quantization sglang builds the draft with: an explicit draft flag, else the target's
    ``--quantization`` (``unquant``: none); ModelSlim is never auto-detected for the draft."""
    chosen = draft if draft is not None else quantization
    return None if chosen in (None, UNQUANT) else chosen


@dataclass(frozen=True)
class ReleaseRule:
    """Where one sglang release applies that rule, read from its wheel."""

    release: str
    draft_default_at: str  # where an unset draft quantization takes the target's
    no_autodetect_at: str  # where the draft's ModelConfig declines ModelSlim auto-detection


#: release -> (file:lines of the copy, model_config.py line of the draft's no-autodetect)
_READ = {
    "0.5.14": ("server_args.py:2800-2801", 1127),
    "0.5.15": ("server_args.py:3036-3037", 1135),
    "0.5.16": ("server_args.py:3412-3413", 1195),
    "0.5.17": ("server_args.py:4081-4082", 1243),
    "0.5.18": ("server_args.py:4281-4282", 1277),
    "0.5.19": ("arg_groups/serving_hook.py:629-634", 1341),
    "0.5.20": ("arg_groups/serving_hook.py:628-633", 1541),
    "0.5.21": ("arg_groups/serving_hook.py:628-633", 1637),
    "0.5.22": ("arg_groups/serving_hook.py:664-669", 1716),
    "0.5.23": ("arg_groups/serving_hook.py:685-690", 1825),
}
RULES = {
    release: ReleaseRule(release, at, f"configs/model_config.py:{line}")
    for release, (at, line) in _READ.items()
}


def rule_for(release: str) -> ReleaseRule:
    """The rule of ``release`` (a release not read: the newest read)."""
    key = ".".join(re.findall(r"\d+", release)[:3])
    return RULES.get(key, RULES[max(RULES, key=lambda r: tuple(map(int, r.split("."))))])


def why_built(release: str, quantization: str | None, draft: str | None) -> str:
    """One sentence: where sglang ``release`` took the draft's quantization from."""
    rule = rule_for(release)
    if draft is not None:
        return f"{DRAFT_QUANTIZATION} {draft} given"
    if quantization not in (None, UNQUANT):
        return (
            f"{QUANTIZATION} {quantization} copied to the unset draft quantization "
            f"(sglang {rule.release} {rule.draft_default_at})"
        )
    return (
        f"no quantization flag: ModelSlim is auto-detected for the target only, never for the "
        f"draft (sglang {rule.release} {rule.no_autodetect_at})"
    )
