"""The doctor's result: one row per draft tensor, the whole diagnosis, and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: version of the JSON layout ``Diagnosis.to_json`` writes (2: resolution, coverage)
SCHEMA_VERSION = 2


@dataclass
class TensorRow:
    """One draft tensor in the doctor's report."""

    name: str
    dtype: str
    shape: list[int]
    description: str | None
    scheme: str | None
    companions: list[str]
    action: str  # dequantize | keep | error
    reason: str
    stock: str
    problem: str = ""  # the short form of an error reason, for the table
    hint: str = ""  # what to do about an error, for the grouped notes under the table
    codes: bool = False  # the header's dtype holds codes (TensorInfo.holds_codes)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": self.shape,
            "description": self.description,
            "scheme": self.scheme,
            "companions": self.companions,
            "action": self.action,
            "reason": self.reason,
            "stock": self.stock,
        }


@dataclass
class Diagnosis:
    """The doctor's whole answer for one checkpoint."""

    requested: str
    folder: str = ""
    resolved_by: str = ""
    architecture: str | None = None
    draft_class: str | None = None
    hooked: bool = False
    draft_dtype: str = "bfloat16"
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

    @property
    def verdict(self) -> str:
        if self.problems or self.unfilled or any(t.action == "error" for t in self.tensors):
            return "error"
        return "ok"

    def counts(self) -> dict[str, int]:
        out = {"dequantize": 0, "keep": 0, "error": 0}
        for row in self.tensors:
            out[row.action] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "requested": self.requested,
            "folder": self.folder,
            "resolved_by": self.resolved_by,
            "architecture": self.architecture,
            "draft_class": self.draft_class,
            "hooked": self.hooked,
            "draft_dtype": self.draft_dtype,
            "description_file": self.description_file,
            "safetensors_files": self.files,
            "counts": self.counts(),
            "stock_sglang": self.stock,
            "dry_run": self.dry_run,
            "unfilled_parameters": self.unfilled,
            "skipped_names": self.skipped,
            "problems": self.problems,
            "notes": self.notes,
            "tensors": [t.to_json() for t in self.tensors],
        }
