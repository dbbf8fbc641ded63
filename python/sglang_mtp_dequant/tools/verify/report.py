"""``verify``'s result: one row per draft parameter, the problems, the verdict and its JSON.

Made by ``run.run_verify``, rendered as text by ``render.render_verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..verdicts import ERROR, INACTIVE, OK, UNCHECKED, UNSUPPORTED, VERIFY_SCHEMA_VERSION

#: checks that pass: bit for bit, or (formats decoded by a library whose rounding differs from
#: the format's own formula by design) within one ulp of the draft dtype
PASSED = ("exact", "ulp")


@dataclass
class ParamRow:
    """One draft parameter, as stock sglang, the reference and the plugin loaded it."""

    parameter: str
    sources: list[str]
    quantized: bool = False  # fed by codes the plugin decodes
    stock_absmax: float | None = None
    plugin_absmax: float | None = None
    check: str = "unchecked"  # exact | ulp (see PASSED) | mismatch | unchecked
    why: str = ""  # why unchecked
    max_error: float | None = None  # max |plugin - reference| in fp32
    reference_absmax: float | None = None
    stock_reference_error: float | None = None
    plugin_reference_error: float | None = None

    def compare(self, got: torch.Tensor, want: torch.Tensor) -> None:
        """``max_error`` and ``check`` of ``got`` (the plugin's load) against ``want`` (the
        reference load's)."""
        self.max_error = float((got.float() - want.float()).abs().nan_to_num(float("inf")).max())
        self.check = "exact" if torch.equal(got, want) else "mismatch"


@dataclass
class VerifyReport:
    """One ``verify`` run: what was resolved and built, the rows, what stopped a load."""

    requested: str
    folder: str = ""
    resolved_by: str = ""
    class_name: str = "?"
    dtype: str | None = None
    estimated_bytes: int = 0
    shared_bytes: int = 0
    files_streamed: list[str] = field(default_factory=list)
    files_total: int = 0
    reference: str | None = None
    rows: list[ParamRow] = field(default_factory=list)
    stock_error: str | None = None
    plugin_error: str | None = None
    problems: list[str] = field(default_factory=list)
    launch: str = ""  # for which launch (flags, platform stood in) it was asked
    built_quantized: str | None = None  # the quantization the draft was built with
    unsupported: str = ""  # the class sglang builds is not one the plugin hooks
    inactive: str = ""  # sglang's load_plugins() did not install the plugin's hook
    notes: list[str] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return sum(r.check in PASSED for r in self.rows)

    @property
    def mismatched(self) -> list[ParamRow]:
        return [r for r in self.rows if r.check == "mismatch"]

    @property
    def verdict(self) -> str:
        if self.problems or self.plugin_error or self.mismatched:
            return ERROR
        if self.inactive:
            return INACTIVE
        if self.unsupported:
            return UNSUPPORTED
        if self.checked == 0 or any(r.quantized and r.check not in PASSED for r in self.rows):
            return UNCHECKED
        return OK

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    @property
    def reason(self) -> str:
        quantized = [r for r in self.rows if r.quantized]
        verdict = self.verdict
        if verdict == OK:
            close = sum(r.check == "ulp" for r in self.rows)
            within = (
                f"; {close} of them within 1 ulp, compressed-tensors' rounding of a format it "
                "converts"
                if close
                else ""
            )
            target = sum(r.parameter.startswith("target ") for r in self.rows)
            what = f"draft and {target} target parameters" if target else "draft parameters"
            return (
                f"{self.checked - close - target} {what} equal the reference bit for bit "
                f"({len(quantized)} decoded from codes{within})"
                if close
                else f"{self.checked - target} {what} equal the reference bit for bit "
                f"({len(quantized)} of them decoded from codes)"
            )
        if verdict == ERROR:
            if self.problems and not self.rows:
                return self.problems[0]
            return "the plugin did not produce a correct draft (see above)"
        if verdict == INACTIVE:
            return self.inactive
        if verdict == UNSUPPORTED:
            return self.unsupported
        if self.checked == 0:
            return "no draft parameter could be checked"
        unchecked = [r.parameter for r in quantized if r.check not in PASSED]
        return (
            f"{len(unchecked)} parameter(s) decoded from codes could not be compared (e.g. "
            f"{unchecked[0]}: {next(r.why for r in quantized if r.check not in PASSED)})"
        )

    def to_json(self) -> dict:
        return {
            "schema_version": VERIFY_SCHEMA_VERSION,
            "verdict": self.verdict,
            "reason": self.reason,
            "requested": self.requested,
            "folder": self.folder or None,
            "resolved_by": self.resolved_by or None,
            "draft_class": self.class_name if self.class_name != "?" else None,
            "draft_dtype": self.dtype,
            "launch": self.launch,
            "built_quantized": self.built_quantized,
            "estimated_bytes": self.estimated_bytes,
            "shared_bytes": self.shared_bytes,
            "files_streamed": self.files_streamed,
            "files_total": self.files_total,
            "reference": self.reference,
            "stock_error": self.stock_error,
            "plugin_error": self.plugin_error,
            "problems": self.problems,
            "notes": self.notes,
            "parameters": [asdict(r) for r in self.rows],
        }
