"""The doctor's result: one row per draft tensor, the whole diagnosis, and its JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..verdicts import DOCTOR_SCHEMA_VERSION, ERROR, INACTIVE, OK, UNCHECKED, UNSUPPORTED

#: version of the JSON layout ``Diagnosis.to_json`` writes (2: resolution, coverage; 3: how
#: sglang builds the draft, the plugin's activation, verdict reasons, the pass action)
SCHEMA_VERSION = DOCTOR_SCHEMA_VERSION


@dataclass
class TensorRow:
    """One draft tensor in the doctor's report."""

    name: str
    dtype: str
    shape: list[int]
    description: str | None
    scheme: str | None
    companions: list[str]
    action: str  # dequantize | keep | pass | error
    reason: str
    stock: str
    problem: str = ""  # the short form of an error reason, for the table
    hint: str = ""  # what to do about an error, for the grouped notes under the table
    codes: bool = False  # the header's dtype holds codes (TensorInfo.holds_codes)
    format: str | None = None  # a foreign format (compressed-tensors, ModelOpt), if any

    def to_json(self) -> dict[str, Any]:
        """Every field but those of the text table alone."""
        return {k: v for k, v in asdict(self).items() if k not in ("problem", "hint", "codes")}


@dataclass
class FormAnswer:
    """The doctor's answer for one launch form (``forms.FORMS``) of the same checkpoint."""

    key: str  # F1 .. F4
    label: str  # how users call it
    flags: str  # the quantization flags it is
    built: str  # how sglang builds the draft: "unquantized (bfloat16)", "quantized (modelslim)"
    stock: str  # what stock sglang does, short: "serves right", "does not start (...)", ...
    stock_serves: bool | None
    plugin: str  # the doctor's verdict line for that launch, with the plugin
    plugin_serves: bool
    #: the draft's own parameters on one rank (less the embedding and lm_head), meta build
    draft_bytes: int | None

    def line(self) -> str:
        from ..draft_memory import size_text

        size = (
            "-"
            if self.draft_bytes is None
            else f"{size_text(self.draft_bytes)} ({self.draft_bytes:,} B)"
        )
        return (
            f"{self.key} {self.label}: draft built {self.built}; stock: {self.stock}; "
            f"with the plugin: {self.plugin}; draft parameters {size}"
        )


@dataclass
class Diagnosis:
    """The doctor's whole answer for one checkpoint."""

    requested: str
    folder: str = ""
    resolved_by: str = ""
    architecture: str | None = None
    draft_class: str | None = None  # the class sglang builds (or would, from the architecture)
    hooked_by: str | None = None  # the hooked class whose load_weights runs for it
    hooked: bool = False
    draft_dtype: str | None = None  # from config.json or the dry run; never guessed
    #: sglang's draft ModelConfig quantization, and what the built class keeps
    draft_quantization: str | None = None
    built_quantized: str | None = None
    built: str = ""  # how sglang builds the draft, one sentence
    launch: str = ""  # for which launch (flags, platform stood in) the answer was asked
    form: str = ""  # the launch's form (``forms.FORMS``), e.g. "F2 (--quantization modelslim)"
    #: sglang's own error when stock sglang cannot build the draft for this launch (its start-up
    #: stops there, e.g. a FLOAT MoE layer in a ModelSlim build: sglang #34211)
    startup_error: str = ""
    #: the short form of ``stock``, and whether stock sglang serves this draft right
    stock_outcome: str = ""
    stock_serves: bool | None = None
    #: what the plugin builds differently from stock (a draft built quantized with FLOAT layers)
    plugin_builds: str = ""
    #: the draft's own parameters on this rank (less the embedding and lm_head), meta build
    draft_bytes: int | None = None
    forms: list[FormAnswer] = field(default_factory=list)  # every form, for the same checkpoint
    recommended: str = ""  # the form with the least draft memory that serves right
    plugin_acts: bool = False
    plugin_active: bool | None = None  # sglang would load the plugin here (None: not asked)
    plugin_activation: str = ""
    error_kind: str | None = None  # an input error (tools/preflight.KINDS)
    unchecked: list[str] = field(default_factory=list)  # what could not be checked, and why
    unsupported: str = ""
    inactive: str = ""
    description_file: str | None = None
    files: int = 0
    stock: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tensors: list[TensorRow] = field(default_factory=list)
    #: from the dry run: parameter -> the parts no checkpoint tensor fills; names it skips
    unfilled: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    dry_run: str = ""  # which class was dry-run, or why none was
    #: the tensors and files the draft load walks, stock and with the plugin (``Walk.to_json``)
    walk: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        if self.problems or self.unfilled or any(t.action == "error" for t in self.tensors):
            return ERROR
        if self.inactive:
            return INACTIVE
        if self.unsupported:
            return UNSUPPORTED
        if self.unchecked:
            return UNCHECKED
        return OK

    @property
    def reason(self) -> str:
        """Why the verdict is what it is, in one line."""
        verdict = self.verdict
        if verdict == ERROR:
            return "this draft cannot be served as it is (see the problems above)"
        if verdict == INACTIVE:
            return self.inactive
        if verdict == UNSUPPORTED:
            return self.unsupported
        if verdict == UNCHECKED:
            return "nothing wrong found, but not checked: " + "; ".join(self.unchecked)
        if self.built_quantized and self.plugin_builds:
            decoded = [t.name for t in self.tensors if t.action == "dequantize"]
            also = f"; it decodes {', '.join(decoded)} (a plain nn.Linear)" if decoded else ""
            return f"{self.plugin_builds}{also}; every parameter is filled"
        if self.built_quantized:
            decoded = [t.name for t in self.tensors if t.action == "dequantize"]
            if decoded:
                return (
                    f"sglang builds the draft quantized ({self.built_quantized}) and loads its "
                    f"quantized layers itself; the plugin decodes {', '.join(decoded)} (a plain "
                    "nn.Linear no quantization method reads) and every parameter is filled"
                )
            return (
                f"sglang builds the draft quantized ({self.built_quantized}) and fills every "
                "parameter itself; the plugin only checks the load"
            )
        if any(t.action == "dequantize" for t in self.tensors):
            return "the plugin loads this draft as correct float weights"
        return "the draft is float already; the plugin changes nothing"

    def counts(self) -> dict[str, int]:
        out = {"dequantize": 0, "keep": 0, "pass": 0, "error": 0}
        for row in self.tensors:
            out[row.action] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "reason": self.reason,
            "error_kind": self.error_kind,
            "requested": self.requested,
            "folder": self.folder or None,
            "resolved_by": self.resolved_by or None,
            "architecture": self.architecture,
            "draft_class": self.draft_class,
            "hooked_by": self.hooked_by,
            "hooked": self.hooked,
            "draft_dtype": self.draft_dtype,
            "draft_quantization": self.draft_quantization,
            "built_quantized": self.built_quantized,
            "built": self.built,
            "launch": self.launch,
            "form": self.form or None,
            "startup_error": self.startup_error or None,
            "stock_serves": self.stock_serves,
            "stock_outcome": self.stock_outcome or None,
            "plugin_builds": self.plugin_builds or None,
            "draft_parameter_bytes": self.draft_bytes,
            "forms": [asdict(answer) for answer in self.forms],
            "recommended": self.recommended or None,
            "plugin_acts": self.plugin_acts,
            "plugin_active": self.plugin_active,
            "plugin_activation": self.plugin_activation,
            "unchecked": self.unchecked,
            "description_file": self.description_file,
            "safetensors_files": self.files,
            "counts": self.counts(),
            "stock_sglang": self.stock,
            "dry_run": self.dry_run,
            "draft_load_walk": self.walk,
            "unfilled_parameters": self.unfilled,
            "skipped_names": self.skipped,
            "problems": self.problems,
            "notes": self.notes,
            "tensors": [t.to_json() for t in self.tensors],
        }
