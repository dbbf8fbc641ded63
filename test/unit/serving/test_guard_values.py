"""The value test (serving/guard/values.py): raw codes in a float parameter are found by their
grid, real weights are not, and the thresholds stop a norm of ones from looking like codes."""

from __future__ import annotations

import torch

from sglang_mtp_dequant.serving.guard.values import (
    CodeEvidence,
    code_evidence,
    integer_code_evidence,
    nonfinite_rows,
)


def int8_codes(rows: int = 16, cols: int = 64) -> torch.Tensor:
    """Every int8 code from -127 to 127, cycled over the rows, stored as bf16 (exact)."""
    return ((torch.arange(rows * cols) % 255) - 127).reshape(rows, cols).to(torch.bfloat16)


def weights(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).bfloat16()


def one_row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).repeat(2, 1).bfloat16()


def test_int8_codes_in_bf16_are_integer_evidence_over_every_row():
    evidence = code_evidence(int8_codes())
    assert evidence == CodeEvidence(((0, 16),), 16, 127.0, 255, "integer")
    assert evidence.row_count == 16
    assert integer_code_evidence(int8_codes()) == evidence


def test_codes_stacked_between_float_rows_are_located_by_row():
    """A qkv_proj whose k rows hold codes while q and v hold weights."""
    mixed = weights(16, 64)
    mixed[4:12] = int8_codes()[4:12]
    evidence = code_evidence(mixed)
    assert evidence is not None and evidence.kind == "integer"
    assert evidence.rows == ((4, 12),) and evidence.total_rows == 16
    assert evidence.describe() == (
        "rows 4-11 of 16 are all integers (absmax 127, at least 255 distinct values)"
    )


def test_describe_names_four_ranges_and_counts_the_rest():
    mixed = weights(12, 64)
    mixed[::2] = int8_codes(12)[::2]
    evidence = code_evidence(mixed)
    assert evidence is not None
    assert evidence.rows == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11))
    assert evidence.describe().startswith("rows 0, 2, 4, 6 (+2 more ranges) of 12 are all integers")


def test_trained_and_initialised_float_weights_are_no_evidence():
    assert code_evidence(weights(64, 64)) is None
    assert code_evidence(weights(8, 4096, seed=1) * 0.02) is None
    assert code_evidence(torch.randn(64, 64, dtype=torch.float32)) is None


def test_norms_of_ones_and_zero_biases_are_no_evidence():
    assert code_evidence(torch.ones(8, 64, dtype=torch.bfloat16)) is None
    assert code_evidence(torch.zeros(8, 64, dtype=torch.bfloat16)) is None
    assert code_evidence(torch.ones(64, dtype=torch.bfloat16)) is None


def test_huge_bf16_values_are_integral_by_representation_not_codes():
    assert code_evidence(torch.linspace(1000, 5000, 64).repeat(4, 1).bfloat16()) is None


def test_integer_and_empty_tensors_are_not_asked():
    assert code_evidence(torch.zeros(8, 64, dtype=torch.int8).random_(-128, 127)) is None
    assert code_evidence(torch.empty(0, 64, dtype=torch.bfloat16)) is None


def test_fp4_grid_values_are_fp4_evidence():
    grid = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0.5]
    evidence = code_evidence(torch.tensor(grid).repeat(8, 2).bfloat16())
    assert evidence == CodeEvidence(((0, 8),), 8, 6.0, 15, "fp4")
    assert evidence.describe() == (
        "rows 0-7 of 8 are all fp4 (e2m1) values (absmax 6, at least 15 distinct values)"
    )


def test_float8_values_cast_to_bf16_are_float8_evidence():
    generator = torch.Generator().manual_seed(2)
    codes = (torch.randn(32, 64, generator=generator) * 200).to(torch.float8_e4m3fn)
    stored = codes.to(torch.bfloat16)
    evidence = code_evidence(stored)
    assert evidence is not None and evidence.kind == "float8"
    assert evidence.rows == ((0, 32),)
    assert evidence.absmax == 448.0  # e4m3's largest finite value, reached by the clamp
    assert evidence.distinct == torch.unique(stored.float()).numel()
    assert "are all float8 values (at most 3 mantissa bits) (absmax 448" in evidence.describe()


def test_integer_threshold_min_absmax_and_min_distinct():
    """``min_absmax`` 8 and ``min_distinct`` 16: -7..8 is codes, -7..7 is not."""
    found = code_evidence(one_row([float(v) for v in range(-7, 9)]))
    assert found is not None and (found.kind, found.absmax, found.distinct) == ("integer", 8.0, 16)
    assert code_evidence(one_row([float(v) for v in range(-7, 8)])) is None


def test_integer_threshold_min_distinct_just_below():
    """A large absmax does not make up for too few distinct values (15 < 16)."""
    found = code_evidence(one_row([float(v) for v in range(15)] + [100.0]))
    assert found is not None and (found.kind, found.absmax, found.distinct) == (
        "integer",
        100.0,
        16,
    )
    assert code_evidence(one_row([float(v) for v in range(14)] + [100.0])) is None


def test_fp4_threshold_min_absmax_just_below():
    """fp4 asks absmax 3: every e2m1 value up to 2 (9 distinct, above ``min_distinct``) is not."""
    below = [0, 0.5, 1, 1.5, 2, -0.5, -1, -1.5, -2]
    assert code_evidence(one_row(below)) is None
    found = code_evidence(one_row([*below, 3]))
    assert found is not None and (found.kind, found.absmax, found.distinct) == ("fp4", 3.0, 10)


def test_float8_threshold_min_absmax_just_below():
    grid = [0.5, 0.625, 0.75, 0.875, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7]
    assert code_evidence(one_row([*grid, 15])) is None
    found = code_evidence(one_row([*grid, 16]))
    assert found is not None and (found.kind, found.absmax, found.distinct) == ("float8", 16.0, 17)


def test_nonfinite_rows_counts_rows_with_nan_or_inf():
    tensor = torch.zeros(6, 4, dtype=torch.bfloat16)
    tensor[1, 0] = float("nan")
    tensor[4, 3] = float("inf")
    tensor[5, 1] = float("-inf")
    tensor[5, 2] = float("nan")
    assert nonfinite_rows(tensor) == 3
    assert nonfinite_rows(tensor.reshape(2, 3, 4)) == 3  # rows are the last dimension


def test_nonfinite_rows_is_zero_for_healthy_integer_and_empty_tensors():
    assert nonfinite_rows(weights(6, 4)) == 0
    assert nonfinite_rows(torch.full((3, 3), 127, dtype=torch.int8)) == 0
    assert nonfinite_rows(torch.empty(0, dtype=torch.bfloat16)) == 0
    vector = torch.ones(8, dtype=torch.float32)
    vector[3] = float("nan")
    assert nonfinite_rows(vector) == 1  # a 1-D tensor is one row
