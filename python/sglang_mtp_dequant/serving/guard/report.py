"""What the guard found, said so that an operator can act: findings, sources, the error.

Usage::

    finding = Finding("model.layers.0.qkv_proj.weight", torch.bfloat16, (384, 64), evidence,
                      sources=[Source("mtp.layers.0.self_attn.q_proj.weight", torch.int8)])
    raise MisloadedDraftError([finding], "Qwen3_5ForCausalLMMTP", folder="/ckpt")
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ...errors import DraftWeightError
from ...formats.checkpoint import Checkpoint, dtype_name, is_code_dtype
from ...formats.library import DECODED_FORMATS
from ..parameter_names import NameIndex
from .values import CodeEvidence

MODE_ENV = "SGLANG_MTP_DEQUANT_GUARD"


@dataclass(frozen=True)
class Source:
    """One checkpoint tensor that fed a parameter, as it streamed."""

    name: str
    dtype: torch.dtype | None = None
    file: str | None = None
    description_type: str | None = None
    dequantized: bool = False

    def describe(self) -> str:
        facts = []
        if self.dtype is not None:
            facts.append(dtype_name(self.dtype))
        if self.raw_codes:
            facts.append("copied as raw codes")
        if self.description_type:
            facts.append(f"described as {self.description_type}")
        if self.dequantized:
            facts.append("dequantized by the plugin")
        if self.file:
            facts.append(f"in {os.path.basename(self.file)}")
        return f"{self.name} ({', '.join(facts)})" if facts else self.name

    @property
    def raw_codes(self) -> bool:
        """Streamed as integer or float8 codes and handed to sglang as they were."""
        return self.dtype is not None and not self.dequantized and is_code_dtype(self.dtype)


@dataclass
class Finding:
    """One draft parameter the guard refuses: wrong values, or parts nothing wrote."""

    parameter: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    evidence: CodeEvidence | None = None
    unwritten: str | None = None  # which parts sglang's loaders never wrote
    nonfinite_rows: int = 0
    sources: list[Source] = field(default_factory=list)
    #: streamed names meant for this parameter's layer that no loader placed
    meant: list[str] = field(default_factory=list)

    def describe(self) -> str:
        dtype = dtype_name(self.dtype)
        if self.unwritten is not None:
            what = f"never written by sglang's loaders ({self.unwritten})"
        elif self.evidence is not None:
            what = self.evidence.describe()
        elif self.nonfinite_rows:
            what = f"{self.nonfinite_rows} rows hold NaN or inf"
        else:
            what = "loaded from codes that nothing dequantized"
        if self.sources:
            fed = "fed by " + ", ".join(s.describe() for s in self.sources[:6])
            if len(self.sources) > 6:
                fed += f" and {len(self.sources) - 6} more"
        elif self.unwritten is not None and self.meant:
            fed = (
                f"no checkpoint tensor of this name streamed, only {', '.join(self.meant)}, "
                "which sglang's loaders skipped"
            )
        elif self.unwritten is not None:
            fed = "no checkpoint tensor of this name streamed"
        else:
            fed = "checkpoint tensor not identified (no streamed draft name maps to it)"
        return f"{self.parameter} [{dtype} {list(self.shape)}]: {what}; {fed}"


def sources_from_checkpoint(checkpoint: Checkpoint) -> list[Source]:
    """Every tensor a ``Checkpoint`` recorded, from its headers (no stream to ask)."""
    return [
        Source(info.name, info.dtype, info.file, checkpoint.type_of(info.name))
        for info in checkpoint.tensors.values()
        if isinstance(info.dtype, torch.dtype)
    ]


class SourceIndex:
    """The sources behind each parameter: the names whose writes reached it, else the names that
    would have fed it by sglang's naming; with what each streamed as."""

    def __init__(
        self,
        sources: Iterable[Source],
        packed: Mapping[str, list[str]] | None = None,
        fed_by: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.by_name = {s.name: s for s in sources}
        self.names = NameIndex(self.by_name, packed)
        self.fed_by = fed_by or {}

    def sources_of(self, parameter: str) -> list[Source]:
        names = self.fed_by.get(parameter) or self.names.sources_of(parameter)
        return [self.by_name.get(n, Source(n)) for n in names]


class MisloadedDraftError(DraftWeightError):
    """A loaded draft with codes in its float parameters, or parameters left unwritten."""

    def __init__(
        self,
        findings: list[Finding],
        class_name: str,
        folder: str | None,
        skipped: list[str] | None = None,
        built_quantized: str | None = None,
        note: str | None = None,
    ) -> None:
        self.findings = findings
        self.skipped = skipped or []
        first = findings[0]
        where = f" loaded from {folder}" if folder else ""
        if built_quantized:
            where += f", built quantized ({built_quantized}),"
        lines = "\n".join(f"  - {f.describe()}" for f in findings)
        if self.skipped:
            shown = ", ".join(self.skipped[:8])
            more = f" and {len(self.skipped) - 8} more" if len(self.skipped) > 8 else ""
            lines += f"\n  checkpoint tensors sglang's loaders skipped: {shown}{more}"
        if note:
            lines += f"\n  {note}"
        doctor = f"sglang-mtp-dequant doctor {folder}" if folder else "sglang-mtp-dequant doctor"
        hint = (
            f"run `{doctor}` to see how each draft tensor is stored and which the draft class "
            "cannot place; export the MTP layers completely, as FLOAT or in a scheme this plugin "
            "decodes, with the names the draft class expects, or serve the draft quantized "
            "(--speculative-draft-model-quantization modelslim). "
            f"{MODE_ENV}=warn starts anyway (the draft then proposes garbage tokens)"
        )
        if built_quantized:
            hint = quantized_draft_hint(doctor)
        kinds = []
        if any(f.unwritten is not None for f in findings):
            kinds.append("parts no checkpoint tensor wrote")
        if any(f.unwritten is None and not f.nonfinite_rows for f in findings):
            kinds.append("raw codes instead of weights")
        if any(f.nonfinite_rows for f in findings):
            kinds.append("NaN or inf")
        problem = (
            f"the {class_name} draft{where} would serve garbage: {' and '.join(kinds)} in "
            f"{len(findings)} parameter(s)"
        )
        source = first.sources[0] if first.sources else None
        super().__init__(
            tensor=source.name if source else first.parameter,
            file=source.file if source else None,
            problem=problem,
            hint=hint,
            details=lines.split("\n"),
            subject="",  # the problem names the draft and its folder
        )


def quantized_draft_hint(doctor: str) -> str:
    """What to do about a draft sglang built quantized."""
    return (
        f"run `{doctor} <your launch flags, e.g. --device cuda>` to see how each draft tensor "
        "is stored; a parameter no quantization method owns (fc / eh_proj, the norms, a layer "
        "in quantization_config.ignore) needs its float weight in the checkpoint (fc / eh_proj "
        f"may also hold codes in a format the plugin decodes: {', '.join(DECODED_FORMATS)}, "
        "with their companions); "
        "re-export the MTP layers completely (listed in quantization_config.ignore they stay "
        "float), or re-download "
        f"an incomplete checkpoint. {MODE_ENV}=warn starts anyway (the draft then proposes "
        "garbage tokens)"
    )
