"""The doctor's result: one row per draft tensor, the whole diagnosis, and its JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...serving.float_layers import DRAFT_WAY_OUT
from ..verdicts import DOCTOR_SCHEMA_VERSION, ERROR, INACTIVE, OK, UNCHECKED, UNSUPPORTED

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
    plugin: str  # the same with the plugin: "serves right", "error: ...", ...
    plugin_serves: bool
    target: str  # the target's cell ("": nothing wrong with the target)
    draft_bytes: int | None  # ``Diagnosis.draft_bytes``
    vocab_bytes: int | None = None
    stock_error: str = ""  # sglang's own error quoted in ``stock``, if any

    def line(self, said: dict[str, str]) -> str:
        """The table line; an error already quoted (``said``: text -> where) is named."""
        stock = self.stock
        if self.stock_error in said:
            stock = stock.replace(self.stock_error, f"as {said[self.stock_error]}")
        elif self.stock_error:
            said[self.stock_error] = self.key
            stock = stock.replace(self.stock_error, clip(self.stock_error, 200))
        cells = [f"draft built {self.built}", f"stock: {stock}", f"with the plugin: {self.plugin}"]
        if self.target:
            cells.append(f"target: {self.target}")
        if self.draft_bytes is not None:
            from ..draft_memory import size_text

            held = self.draft_bytes + (self.vocab_bytes or 0)
            cells.append(
                f"draft per rank: {size_text(self.draft_bytes)} ({self.draft_bytes:,} B) with "
                f"the plugin, {size_text(held)} stock"
            )
        return f"{self.key} {self.label}: " + "; ".join(cells)


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
    draft_quantization: str | None = None
    built_quantized: str | None = None
    built: str = ""  # how sglang builds the draft, one sentence
    launch: str = ""  # for which launch (flags, platform stood in) the answer was asked
    form: str = ""  # the launch's form (``forms.FORMS``), e.g. "F2 (--quantization modelslim)"
    #: sglang's own error where stock cannot build the draft, and where its loader stops
    startup_error: str = ""
    stock_loader_error: str = ""
    #: float parameters stock sglang's load leaves unwritten or fills with raw codes
    stock_garbage: list[str] = field(default_factory=list)
    target_stop: str = ""  # why stock stops at the target in every form (FLOAT experts)
    target_garbage: str = ""  # how many target layers stock loads as raw codes
    target: str = ""  # the target's cell of the form table ("": nothing wrong with it)
    stock_outcome: str = ""  # the short form of ``stock``
    stock_serves: bool | None = None
    plugin_builds: str = ""  # what the plugin builds differently (FLOAT MoE layers)
    #: the draft's own parameters on this rank (less the embedding and lm_head, the target's),
    #: and the vocab-sized copies stock holds besides
    draft_bytes: int | None = None
    vocab_bytes: int | None = None
    forms: list[FormAnswer] = field(default_factory=list)  # every form, for the same checkpoint
    recommended: str = ""  # the form with the least draft memory that serves right
    plugin_acts: bool = False
    plugin_active: bool | None = None  # sglang would load the plugin here (None: not asked)
    plugin_activation: str = ""
    error_kind: str | None = None  # an input error's kind (``InputError.kind``)
    unchecked: list[str] = field(default_factory=list)  # what could not be checked, and why
    unsupported: str = ""
    inactive: str = ""
    description_file: str | None = None
    files: int = 0
    stock: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tensors: list[TensorRow] = field(default_factory=list)
    #: from the dry run: parameter -> the parts nothing fills; names it skips
    unfilled: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    dry_run: str = ""  # which class was dry-run, or why none was
    walk: dict[str, Any] | None = None

    @property
    def stock_error(self) -> str:
        """sglang's own error the stock answer quotes, if any."""
        return "" if self.target_stop else (self.startup_error or self.stock_loader_error)

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
        if verdict in (INACTIVE, UNSUPPORTED):
            return self.inactive or self.unsupported
        if verdict == UNCHECKED:
            return "nothing wrong found, but not checked: " + "; ".join(self.unchecked)
        decoded = [t.name for t in self.tensors if t.action == "dequantize"]
        if not self.built_quantized:
            if decoded:
                return "the plugin loads this draft as correct float weights"
            return "the draft is float already; the plugin changes nothing"
        said = self.plugin_builds or (
            f"sglang builds the draft quantized ({self.built_quantized}) and loads the layers "
            "it quantizes itself"
        )
        if decoded:
            return (
                f"{said}; the plugin decodes {', '.join(decoded)} (layers it builds "
                "unquantized: no quantization method reads their codes) and every parameter is "
                "filled"
            )
        return f"{said}; every parameter is filled, the plugin only checks the load"

    @property
    def plugin_outcome(self) -> str:
        """The short form of the verdict, for a form-table cell."""
        verdict = self.verdict
        if verdict == OK:
            return "serves right"
        why = (self.problems or [f"{len(self.unfilled)} parameter(s) unfilled"])[0]
        if verdict != ERROR:
            why = self.inactive or self.unsupported or "; ".join(self.unchecked)
        elif any(t.action == "error" for t in self.tensors):
            why = next(t.problem or t.reason for t in self.tensors if t.action == "error")
        return f"{verdict} ({clip(why.replace(f': {DRAFT_WAY_OUT}', ''), 160)})"

    def counts(self) -> dict[str, int]:
        out = {"dequantize": 0, "keep": 0, "pass": 0, "error": 0}
        for row in self.tensors:
            out[row.action] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        """Every field (an empty text as null)."""
        fields = {JSON_NAMES.get(k, k): v for k, v in vars(self).items() if k != "tensors"}
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "reason": self.reason,
            "plugin_outcome": self.plugin_outcome,
            **{k: (None if v == "" else v) for k, v in fields.items()},
            "forms": [asdict(answer) for answer in self.forms],
            "counts": self.counts(),
            "tensors": [t.to_json() for t in self.tensors],
        }


#: the JSON names of the fields whose attribute names differ
JSON_NAMES = {
    "walk": "draft_load_walk",
    "unfilled": "unfilled_parameters",
    "skipped": "skipped_names",
    "draft_bytes": "draft_parameter_bytes",
    "vocab_bytes": "vocab_copy_bytes",
    "stock": "stock_sglang",
    "files": "safetensors_files",
}


def clip(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters (the whole of it stays in ``--json``)."""
    return text if len(text) <= most else text[: most - 5].rstrip() + " ..."
