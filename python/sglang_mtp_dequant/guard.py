"""The misload guard: refuse a draft whose float parameters hold raw integer codes.

Usage::

    # plugin.py, right after sglang's own load_weights returned its loaded names
    check_loaded_draft(model, loaded, stream, class_name="Qwen3_5ForCausalLMMTP", folder=folder)

    # or on any tensors (tests, benchmarks)
    evidence = integer_code_evidence(param)        # None for ordinary float weights
    findings = inspect_draft(model, loaded=None)   # every float parameter

``SGLANG_MTP_DEQUANT_GUARD`` = ``error`` (default: stop the start-up) | ``warn`` (log the same
message once and go on) | ``off`` (skip the check).

Why a check after loading, when the plan and the stream already refuse what they cannot
decode: those decide from names, dtypes and the description. A checkpoint can lie to all three
(codes stored in a bf16 tensor, a description that says FLOAT, names this package does not
know, an upstream fix that half worked). The parameters themselves cannot lie: int8 codes
copied into bf16 are integers, span dozens of values and reach far beyond any trained
weight's usual range, and a trained or freshly initialised float weight is never all integers
(a norm of ones or zeros is, but has one or two distinct values). So the guard looks at the
values, after sglang's own loaders have stacked and scattered them, and names each suspect
parameter, the checkpoint tensors that fed it, and what to do.

Cost: ordinary float rows are rejected from a few sampled columns each, so a float draft
costs a read of ``rows x 8`` values per parameter; rows whose samples are all integers are
read in full until the evidence is conclusive (for int8 codes: the first block of about 4 M
values), and the rest of them are reported from their samples (see
``benchmarks/bench_guard.py`` and ``docs/doctor-and-guard.md``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from .errors import DraftWeightError

logger = logging.getLogger("sglang_mtp_dequant")

MODE_ENV = "SGLANG_MTP_DEQUANT_GUARD"
MODES = ("error", "warn", "off")

#: codes copied from int8 reach |127| in practice; int4 codes are never copied silently
#: (their packed shape fails sglang's shape check), so 8 is safely below any real code range
MIN_ABSMAX = 8.0
#: a norm of ones, a zero bias or a constant scale has 1-2 distinct values; codes have dozens
MIN_DISTINCT = 16
#: columns sampled per row before a row is read in full
SAMPLE_COLUMNS = 8
#: rows are read in blocks of about this many elements (bounded temporary memory)
_BLOCK_ELEMENTS = 1 << 22
#: distinct values are counted on about this many elements of each block's code rows
_DISTINCT_SAMPLE = 1 << 16

#: the draft shares these with the target (sglang's set_embed_and_head replaces them after
#: loading), so what the draft's own load put there is not what it serves with
SHARED_WITH_TARGET = ("embed_tokens", "lm_head")

#: name tokens sglang's draft loaders add or drop between checkpoint and parameter names
_NEUTRAL_TOKENS = frozenset({"model", "mtp", "language_model", "self_attn"})
#: FusedMoE parameters and the per-expert checkpoint projections stacked into them
_EXPERT_PARTS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}
#: the same, when the checkpoint stores all experts fused in one tensor (no ``.weight``)
_FUSED_EXPERTS = {"w13_weight": "gate_up_proj", "w2_weight": "down_proj"}
_DEFAULT_PACKED = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


@dataclass(frozen=True)
class CodeEvidence:
    """Why a parameter's values look like integer codes rather than weights."""

    rows: tuple[tuple[int, int], ...]  # [start, stop) ranges of all-integer rows
    total_rows: int
    absmax: float
    distinct: int  # distinct values below 2**mantissa_bits (counting stops at the threshold)

    def describe(self) -> str:
        ranges = ", ".join(f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in self.rows[:4])
        if len(self.rows) > 4:
            ranges += f" (+{len(self.rows) - 4} more ranges)"
        return (
            f"rows {ranges} of {self.total_rows} are all integers "
            f"(absmax {self.absmax:g}, at least {self.distinct} distinct values)"
        )


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
            facts.append(str(self.dtype).replace("torch.", ""))
        if self.raw_integer:
            facts.append("copied as raw integers")
        if self.description_type:
            facts.append(f"described as {self.description_type}")
        if self.dequantized:
            facts.append("dequantized by the plugin")
        if self.file:
            facts.append(f"in {os.path.basename(self.file)}")
        return f"{self.name} ({', '.join(facts)})" if facts else self.name

    @property
    def raw_integer(self) -> bool:
        """Streamed as integers and handed to sglang as they were."""
        return (
            self.dtype is not None
            and not self.dtype.is_floating_point
            and self.dtype != torch.bool
            and not self.dequantized
        )


@dataclass
class Finding:
    """One float parameter the guard refuses."""

    parameter: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    evidence: CodeEvidence | None
    sources: list[Source] = field(default_factory=list)

    @property
    def raw_integer_sources(self) -> list[Source]:
        return [s for s in self.sources if s.raw_integer]

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        if self.evidence is not None:
            what = self.evidence.describe()
        else:
            what = "loaded from integer tensors that nothing dequantized"
        if self.sources:
            fed = "fed by " + ", ".join(s.describe() for s in self.sources[:6])
            if len(self.sources) > 6:
                fed += f" and {len(self.sources) - 6} more"
        else:
            fed = "checkpoint tensor not identified (no streamed draft name maps to it)"
        return f"{self.parameter} [{dtype} {list(self.shape)}]: {what}; {fed}"


class MisloadedDraftError(DraftWeightError):
    """A loaded draft whose float parameters hold integer codes: serving it would be garbage."""

    def __init__(self, findings: list[Finding], class_name: str, folder: str | None) -> None:
        self.findings = findings
        first = findings[0]
        where = f" loaded from {folder}" if folder else ""
        lines = "\n".join(f"  - {f.describe()}" for f in findings)
        doctor = f"sglang-mtp-dequant doctor {folder}" if folder else "sglang-mtp-dequant doctor"
        hint = (
            f"run `{doctor}` to see how each draft tensor is stored; re-export the MTP "
            "layers as FLOAT or in a scheme this plugin decodes, or serve the draft quantized "
            "(--speculative-draft-model-quantization modelslim). "
            f"{MODE_ENV}=warn starts anyway (the draft then proposes garbage tokens)"
        )
        problem = (
            f"the {class_name} draft{where} holds raw integer codes in "
            f"{len(findings)} float parameter(s) instead of weights"
        )
        source = first.sources[0] if first.sources else None
        super().__init__(
            tensor=source.name if source else first.parameter,
            file=source.file if source else None,
            problem=problem,
            hint=hint,
        )
        self.args = (f"sglang-mtp-dequant: {problem}:\n{lines}\nWhat to do: {hint}",)


# -- the value test --------------------------------------------------------------------------


def integer_code_evidence(
    tensor: torch.Tensor,
    min_absmax: float = MIN_ABSMAX,
    min_distinct: int = MIN_DISTINCT,
) -> CodeEvidence | None:
    """Evidence that the rows of a float tensor hold integer codes, or None.

    A row (the last dimension; a 1-D tensor is one row) is suspect when every value in it is a
    finite integer. The tensor is flagged when its suspect rows together reach ``min_absmax``
    and hold at least ``min_distinct`` distinct values below ``2**mantissa_bits`` (128 for
    bf16: larger bf16 values are all integers, so a row of huge floats is no evidence).
    Row-wise, so a stacked parameter (qkv_proj) whose k rows hold codes while q rows hold
    weights is still caught.
    """
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    flat = tensor.detach()
    flat = flat.reshape(1, -1) if flat.dim() < 2 else flat.reshape(-1, flat.shape[-1])
    rows, cols = flat.shape
    sample = flat[:, :: max(1, cols // SAMPLE_COLUMNS)]  # a strided view: no copy until .float()
    maybe = (torch.frac(sample.float()) == 0).all(dim=1)
    if not bool(maybe.any()):
        return None  # the common case: every row has a non-integer among its samples
    candidates = maybe.nonzero().flatten()
    block = max(1, _BLOCK_ELEMENTS // cols)
    informative = 1.0 / torch.finfo(flat.dtype).eps  # 2**mantissa_bits: 128 for bf16
    code_rows: list[torch.Tensor] = []
    absmax = 0.0
    values = torch.empty(0)
    for start in range(0, candidates.numel(), block):
        index = candidates[start : start + block]
        first, last = int(index[0]), int(index[-1])
        if last - first + 1 == index.numel():  # a run of rows (codes: all of them): a view
            part = flat[first : last + 1].float()
        else:
            part = flat.index_select(0, index).float()
        magnitude = part.abs()
        small = magnitude < informative
        # a code row is all finite integers (frac is NaN for inf and NaN), mostly below
        # 2**mantissa_bits (int8 codes all are, uint8 codes half): a row of huge bf16
        # values is integral by representation, which is no evidence
        whole = (torch.frac(part) == 0).all(dim=1) & (small.sum(dim=1) * 4 >= cols)
        if not bool(whole.any()):
            continue
        if not bool(whole.all()):
            part, small, magnitude = part[whole], small[whole], magnitude[whole]
        code_rows.append(index[whole])
        absmax = max(absmax, float(magnitude.max()))
        if values.numel() < min_distinct:  # counted on a slice, until the threshold is met
            rows_needed = max(1, _DISTINCT_SAMPLE // cols)
            seen = part[:rows_needed][small[:rows_needed]]
            values = torch.unique(torch.cat([values, seen.cpu()]))
        if absmax >= min_absmax and values.numel() >= min_distinct:
            # conclusive on fully read rows: the remaining candidate rows (all-integer
            # samples) are reported as they are, not read again
            code_rows.append(candidates[start + block :])
            break
    if not code_rows:
        return None
    distinct = int(values.numel())
    if absmax < min_absmax or distinct < min_distinct:
        return None
    return CodeEvidence(_ranges(torch.cat(code_rows).tolist()), rows, absmax, distinct)


def _ranges(indices: list[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return tuple(out)


# -- which checkpoint tensors fed a parameter ------------------------------------------------


def _tokens(name: str) -> tuple[str, ...]:
    return tuple(t for t in name.split(".") if t not in _NEUTRAL_TOKENS)


class SourceIndex:
    """Maps parameter names back to the checkpoint names that streamed into them.

    Derived from names only (sglang's loaders rename ``mtp.X`` to ``model.X``, drop
    ``self_attn`` and stack q/k/v and gate/up through the class's ``packed_modules_mapping``),
    so it works for any draft class without hooking its loaders.
    """

    def __init__(
        self,
        sources: Iterable[Source],
        packed: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.packed = dict(packed or _DEFAULT_PACKED)
        self.by_tokens: dict[tuple[str, ...], list[Source]] = {}
        for source in sources:
            self.by_tokens.setdefault(_tokens(source.name), []).append(source)

    @classmethod
    def from_stream(cls, stream: object, packed: Mapping[str, list[str]] | None) -> SourceIndex:
        """From a ``DequantizingStream`` after the load: every draft name it saw, with the
        dtype it streamed as, its file and description type when the plan knows them."""
        plan = getattr(stream, "plan", None)
        checkpoint = getattr(plan, "checkpoint", None)
        decoded = set(plan.to_dequantize) if plan is not None else set()
        streamed: Mapping[str, torch.dtype] = getattr(stream, "streamed", {}) or {}
        sources = []
        for name, dtype in streamed.items():
            info = checkpoint.tensors.get(name) if checkpoint is not None else None
            sources.append(
                Source(
                    name=name,
                    dtype=dtype,
                    file=info.file if info is not None else None,
                    description_type=checkpoint.type_of(name) if checkpoint is not None else None,
                    dequantized=name in decoded and not dtype.is_floating_point,
                )
            )
        return cls(sources, packed)

    @classmethod
    def from_checkpoint(cls, checkpoint: object, packed: Mapping[str, list[str]] | None = None):
        """From a ``Checkpoint``'s headers (no stream: e.g. a stock load being inspected)."""
        return cls(
            (
                Source(info.name, info.dtype, info.file, checkpoint.type_of(info.name))
                for info in checkpoint.tensors.values()
                if isinstance(info.dtype, torch.dtype)
            ),
            packed,
        )

    def sources_of(self, parameter: str) -> list[Source]:
        """The checkpoint tensors behind ``parameter``, in the order sglang stacks them."""
        tokens = _tokens(parameter)
        if len(tokens) >= 2 and tokens[-2] == "experts" and tokens[-1] in _EXPERT_PARTS:
            fused = self.by_tokens.get(tokens[:-1] + (_FUSED_EXPERTS[tokens[-1]],))
            return list(fused or self._expert_sources(tokens[:-1], _EXPERT_PARTS[tokens[-1]]))
        found: list[Source] = []
        for i, token in enumerate(tokens):
            for part in self.packed.get(token, ()):
                found += self.by_tokens.get(tokens[:i] + (part,) + tokens[i + 1 :], [])
        return found or list(self.by_tokens.get(tokens, []))

    def _expert_sources(self, prefix: tuple[str, ...], parts: tuple[str, ...]) -> list[Source]:
        found = []
        for tokens, sources in self.by_tokens.items():
            rest = tokens[len(prefix) :]
            if (
                tokens[: len(prefix)] == prefix
                and len(rest) == 3
                and rest[0].isdigit()
                and rest[1] in parts
                and rest[2] == "weight"
            ):
                found += [(int(rest[0]), parts.index(rest[1]), s) for s in sources]
        return [s for _, _, s in sorted(found, key=lambda x: (x[0], x[1], x[2].name))]


# -- the check -------------------------------------------------------------------------------


def guard_mode() -> str:
    """The mode from ``SGLANG_MTP_DEQUANT_GUARD``; a typo stops the start-up, not the guard."""
    raw = os.environ.get(MODE_ENV, "error").strip().lower() or "error"
    if raw not in MODES:
        raise ValueError(
            f"sglang-mtp-dequant: {MODE_ENV}={os.environ.get(MODE_ENV)!r} is not one of "
            f"{', '.join(MODES)}. What to do: set it to one of those, or unset it (error)"
        )
    return raw


def shared_with_target(parameter: str) -> bool:
    return any(token in SHARED_WITH_TARGET for token in parameter.split("."))


def parameters_to_inspect(
    model: torch.nn.Module, loaded: Iterable[str] | None
) -> list[tuple[str, torch.Tensor]]:
    """Float parameters the draft's own load wrote (all of them when it did not say which),
    less the embedding and lm_head it shares with the target."""
    wanted = set(loaded) if loaded is not None else None
    return [
        (name, param)
        for name, param in model.named_parameters()
        if param.is_floating_point()
        and (wanted is None or name in wanted)
        and not shared_with_target(name)
    ]


def inspect_draft(
    model: torch.nn.Module,
    loaded: Iterable[str] | None,
    sources: SourceIndex | None = None,
) -> list[Finding]:
    """Every inspected parameter that holds codes or came from raw integer tensors."""
    findings = []
    for name, param in parameters_to_inspect(model, loaded):
        fed = sources.sources_of(name) if sources is not None else []
        evidence = integer_code_evidence(param)
        if evidence is not None or any(s.raw_integer for s in fed):
            findings.append(Finding(name, param.dtype, tuple(param.shape), evidence, fed))
    return findings


def check_loaded_draft(
    model: torch.nn.Module,
    loaded: object,
    stream: object,
    class_name: str,
    folder: str | None = None,
) -> list[Finding]:
    """Run the guard on a draft sglang just loaded; raise, warn or pass per the mode.

    ``loaded`` is what the class's ``load_weights`` returned (sglang returns the set of
    parameter names it wrote; anything else means "unknown", and every float parameter is
    inspected). Silent when nothing is found.
    """
    mode = guard_mode()
    if mode == "off":
        return []
    names = loaded if isinstance(loaded, (set, frozenset, list, tuple)) else None
    packed = getattr(model, "packed_modules_mapping", None)
    findings = inspect_draft(model, names, SourceIndex.from_stream(stream, packed))
    if not findings:
        return []
    error = MisloadedDraftError(findings, class_name, folder)
    if mode == "warn":
        logger.warning("%s (continuing: %s=warn)", error, MODE_ENV)
        return findings
    raise error
