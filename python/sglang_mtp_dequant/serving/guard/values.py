"""The value test: does a float parameter hold raw low-precision codes instead of weights?

Usage::

    evidence = code_evidence(param)     # None for ordinary float weights
    evidence.describe()                 # "rows 0-383 of 384 are all integers (absmax 127, ...)"

Why values: a checkpoint can lie to the names, dtypes and description the plan decides from;
codes copied into a float parameter keep the grid of their format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: columns sampled per row before a row is read in full
SAMPLE_COLUMNS = 8
#: rows are read in blocks of about this many elements (bounded temporary memory)
_BLOCK_ELEMENTS = 1 << 22
#: distinct values are counted on about this many elements of each block's code rows
_DISTINCT_SAMPLE = 1 << 16

_FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@dataclass(frozen=True)
class CodeFormat:
    """One grid of raw codes and how much evidence it takes to call a tensor code-filled."""

    name: str
    min_absmax: float
    min_distinct: int

    def on_grid(self, values: torch.Tensor, informative: float, full: bool = True) -> torch.Tensor:
        """Per row of fp32 ``values``: is every value a code of this format? ``full=False`` (a few
        sampled columns) asks only what every sampled value must satisfy."""
        magnitude = values.abs()
        if self.name == "integer":
            # finite whole numbers, mostly below 2**mantissa_bits over a row (huge bf16 values
            # are integral by representation)
            whole = (torch.frac(values) == 0).all(dim=-1)
            if not full:
                return whole
            return whole & ((magnitude < informative).sum(dim=-1) * 4 >= values.shape[-1])
        if self.name == "fp4":
            return torch.isin(magnitude, _FP4_VALUES).all(dim=-1)
        # float8: at most 3 mantissa bits and within e5m2's range (e4m3's is inside it)
        bits = values.view(torch.int32)
        few_bits = (bits & ((1 << 20) - 1)) == 0
        return (few_bits & (magnitude <= 57344.0) & torch.isfinite(values)).all(dim=-1)


#: in this order, which breaks ties: integers up to 16 are on the float8 grid, fp4 values are
#: on it always, and e4m3 values from 8 up are integers
INTEGER = CodeFormat("integer", min_absmax=8.0, min_distinct=16)
FP4 = CodeFormat("fp4", min_absmax=3.0, min_distinct=8)
FLOAT8 = CodeFormat("float8", min_absmax=16.0, min_distinct=16)
FORMATS = (INTEGER, FP4, FLOAT8)

_DESCRIPTIONS = {
    "integer": "all integers",
    "fp4": "all fp4 (e2m1) values",
    "float8": "all float8 values (at most 3 mantissa bits)",
}


@dataclass(frozen=True)
class CodeEvidence:
    """Why a parameter's values look like raw codes rather than weights."""

    rows: tuple[tuple[int, int], ...]  # [start, stop) ranges of code rows
    total_rows: int
    absmax: float
    distinct: int  # distinct values seen (counting stops at the threshold)
    kind: str = "integer"

    @property
    def row_count(self) -> int:
        return sum(b - a for a, b in self.rows)

    def describe(self) -> str:
        ranges = ", ".join(f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in self.rows[:4])
        if len(self.rows) > 4:
            ranges += f" (+{len(self.rows) - 4} more ranges)"
        return (
            f"rows {ranges} of {self.total_rows} are {_DESCRIPTIONS.get(self.kind, self.kind)} "
            f"(absmax {self.absmax:g}, at least {self.distinct} distinct values)"
        )


def code_evidence(tensor: torch.Tensor) -> CodeEvidence | None:
    """Evidence that rows of a float tensor hold raw codes (of the format whose grid holds the
    most rows), or None. A norm of ones is on every grid, hence the distinct values and absmax
    asked for."""
    found = [e for e in (grid_evidence(tensor, fmt) for fmt in FORMATS) if e is not None]
    return max(found, key=lambda e: e.row_count, default=None)


def integer_code_evidence(tensor: torch.Tensor) -> CodeEvidence | None:
    return grid_evidence(tensor, INTEGER)


def nonfinite_rows(tensor: torch.Tensor) -> int:
    """How many rows hold NaN or inf (one sum first: a healthy parameter costs one read)."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return 0
    flat = tensor.detach()
    if bool(torch.isfinite(flat.sum())):
        return 0
    flat = flat.reshape(1, -1) if flat.dim() < 2 else flat.reshape(-1, flat.shape[-1])
    return int((~torch.isfinite(flat)).any(dim=-1).sum())


def grid_evidence(tensor: torch.Tensor, fmt: CodeFormat) -> CodeEvidence | None:
    """The rows of a float ``tensor`` on ``fmt``'s grid, when together they reach
    ``fmt.min_absmax`` and ``fmt.min_distinct`` values (row-wise: k rows of a ``qkv_proj``
    count); else None. Off-grid rows are rejected from sampled columns."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    flat = tensor.detach()
    flat = flat.reshape(1, -1) if flat.dim() < 2 else flat.reshape(-1, flat.shape[-1])
    rows, cols = flat.shape
    informative = 1.0 / torch.finfo(flat.dtype).eps  # 2**mantissa_bits: 128 for bf16
    sample = flat[:, :: max(1, cols // SAMPLE_COLUMNS)].float()
    maybe = fmt.on_grid(sample, informative, full=False)
    if not bool(maybe.any()):
        return None  # the common case: every row has an off-grid value among its samples
    candidates = maybe.nonzero().flatten()
    block = max(1, _BLOCK_ELEMENTS // cols)
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
        whole = fmt.on_grid(part, informative)
        if not bool(whole.any()):
            continue
        if not bool(whole.all()):
            part = part[whole]
        code_rows.append(index[whole])
        absmax = max(absmax, float(part.abs().max()))
        if values.numel() < fmt.min_distinct:  # counted on a slice, until the threshold is met
            seen = part[: max(1, _DISTINCT_SAMPLE // cols)].flatten()
            if fmt is INTEGER:
                seen = seen[seen.abs() < informative]
            values = torch.unique(torch.cat([values, seen.cpu()]))
        if absmax >= fmt.min_absmax and values.numel() >= fmt.min_distinct:
            # conclusive: the remaining candidate rows are reported as sampled
            code_rows.append(candidates[start + block :])
            break
    if not code_rows or absmax < fmt.min_absmax or values.numel() < fmt.min_distinct:
        return None
    return CodeEvidence(
        _ranges(torch.cat(code_rows).tolist()), rows, absmax, int(values.numel()), fmt.name
    )


def _ranges(indices: list[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return tuple(out)
