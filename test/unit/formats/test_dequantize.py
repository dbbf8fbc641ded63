"""``affine.dequantize`` is bit for bit the fp32 formula ``(q - offset) * scale``, rounded once.

Every case compares the bits of ``dequantize`` with a plain whole-tensor fp32 computation
written here (scale and offset repeated to the tensor's shape, no blocks, no fused
operations): ``((q.to(fp32) - offset) * scale).to(dtype)``. The cases are the ones where a
faster body could silently differ: rounding ties (to even: truncation and rounding half away
from zero each get half of them wrong), products that are subnormal or overflow in fp32 or
only in the output dtype, int16 and float8 codes (float8 -0 included), offsets that are not
integers (the order of subtraction and multiplication shows), several groups per row and a
ragged last group, bf16 / fp16 / fp32 outputs, an output written in place, and tensors that
span many of the decoder's row blocks at 1-3 torch threads. One case is built so that
rounding the exact product once, or taking the product in the output dtype, gives different
bits from the formula's (fp32 rounding, then the output rounding), and the test checks that
it does.

int8/uint8 codes without offsets into bf16/fp16 (W8A8_DYNAMIC) and everything else (offsets,
int16 and float8 codes, fp32 output written straight into the output rows) are all covered.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_mtp_dequant.formats.schemes.affine import AffineDecoder, dequantize

F32 = torch.float32
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def reference(codes, scale, offset, width, dtype):
    """The formula on whole tensors: each column's group is ``column // width``."""
    group = torch.arange(codes.shape[1]) // width
    w = codes.to(F32)
    if offset is not None:
        w = w - offset[:, group]
    return (w * scale[:, group]).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.dtype])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    differ = bits(got) != bits(want)
    if bool(differ.any()):
        where = differ.nonzero()[0].tolist()
        raise AssertionError(
            f"{int(differ.sum())} of {want.numel()} elements differ, first at {where}: "
            f"got {got[tuple(where)].item()!r}, want {want[tuple(where)].item()!r}"
        )


def random_scale(gen, rows, groups, spread=8.0):
    """Positive fp32 scales over many binades (exp of a normal), so products hit every
    mantissa pattern."""
    return torch.exp(torch.randn((rows, groups), generator=gen) * spread - 6).to(F32)


def int_codes(gen, shape, dtype):
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, shape, dtype=dtype, generator=gen)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def no_flush_to_zero():
    """Subnormal cases mean something only while torch keeps denormals (its default)."""
    assert torch.tensor(1e-40, dtype=F32).item() != 0.0


# -- random codes over the supported layouts ---------------------------------------------------


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("codes_dtype", (torch.int8, torch.uint8, torch.int16))
@pytest.mark.parametrize("groups", (1, 4))
@pytest.mark.parametrize("with_offset", (False, True))
def test_integer_codes(gen, dtype, codes_dtype, groups, with_offset):
    rows, cols = 300, 512
    q = int_codes(gen, (rows, cols), codes_dtype)
    scale = random_scale(gen, rows, groups)
    # offsets that are not integers: (q - o) * s and q * s - o * s round differently
    offset = (torch.randn((rows, groups), generator=gen) * 40).to(F32) if with_offset else None
    width = cols // groups
    got = dequantize(q, scale, offset, width, dtype)
    assert_bits_equal(got, reference(q, scale, offset, width, dtype))


@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_many_row_blocks_and_uneven_rows(gen, dtype):
    """Far more elements than one row block of the decoder (at any thread count), a row count
    no block size of a power of two divides, per-row scales and offsets (each block must use
    its own rows')."""
    rows, cols = 2999, 1500
    q = int_codes(gen, (rows, cols), torch.int8)
    scale = random_scale(gen, rows, 1)
    offset = torch.randn((rows, 1), generator=gen).to(F32)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):  # the decoder's blocks scale with torch's thread count
            torch.set_num_threads(count)
            for off in (None, offset):
                got = dequantize(q, scale, off, cols, dtype)
                assert_bits_equal(got, reference(q, scale, off, cols, dtype))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("codes_dtype", FLOAT8)
def test_float8_codes_with_a_ragged_last_group(gen, dtype, codes_dtype):
    """Block-scaled float8: groups of 128 columns, the last one 44 wide; codes cover the
    format's subnormals, its largest values and -0."""
    rows, cols, width = 256, 300, 128
    groups = math.ceil(cols / width)
    raw = torch.randn((rows, cols), generator=gen) * torch.logspace(-7, 4, cols)
    q = raw.to(codes_dtype)  # saturating formats: values out of range become inf/NaN/max
    q = torch.where(q.to(F32).isfinite(), q, torch.zeros((), dtype=codes_dtype))
    q[:3, :5] = -0.0
    q[3, :4] = torch.finfo(codes_dtype).max
    q[4, :4] = torch.finfo(codes_dtype).smallest_normal / 4  # subnormal codes
    assert bool((q.to(F32) == 0).logical_and(q.to(F32).signbit()).any()), "no -0 codes"
    scale = random_scale(gen, rows, groups, spread=3.0)
    got = dequantize(q, scale, None, width, dtype)
    want = reference(q, scale, None, width, dtype)
    assert_bits_equal(got, want)
    assert bool(want[:3, :5].signbit().all()), "-0 codes must stay -0"


# -- rounding -----------------------------------------------------------------------------


def _next_up(values: torch.Tensor) -> torch.Tensor:
    """The next larger representable value of positive floats of ``values.dtype``."""
    return (bits(values) + 1).view(values.dtype)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_ties_round_to_even(gen, dtype):
    """Products exactly halfway between two neighbours of ``dtype`` round to the even one.

    Each row's scale is such a midpoint; the codes are powers of two (and their negatives), so
    every product is a midpoint too. About half the ties go down, half up: truncation and
    rounding half away from zero each get one of the halves wrong.
    """
    rows = 512
    lo = (torch.rand(rows, generator=gen) * 4 + 0.25).to(dtype)
    hi = _next_up(lo)
    scale = ((lo.to(F32) + hi.to(F32)) / 2)[:, None]  # exact in fp32
    assert bool((scale[:, 0] != lo.to(F32)).all() & (scale[:, 0] != hi.to(F32)).all())
    q = torch.tensor([1, 2, 4, 8, -1, -2, -4, -8], dtype=torch.int8).repeat(rows, 1)
    got = dequantize(q, scale, None, q.shape[1], dtype)
    want = reference(q, scale, None, q.shape[1], dtype)
    assert_bits_equal(got, want)
    # the case discriminates: even mantissas everywhere, and neither neighbour always wins
    assert bool((bits(got) & 1 == 0).all())
    rounded_up = got[:, 0].to(F32) == hi.to(F32)
    assert 0 < int(rounded_up.sum()) < rows


def _double_rounding_case(dtype: torch.dtype) -> tuple[int, float, float, float]:
    """int8 ``q`` and fp32 ``s`` whose exact product lies just above a midpoint of ``dtype``
    while the fp32 product IS that midpoint: the formula (fp32, then ``dtype``, ties to even)
    rounds down; one rounding of the exact product rounds up, and so does the product taken in
    ``dtype`` (scale rounded to ``dtype`` first).

    Returns (q, s, formula result, single-rounding result).
    """
    step = torch.finfo(dtype).eps  # the spacing of ``dtype`` in [1, 2)
    for k in range(0, 64, 2):  # even mantissa below the midpoint: ties to even go down
        low = 1.0 + k * step
        mid = low + step / 2
        for q in range(3, 128, 2):
            s = torch.tensor(mid / q, dtype=F32)
            for _ in range(4):
                exact = q * float(s)  # exact in float64: 7 x 24 bits
                fp32 = float(torch.tensor(q, dtype=F32) * s)
                in_dtype = float(torch.tensor(q, dtype=dtype) * s.to(dtype))
                if fp32 == mid and exact > mid and in_dtype != low:
                    return q, float(s), low, low + step
                s = torch.nextafter(s, torch.tensor(math.inf, dtype=F32))
    raise AssertionError("no double-rounding case found")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_one_rounding_of_the_fp32_product(dtype):
    """A product that the formula and any other rounding disagree on (see the helper)."""
    q, s, formula, single = _double_rounding_case(dtype)
    codes = torch.full((3, 16), q, dtype=torch.int8)
    scale = torch.full((3, 1), s, dtype=F32)
    got = dequantize(codes, scale, None, 16, dtype)
    assert bool((got.to(F32) == formula).all()), (q, s, got[0, 0].item(), formula)
    assert formula != single
    assert_bits_equal(got, reference(codes, scale, None, 16, dtype))
    # and a bf16/fp16 scale (the product done in the output dtype) would not give it either
    in_dtype = (codes.to(dtype) * scale.to(dtype)).to(F32)
    assert not bool((in_dtype == formula).all())


# -- the ends of the ranges ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_subnormal_products(gen, dtype):
    """fp32 subnormal scales, and normal scales times fractional ``q - offset``, give
    subnormal fp32 products; for fp16 also products that are subnormal only in fp16."""
    rows, cols = 64, 256
    q = int_codes(gen, (rows, cols), torch.int8)
    scale = torch.cat(
        [
            torch.full((16, 1), 2.0**-140, dtype=F32) * (1 + torch.rand((16, 1), generator=gen)),
            torch.full((16, 1), 2.0**-126, dtype=F32) * (1 + torch.rand((16, 1), generator=gen)),
            torch.full((32, 1), 2.0**-22, dtype=F32) * (1 + torch.rand((32, 1), generator=gen)),
        ]
    )
    offset = torch.full((rows, 1), 0.375, dtype=F32)  # q - 0.375: fractions of a step
    for off in (None, offset):
        got = dequantize(q, scale, off, cols, dtype)
        want = reference(q, scale, off, cols, dtype)
        assert_bits_equal(got, want)
    tiny = want.abs().to(torch.float64)
    subnormal = (tiny > 0) & (tiny < torch.finfo(dtype).smallest_normal)
    assert bool(subnormal.any()), "the case produced no subnormal result"


@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_overflowing_products(gen, dtype):
    """Products beyond the output dtype's range (and beyond fp32's) become +-inf, exactly as
    the fp32 formula rounds them; fp32-finite products above bf16's largest value included."""
    rows, cols = 8, 256
    q = int_codes(gen, (rows, cols), torch.int8)
    q[:, :2] = torch.tensor([127, -128], dtype=torch.int8)
    big = torch.finfo(F32).max / 127
    above_bf16 = 3.40e38 / 127  # 127 x this: finite in fp32, beyond bf16's rounding to max
    scale = torch.tensor(
        [[big], [big * 1.001], [above_bf16], [3.3e38 / 127], [1000.0], [600.0], [1.0], [0.01]],
        dtype=F32,
    )
    got = dequantize(q, scale, None, cols, dtype)
    want = reference(q, scale, None, cols, dtype)
    assert_bits_equal(got, want)
    assert bool(want.isinf().any()) and bool(want.isfinite().any())
    if dtype == torch.bfloat16:
        assert want[2, 0].isinf() and (q[2, 0].to(F32) * scale[2, 0]).isfinite()


# -- outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("with_offset", (False, True))
def test_output_written_in_place(gen, dtype, with_offset):
    """``out`` is a view into a larger tensor (as the fused-experts path passes): it is the
    return value, it holds the formula's bits, and nothing around it is touched."""
    rows, cols = 200, 384
    q = int_codes(gen, (rows, cols), torch.int8)
    scale = random_scale(gen, rows, 3)
    offset = torch.randn((rows, 3), generator=gen).to(F32) if with_offset else None
    whole = torch.full((3, rows, cols), float("nan"), dtype=dtype)
    target = whole[1]
    got = dequantize(q, scale, offset, cols // 3, dtype, out=target)
    assert got.data_ptr() == target.data_ptr()
    assert_bits_equal(whole[1], reference(q, scale, offset, cols // 3, dtype))
    assert bool(whole[0].isnan().all()) and bool(whole[2].isnan().all())


def test_empty_and_single_column(gen):
    for shape in ((0, 64), (5, 1), (1, 1)):
        q = int_codes(gen, shape, torch.int8)
        scale = random_scale(gen, shape[0], 1)
        got = dequantize(q, scale, None, shape[1], torch.bfloat16)
        assert_bits_equal(got, reference(q, scale, None, shape[1], torch.bfloat16))


def test_decoder_only_some_experts(gen):
    """``AffineDecoder.decompress(only=...)``: the chosen experts hold the formula's bits, the
    others NaN (what no loader may keep)."""
    experts, out, cols = 6, 96, 160
    q = int_codes(gen, (experts, out, cols), torch.int8)
    scale = random_scale(gen, experts * out, 1)
    decoder = AffineDecoder(
        "mtp.experts.gate_up_proj", "f.safetensors", tuple(q.shape), scale, None
    )
    got = decoder.decompress(q, torch.bfloat16, only=[1, 4])
    want = reference(q.reshape(-1, cols), scale, None, cols, torch.bfloat16).view(q.shape)
    for e in range(experts):
        if e in (1, 4):
            assert_bits_equal(got[e], want[e])
        else:
            assert bool(got[e].isnan().all())
