"""Property tests: malformed checkpoints end in a clear error or a correct result, never a
crash without a message and never a wrong tensor.

The inputs are the real msmodelslim fixture, damaged by hypothesis: truncated and corrupted
safetensors files, headers that parse but lie, JSON that is not what its name says, scale
shapes that do not fit the weight, tensor names with path separators. "Clear error" means
``CheckpointFormatError`` / ``DraftWeightError`` naming the file or the tensor and saying what
to do; "correct result" is checked against an independent fp32 dequantization.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from sglang_mtp_dequant.errors import CheckpointFormatError, DraftWeightError
from sglang_mtp_dequant.formats.checkpoint import Checkpoint, TensorInfo
from sglang_mtp_dequant.formats.plan import DequantPlan
from sglang_mtp_dequant.formats.schemes.int8 import AffineInt8, StaticInt8
from sglang_mtp_dequant.tools.doctor import diagnose
from support.checkpoints import edit_description, open_checkpoint
from support.paths import fixture_dir
from support.reference import dequantize_fp32, load_all

FIXTURE = fixture_dir("q35_dense_w8a8_dynamic")
SHARD = "quant_model_weights-00001-of-00001.safetensors"
INDEX = "quant_model_weights.safetensors.index.json"
DESCRIPTION = "quant_model_description.json"
with open(os.path.join(FIXTURE, SHARD), "rb") as _handle:
    SHARD_BYTES = _handle.read()
HEADER_LEN = struct.unpack("<Q", SHARD_BYTES[:8])[0]
RAW = load_all(FIXTURE)
IS_DRAFT = lambda name: name.startswith("mtp.")  # noqa: E731

PROPERTY = settings(
    max_examples=int(os.environ.get("MALFORMED_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.text(alphabet=st.sampled_from("mtp.layers0/\\..weight_:x\x00 "), min_size=1, max_size=24)


_COPIES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def copies_under_pytest_tmp(tmp_path_factory):
    """Every damaged copy lives under pytest's temp dir, and only the latest one exists."""
    _COPIES["base"] = str(tmp_path_factory.mktemp("malformed"))
    yield
    shutil.rmtree(_COPIES.pop("base"), ignore_errors=True)


def fresh_copy(edit_files: dict[str, bytes | None]) -> str:
    """A copy of the fixture with some files replaced (bytes) or removed (None); the copy of
    the previous example is removed first (hypothesis runs hundreds of them)."""
    folder = os.path.join(_COPIES["base"], "ckpt")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(FIXTURE, folder)
    for name, content in edit_files.items():
        path = os.path.join(folder, name)
        if os.path.exists(path):
            os.chmod(path, 0o644)
            os.remove(path)
        if content is not None:
            with open(path, "wb") as handle:
                handle.write(content)
    return folder


def open_or_clear_error(folder: str) -> Checkpoint | None:
    """Opening what sglang resolves either works or raises CheckpointFormatError naming a file
    in folder."""
    try:
        return open_checkpoint(folder, wanted=IS_DRAFT)
    except CheckpointFormatError as exc:
        assert exc.file.startswith(folder) and exc.problem and exc.hint
        assert str(exc).startswith("sglang-mtp-dequant: ") and "What to do: " in str(exc)
        return None


def assert_consistent(ckpt: Checkpoint) -> None:
    """What the headers said is what reading gives; the plan decides without crashing, and
    every tensor it would dequantize decodes to the independent fp32 formula, or is refused."""
    for info in ckpt.tensors.values():
        try:
            tensor = ckpt.read_many([info])[info.name]
        except CheckpointFormatError as exc:
            assert exc.file == info.file and info.name in exc.problem
            continue
        assert tensor.dtype == info.dtype and tuple(tensor.shape) == info.shape
    plan = DequantPlan.build(ckpt)
    for name, entry in plan.entries.items():
        assert entry.action in ("dequantize", "keep", "error")
        if entry.info.holds_codes:
            assert entry.action != "keep", f"{name}: codes planned as float"
        if entry.action == "error":
            assert isinstance(entry.error, DraftWeightError) and entry.error.tensor == name
        if entry.action == "dequantize":
            codes = ckpt.read_many([entry.info])[name]
            got = entry.decoder.decompress(codes, torch.float32)
            tensors = ckpt.read_many(ckpt.tensors.values())
            assert torch.equal(got, dequantize_fp32(tensors, name, "W8A8_DYNAMIC")), name


# -- safetensors files -----------------------------------------------------------------------


@PROPERTY
@given(cut=st.integers(0, len(SHARD_BYTES) - 1))
def test_truncated_shard_is_a_clear_error(cut):
    folder = fresh_copy({SHARD: SHARD_BYTES[:cut]})
    assert open_or_clear_error(folder) is None


@PROPERTY
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 8 + HEADER_LEN - 1), st.integers(0, 255)), min_size=1, max_size=4
    )
)
def test_corrupted_header_bytes(edits):
    data = bytearray(SHARD_BYTES)
    for position, value in edits:
        data[position] = value
    folder = fresh_copy({SHARD: bytes(data)})
    ckpt = open_or_clear_error(folder)
    if ckpt is not None:
        assert_consistent(ckpt)


@PROPERTY
@given(length=st.integers(0, 2**64 - 1))
def test_header_length_prefix(length):
    assume(length != HEADER_LEN)
    folder = fresh_copy({SHARD: struct.pack("<Q", length) + SHARD_BYTES[8:]})
    assert open_or_clear_error(folder) is None


def _header_file(entries: dict[str, dict], payload: bytes) -> bytes:
    header = json.dumps(entries).encode()
    return struct.pack("<Q", len(header)) + header + payload


tensor_entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["I8", "U8", "BF16", "F32", "I64", "U16", "X", "", "i8"]),
        "shape": st.lists(st.integers(-2, 6), max_size=3),
        "data_offsets": st.lists(st.integers(-1, 80), min_size=0, max_size=3),
    }
)


@PROPERTY
@given(entries=st.dictionaries(names, tensor_entry, min_size=1, max_size=3),
       payload=st.binary(max_size=80))  # fmt: skip
def test_headers_that_parse_but_lie(entries, payload):
    """Names with path separators, unknown dtypes, negative or misfitting shapes/offsets."""
    folder = fresh_copy({SHARD: _header_file(entries, payload), INDEX: None})
    ckpt = open_or_clear_error(folder)
    if ckpt is None:
        return
    for name, info in ckpt.tensors.items():
        assert name in entries and info.file == os.path.join(folder, SHARD)
        assert list(info.shape) == entries[name]["shape"]
    assert_consistent(ckpt)
    report = diagnose(folder)  # the doctor reports instead of raising
    assert report.verdict in ("ok", "error")


@PROPERTY
@given(header=json_values)
def test_header_json_of_any_shape(header):
    folder = fresh_copy({SHARD: _header_file(header, b""), INDEX: None})  # type: ignore[arg-type]
    ckpt = open_or_clear_error(folder)
    if ckpt is not None:
        assert_consistent(ckpt)


# -- the JSON files ModelSlim writes ---------------------------------------------------------


@PROPERTY
@given(description=json_values)
def test_description_that_is_not_a_description(description):
    folder = fresh_copy({DESCRIPTION: json.dumps(description).encode()})
    ckpt = open_or_clear_error(folder)
    if ckpt is not None:
        assert all(isinstance(v, str) for v in ckpt.description.values())
        assert_consistent(ckpt)


@PROPERTY
@given(types=st.dictionaries(st.sampled_from(sorted(RAW)), json_values | st.text(max_size=14)),
       group_size=json_values)  # fmt: skip
def test_description_entries_of_any_type(types, group_size):
    """Any type string (or none) for any tensor: the int8 weights still decode correctly or
    are refused; they are never kept as float."""

    def edit(description: dict) -> None:
        description.update(types)
        description["group_size"] = group_size

    folder = fresh_copy({})
    edit_description(folder, edit)
    ckpt = open_or_clear_error(folder)
    if ckpt is not None:
        assert_consistent(ckpt)


@PROPERTY
@given(index=json_values | st.fixed_dictionaries({"weight_map": st.dictionaries(names, names)}))
def test_index_that_is_not_an_index(index):
    folder = fresh_copy({INDEX: json.dumps(index).encode()})
    ckpt = open_or_clear_error(folder)
    if ckpt is not None:
        assert_consistent(ckpt)


@PROPERTY
@given(raw=st.binary(max_size=64))
def test_json_files_that_are_not_json(raw):
    for target in (DESCRIPTION, INDEX):
        folder = fresh_copy({target: raw})
        ckpt = open_or_clear_error(folder)
        if ckpt is not None:
            assert_consistent(ckpt)


# -- scale layouts the decoders get ----------------------------------------------------------


def _layout(values: torch.Tensor, out: int, cols: int, group_size: int):
    """The independent reading of a scale/offset: (out,) or (out, 1) per row, (out, in/G) per
    group; returns the (out, in) expansion and the number of groups, or None."""
    shape = tuple(values.shape)
    if shape in ((out,), (out, 1)) or (shape == () and out == 1):
        return values.float().reshape(out, 1).repeat_interleave(cols, dim=1), 1
    if len(shape) == 2 and shape[0] == out and shape[1] > 0 and cols % shape[1] == 0:
        if group_size and cols // shape[1] != group_size:
            return None
        return values.float().repeat_interleave(cols // shape[1], dim=1), shape[1]
    return None


scale_shapes = st.sampled_from(
    ["row", "row1", "group", "flat_all", "one_out", "row11", "random", "scalar"]
)
floats = st.floats(-2.0, 2.0, width=32) | st.sampled_from(
    [0.0, float("nan"), float("inf"), -float("inf"), 1e-30]
)


def _shape_for(kind: str, out: int, cols: int, groups: int, extra: tuple[int, int]):
    return {
        "row": (out,),
        "row1": (out, 1),
        "group": (out, groups),
        "flat_all": (out * cols,),
        "one_out": (1, out),
        "row11": (out, 1, 1),
        "random": extra,
        "scalar": (),
    }[kind]


@PROPERTY
@given(
    out=st.integers(1, 6),
    cols=st.integers(1, 12),
    groups=st.integers(1, 12),
    kinds=st.tuples(scale_shapes, scale_shapes | st.none()),
    extra=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    group_size=st.sampled_from([0, 1, 2, 3, 4]),
    data=st.data(),
)
def test_affine_decoder_on_any_scale_layout(out, cols, groups, kinds, extra, group_size, data):
    """W8A8_DYNAMIC / W8A16: a decoder only for a layout that fits, and then the right one."""
    weight = TensorInfo("mtp.layers.0.mlp.down_proj.weight", "/ckpt/x.safetensors", torch.int8,
                        (out, cols))  # fmt: skip
    codes = torch.tensor(
        data.draw(st.lists(st.integers(-128, 127), min_size=out * cols, max_size=out * cols)),
        dtype=torch.int8,
    ).reshape(out, cols)
    companions = {}
    for suffix, kind in zip(("weight_scale", "weight_offset"), kinds, strict=True):
        if kind is None:
            continue
        shape = _shape_for(kind, out, cols, groups, extra)
        n = int(torch.Size(shape).numel())
        values = data.draw(st.lists(floats, min_size=n, max_size=n))
        companions[suffix] = torch.tensor(values, dtype=torch.float32).reshape(shape)
    scale = _layout(companions["weight_scale"], out, cols, group_size)
    offset = companions.get("weight_offset")
    offset_layout = _layout(offset, out, cols, group_size) if offset is not None else None
    fits = (
        scale is not None
        and bool(torch.isfinite(scale[0]).all() and (scale[0] > 0).all())
        and (
            offset is None
            or offset_layout is not None
            and offset_layout[1] == scale[1]
            and bool(torch.isfinite(offset_layout[0]).all())
        )
    )
    try:
        decoder = AffineInt8().prepare(weight, companions, group_size)
    except DraftWeightError as exc:
        assert exc.tensor == weight.name and exc.file == weight.file and exc.hint
        assert not fits, f"refused a layout that fits: {companions} ({exc})"
        return
    assert fits, f"accepted a layout that fits no reading: {companions}"
    want = codes.float()
    if offset_layout is not None:
        want = want - offset_layout[0]
    want = want * scale[0]
    assert torch.equal(decoder.decompress(codes, torch.float32), want)


@PROPERTY
@given(
    out=st.integers(1, 6),
    deq=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=7),
    deq_kind=st.sampled_from(["f32", "i64", "i32", "bf16"]),
    input_scale=st.lists(floats, min_size=0, max_size=2),
)
def test_static_decoder_on_any_deq_scale(out, deq, deq_kind, input_scale):
    """Static W8A8: int64 deq_scale must hold an f32 bit pattern; anything else is refused."""
    weight = TensorInfo("mtp.layers.0.mlp.up_proj.weight", "/ckpt/x.safetensors", torch.int8,
                        (out, 4))  # fmt: skip
    codes = torch.arange(out * 4, dtype=torch.int8).reshape(out, 4) - 8
    bits = torch.tensor(deq, dtype=torch.int64)
    deq_scale = {
        "f32": bits.float() * 1e-6,
        "i64": bits,
        "i32": bits.clamp(-(2**31), 2**31 - 1).to(torch.int32),
        "bf16": (bits.float() * 1e-6).to(torch.bfloat16),
    }[deq_kind]
    companions = {"deq_scale": deq_scale, "input_scale": torch.tensor(input_scale)}
    try:
        decoder = StaticInt8().prepare(weight, companions, 0)
    except DraftWeightError as exc:
        assert exc.tensor == weight.name and "What to do: " in str(exc)
        return
    assert deq_kind != "i32" and len(input_scale) == 1 and len(deq) == out
    if deq_kind == "i64":
        assert bool(((bits >= 0) & (bits <= 0xFFFFFFFF)).all())
        f32 = (bits & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    else:
        f32 = deq_scale.float()
    scale = f32 / torch.tensor(input_scale, dtype=torch.float32).reshape(())
    assert bool((scale > 0).all()) and bool(torch.isfinite(scale).all())
    want = codes.float() * scale.reshape(out, 1)
    assert torch.equal(decoder.decompress(codes, torch.float32), want)


@pytest.mark.parametrize("shape", [(1, 6), (2, 3), (3, 2), (6, 1, 1), (24,), (6, 3)])
def test_scale_of_rows_values_in_no_per_row_layout_is_refused(shape):
    """6 values for 6 rows, but laid out (1, out), block-wise or 3-D: refused, not guessed."""
    weight = TensorInfo("mtp.x.weight", "/ckpt/x.safetensors", torch.int8, (6, 4))
    scale = torch.full(shape, 0.01)
    with pytest.raises(DraftWeightError, match=r"fits neither per-channel"):
        AffineInt8().prepare(weight, {"weight_scale": scale}, 0)


def test_streamed_codes_of_another_shape_are_refused():
    """A decoder built from the header refuses codes that arrive in another shape."""
    weight = TensorInfo("mtp.x.weight", "/ckpt/x.safetensors", torch.int8, (4, 8))
    decoder = AffineInt8().prepare(weight, {"weight_scale": torch.ones(4, 1)}, 0)
    try:
        decoder.decompress(torch.zeros(8, 4, dtype=torch.int8), torch.bfloat16)
    except DraftWeightError as exc:
        assert exc.tensor == "mtp.x.weight" and "[8, 4]" in exc.problem
    else:
        raise AssertionError("a (8, 4) stream for a (4, 8) header was decoded")


def test_unsigned_weights_are_not_planned_as_float():
    """U16/U32/U64 tags are integer codes, not "a dtype torch has no name for"."""
    for tag, size in (("U16", 2), ("U32", 4), ("U64", 8)):
        entries = {"mtp.fc.weight": {"dtype": tag, "shape": [2, 2], "data_offsets": [0, 4 * size]}}
        folder = fresh_copy({SHARD: _header_file(entries, b"\1" * 4 * size), INDEX: None})
        ckpt = open_checkpoint(folder, wanted=IS_DRAFT)
        assert ckpt.tensors["mtp.fc.weight"].is_integer
        (entry,) = DequantPlan.build(ckpt).entries.values()
        assert entry.action == "error"
        with safe_open(os.path.join(folder, SHARD), framework="pt") as handle:
            assert not handle.get_tensor("mtp.fc.weight").is_floating_point()


def test_index_shard_name_with_a_nul_byte_is_a_clear_error():
    index = {"weight_map": {"mtp.fc.weight": "a\x00b.safetensors"}}
    folder = fresh_copy({INDEX: json.dumps(index).encode()})
    assert open_or_clear_error(folder) is None
