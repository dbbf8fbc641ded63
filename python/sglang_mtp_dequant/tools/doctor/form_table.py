"""The doctor's answer for every launch form of one checkpoint, and the cheapest that serves.

Usage (``diagnose`` calls both)::

    built = build_as_plugin(report, source, launch, exc)  # stock could not: the plugin's
    answer_every_form(report, doctor_for_launch, path, launch)  # report.forms, .recommended

Why: the form a user types decides how sglang builds the draft (``forms.py``); the doctor asks
sglang for each of them, on the same checkpoint, with the same flags otherwise, and counts the
draft's parameters on the meta build of each. The recommendation is the form whose draft takes
the least memory among those the doctor answers ``ok`` for (it serves right with the plugin).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ...errors import CheckpointFormatError
from ...formats.description import moe_layer_plan, read_description
from ...serving.context import sglang_version
from ..draft_memory import size_text
from ..verdicts import OK
from .forms import (
    FORMS,
    Form,
    built_as_plugin_builds,
    draft_quantization,
    plugin_outcome_for_quantized_draft,
)
from .model import Diagnosis, FormAnswer

if TYPE_CHECKING:
    from ...formats.checkpoint import WeightSource
    from ..dryrun import Built
    from ..launch import Launch


def build_as_plugin(
    report: Diagnosis, source: WeightSource, launch: Launch | None, exc: Exception
) -> Built | None:
    """After stock sglang failed to build the draft with ``exc``: when the launch builds it
    quantized and the description marks draft layers FLOAT, that failure is sglang's start-up
    error (``report.startup_error``), and the draft is built on meta as the plugin builds it;
    or None with the plugin's refusal as a problem. None, nothing said, for any other failure."""
    from ..dryrun import build_meta_draft

    namespace = launch.namespace if launch is not None else None
    quantization = getattr(namespace, "quantization", None)
    given = getattr(namespace, "speculative_draft_model_quantization", None)
    try:
        description = read_description(source.folder).entries
    except CheckpointFormatError:
        return None  # the checkpoint's reading reports it
    if not description or draft_quantization(sglang_version(), quantization, given) is None:
        return None
    outcome = plugin_outcome_for_quantized_draft(description, report.draft_class or "the draft")
    if not outcome.float_layers and not outcome.refused:
        return None
    report.startup_error = f"{type(exc).__name__}: {exc}"
    for layer, why in outcome.refused:
        report.problems.append(
            f"the plugin stops the start-up at {layer} ({why}): one layer cannot be built part "
            f"float, part quantized. What to do: {outcome.way_out()}"
        )
    if not outcome.serves:
        return None
    report.plugin_builds = (
        f"the plugin builds {', '.join(outcome.float_layers)} (described FLOAT) unquantized and "
        "loads their floats as stored; the other layers are sglang's quantized layers"
    )
    return build_meta_draft(source.folder, launch, built_as_plugin_builds(outcome))


def answer_every_form(
    report: Diagnosis,
    diagnose_launch: Callable[[Launch], Diagnosis],
    path: str,
    launch: Launch | None,
) -> None:
    """``report.forms``: the doctor's answer (``diagnose_launch``, the doctor for one launch of
    the same checkpoint) for each form, the user's other flags kept; ``report.recommended``."""
    from ..launch import with_quantization

    device = launch.device if launch is not None else "npu"
    if report.error_kind is not None or report.description_file is None or device != "npu":
        return  # the forms are the launches of a ModelSlim export on NPU
    target_stop = target_startup_stop(read_description(report.folder).entries)
    for form in FORMS:
        answer = diagnose_launch(with_quantization(launch, path, form.flags))
        report.forms.append(_answer(form, answer, target_stop))
    report.recommended = recommend(report.forms)


def target_startup_stop(description: Mapping[str, object]) -> str | None:
    """Why stock sglang stops before any form's draft is built, or None: the target is built
    with ModelSlim in every launch of a ModelSlim export (auto-detected when no flag is given),
    and a target MoE layer with FLOAT experts has no ModelSlim MoE scheme (sglang #34211). The
    plugin's own plan (``float_layers.moe_layer_plan``) names those layers."""
    plan = moe_layer_plan(description)
    stopped = [layer for layer in plan.stock_fails if not layer.startswith("mtp.")]
    if not stopped:
        return None
    return (
        f"does not start: the target's {stopped[0]} is described with FLOAT experts, which "
        "sglang's ModelSlim MoE schemes do not build (sglang #34211), in every form"
    )


def _answer(form: Form, answer: Diagnosis, target_stop: str | None = None) -> FormAnswer:
    if answer.built_quantized:
        built = f"quantized ({answer.built_quantized})"
        if answer.plugin_builds:
            built += " with the FLOAT layers unquantized by the plugin"
    elif answer.draft_class and answer.draft_bytes is not None:
        built = f"unquantized ({answer.draft_dtype})"
    else:
        built = "not built here"
    return FormAnswer(
        key=form.key,
        label=form.label,
        flags=" ".join(form.flags),
        built=built,
        stock=target_stop or answer.stock_outcome or "-",
        stock_serves=False if target_stop else answer.stock_serves,
        plugin=f"{answer.verdict} - {answer.reason}",
        plugin_serves=answer.verdict == OK,
        draft_bytes=answer.draft_bytes,
    )


def recommend(answers: list[FormAnswer]) -> str:
    """The form(s) with the least draft memory among those that serve right with the plugin,
    and how much less than the largest that serves."""
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
