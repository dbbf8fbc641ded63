"""The doctor's answer for every launch form of one checkpoint, and the cheapest that serves.

Usage (``diagnose`` calls it)::

    answer_every_form(report, doctor_for_launch, path, launch)   # report.forms, .recommended

Why: the form a user types decides how sglang builds the draft (``forms.py``); the doctor asks
sglang for each, with the user's other flags, and recommends the one whose draft takes the least
memory among those the plugin serves right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..draft_memory import size_text
from ..forms import FORMS, Form, form_of
from ..verdicts import OK
from .model import Diagnosis, FormAnswer

if TYPE_CHECKING:
    from ..launch import Launch


def answer_every_form(
    report: Diagnosis,
    diagnose_launch: Callable[[Launch], Diagnosis],
    path: str,
    launch: Launch | None,
) -> None:
    """``report.forms`` (``diagnose_launch``: the doctor for one launch of the same checkpoint)
    and ``report.recommended``, for a ModelSlim export on NPU."""
    from ..launch import with_quantization

    device = launch.device if launch is not None else "npu"
    if report.error_kind is not None or report.description_file is None or device != "npu":
        return
    namespace = launch.namespace if launch is not None else None
    own = form_of(
        getattr(namespace, "quantization", None),
        getattr(namespace, "speculative_draft_model_quantization", None),
    )
    for form in FORMS.values():
        answer = report
        if form is not own:
            answer = diagnose_launch(with_quantization(launch, path, form.flags))
        report.forms.append(_answer(form, answer))
    report.recommended = recommend(report.forms)


def _answer(form: Form, answer: Diagnosis) -> FormAnswer:
    if answer.built_quantized:
        built = f"quantized ({answer.built_quantized})"
        if answer.plugin_builds:
            built += ", its FLOAT MoE layers unquantized by the plugin"
    elif answer.draft_class and answer.draft_bytes is not None:
        built = f"unquantized ({answer.draft_dtype})"
    else:
        built = "not built (its start-up stops)" if answer.startup_error else "not built here"
    return FormAnswer(
        key=form.key,
        label=form.label,
        flags=" ".join(form.flags),
        built=built,
        stock=answer.stock_outcome or "-",
        stock_serves=answer.stock_serves,
        plugin=answer.plugin_outcome,
        plugin_serves=answer.verdict == OK,
        target=answer.target,
        draft_bytes=answer.draft_bytes,
        vocab_bytes=answer.vocab_bytes,
        stock_error=answer.stock_error,
    )


def recommend(answers: list[FormAnswer]) -> str:
    """The form(s) with the least draft memory the plugin serves right, and how much less."""
    serving = [a for a in answers if a.plugin_serves and a.draft_bytes is not None]
    if not serving:
        return "none: no form serves this checkpoint right (see the forms above)"
    least = min(a.draft_bytes or 0 for a in serving)
    most = max(a.draft_bytes or 0 for a in serving)
    best = " or ".join(
        f"{a.key} ({a.flags or 'no quantization flag'})" for a in serving if a.draft_bytes == least
    )
    said = (
        f"{best}: the least draft memory that serves right, {size_text(least)} "
        f"({least:,} B) per rank"
    )
    if most == least:
        return f"{said}; every form that serves takes the same"
    heavy = "/".join(a.key for a in serving if a.draft_bytes == most)
    saved = most - least
    return (
        f"{said}: {size_text(saved)} ({saved:,} B, {100 * saved / most:.1f}%) less than "
        f"{heavy} ({size_text(most)}, {most:,} B)"
    )
