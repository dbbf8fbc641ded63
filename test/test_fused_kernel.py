"""The one-pass bf16 kernel (``schemes/fused_bf16.py``, numba) gives the torch path's bits.

Every fixture load in the other tests already runs through the kernel (their drafts are bf16)
and is compared bit for bit with the fp32 formula; these tests go where fixtures do not:
rounding ties, subnormal and overflowing products, int16 codes, many groups, any thread
count, and what happens where numba cannot run (NUMBA_DISABLE_JIT, run in a subprocess) or
is never needed (a checkpoint with nothing to decode must not import it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fixture_dir
from sglang_mtp_dequant.schemes import AffineDecoder, fused_bf16

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)


def decoder(shape, scale, offset=None) -> AffineDecoder:
    return AffineDecoder("mtp.layers.0.mlp.down_proj.weight", "<test>", shape, scale, offset)


def both_paths(dec: AffineDecoder, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kernel = dec.decompress(codes, torch.bfloat16)
    torch_path = dec.decompress(codes, torch.bfloat16, fused=False)
    return kernel.view(torch.int16), torch_path.view(torch.int16)


def formula_bf16(codes, scale, offset, groups) -> torch.Tensor:
    """Independent of both paths: the whole fp32 formula at once, then one rounding."""
    rows, cols = codes.shape
    x = codes.to(torch.float32).view(rows, groups, cols // groups)
    if offset is not None:
        x = x - offset[:, :, None]
    return (x * scale[:, :, None]).view(rows, cols).to(torch.bfloat16).view(torch.int16)


def test_kernel_runs_here():
    """Otherwise the comparisons below would compare the torch path with itself."""
    codes = torch.arange(-128, 128, dtype=torch.int8).view(2, 128)
    out = fused_bf16.decode(codes, torch.ones(2, 1), None)
    assert out is not None and out.dtype == torch.bfloat16
    assert torch.equal(out, codes.to(torch.bfloat16))


def test_rounding_ties_go_to_even():
    """Products exactly halfway between two bf16 values (low 16 bits 0x8000) round to the
    even one; a carry into the exponent (0x3FFF8000 -> 0x4000) is covered too."""
    halfway = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 2.0 - 2**-8, -(1.0 + 2**-8)])
    scale = halfway.view(4, 1)
    codes = torch.tensor([[1, 2, 3, -1, 127, -128, 0, 5]] * 4, dtype=torch.int8)
    kernel, torch_path = both_paths(decoder((4, 8), scale), codes)
    assert torch.equal(kernel, torch_path)
    assert kernel[0, 0] == torch.tensor(1.0, dtype=torch.bfloat16).view(torch.int16)  # even
    assert kernel[1, 0] == torch.tensor(1.015625, dtype=torch.bfloat16).view(torch.int16)
    assert kernel[2, 0] == torch.tensor(2.0, dtype=torch.bfloat16).view(torch.int16)  # carry


def test_subnormal_and_overflowing_products():
    scale = torch.tensor([[1e-40], [1e-45], [3e38], [1.0]])  # subnormal, smallest, overflow
    offset = torch.tensor([[0.5], [-0.5], [1.0], [-3e38]])
    codes = torch.randint(-128, 128, (4, 64), dtype=torch.int8, generator=torch.manual_seed(0))
    kernel, torch_path = both_paths(decoder((4, 64), scale, offset), codes)
    assert torch.equal(kernel, torch_path)
    assert torch.isinf(kernel.view(torch.bfloat16)[2]).any()


@PROPERTY
@given(
    rows=st.integers(1, 40),
    groups=st.sampled_from([1, 2, 4, 8]),
    width=st.integers(1, 48),
    wide_codes=st.booleans(),
    with_offset=st.booleans(),
    exponent=st.integers(-30, 30),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernel_equals_torch_path_and_formula(
    rows, groups, width, wide_codes, with_offset, exponent, seed
):
    """int8 and int16 codes (the two-stage int4 scheme hands int16), per-row and per-group
    scales, with and without offset, scales over 60 binades."""
    gen = torch.Generator().manual_seed(seed)
    cols = groups * width
    if wide_codes:
        codes = torch.randint(-1000, 1000, (rows, cols), dtype=torch.int16, generator=gen)
    else:
        codes = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    scale = (torch.rand((rows, groups), generator=gen) + 0.5) * 2.0**exponent
    offset = torch.randn((rows, groups), generator=gen) * 8 if with_offset else None
    kernel, torch_path = both_paths(decoder((rows, cols), scale, offset), codes)
    assert torch.equal(kernel, torch_path)
    assert torch.equal(kernel, formula_bf16(codes, scale, offset, groups))


@pytest.mark.parametrize("threads", [1, 2])
def test_tensor_split_over_threads(threads):
    """A tensor large enough to be split into chunks of rows decodes the same on any count,
    rows not dividing evenly; 3-D (fused experts) shapes keep their shape."""
    gen = torch.Generator().manual_seed(7)
    shape = (3, 1001, 512)  # 1.5 M codes: more than one chunk
    codes = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    scale = torch.rand((3003, 4), generator=gen) * 1e-2 + 1e-4
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel, torch_path = both_paths(decoder(shape, scale), codes)
    finally:
        torch.set_num_threads(before)
    assert kernel.shape == shape
    assert torch.equal(kernel, torch_path)


def test_fp32_and_fp16_drafts_take_the_torch_path():
    """The kernel writes bf16 only; other dtypes must still be one fp32 rounding."""
    codes = torch.randint(-128, 128, (8, 32), dtype=torch.int8, generator=torch.manual_seed(1))
    scale = torch.rand(8, 1) * 0.01 + 1e-4
    dec = decoder((8, 32), scale)
    assert torch.equal(dec.decompress(codes, torch.float32), codes.float() * scale)
    assert torch.equal(dec.decompress(codes, torch.float16), (codes.float() * scale).half())


def run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_without_jit_it_falls_back_to_torch_with_one_warning():
    """NUMBA_DISABLE_JIT would turn the kernel into a Python loop (minutes per tensor): the
    decoder uses torch instead, says so once, and the bits are unchanged."""
    script = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from sglang_mtp_dequant.schemes import AffineDecoder, fused_bf16\n"
        "codes = torch.randint(-128, 128, (64, 64), dtype=torch.int8)\n"
        "scale = torch.rand(64, 1) + 0.01\n"
        "dec = AffineDecoder('w', 'f', (64, 64), scale, None)\n"
        "assert fused_bf16.decode(codes, scale, None) is None\n"
        "for _ in range(2):\n"
        "    got = dec.decompress(codes, torch.bfloat16)\n"
        "    assert torch.equal(got, (codes.float() * scale).bfloat16())\n"
        "print('OK')\n"
    )
    out = run_python(script, NUMBA_DISABLE_JIT="1")
    assert out.stdout.strip() == "OK"
    warnings = [line for line in out.stderr.splitlines() if "sglang-mtp-dequant" in line]
    assert len(warnings) == 1 and "NUMBA_DISABLE_JIT is set" in warnings[0], out.stderr


def test_nothing_to_decode_never_imports_numba():
    """A float draft through the hooked load_weights (sglang's classes, plugins loaded by
    sglang): numba is imported by neither the plugin nor the load."""
    folder = fixture_dir("q35_dense_float_mtp")
    script = (
        "import sys\n"
        "from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, prepare_cpu_process, "
        "publish_context\n"
        f"prepare_cpu_process({folder!r})\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        f"publish_context({folder!r})\n"
        f"builder = CpuDraftBuilder({folder!r})\n"
        "model = builder.build_draft()\n"
        "before = 'numba' in sys.modules\n"
        "type(model).load_weights(model, builder.weights())\n"
        "assert hasattr(type(model).load_weights, '__wrapped__')\n"
        "print(before, 'numba' in sys.modules)\n"
    )
    out = run_python(script)
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_quantized_load_warms_the_kernel_in_the_background():
    """A fresh process: the hooked load of the W8A8_DYNAMIC fixture starts the warm-up before
    it reads the first tensor of sglang's stream (so numba's start-up overlaps the stream)."""
    folder = fixture_dir("q35_dense_w8a8_dynamic")
    script = (
        "import torch\n"
        "from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, prepare_cpu_process, "
        "publish_context\n"
        f"prepare_cpu_process({folder!r})\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang_mtp_dequant.schemes import fused_bf16\n"
        f"publish_context({folder!r})\n"
        f"builder = CpuDraftBuilder({folder!r})\n"
        "model = builder.build_draft()\n"
        "seen = []\n"
        "def stream():\n"
        "    for item in builder.weights():\n"
        "        seen.append(fused_bf16._warm_up_started.is_set())\n"
        "        yield item\n"
        "type(model).load_weights(model, stream())\n"
        "print(seen[0], len(seen))\n"
    )
    out = run_python(script)
    first_seen, streamed = out.stdout.strip().splitlines()[-1].split()
    assert first_seen == "True" and int(streamed) > 1


def test_warm_up_starts_before_the_target_loads_only_for_a_quantized_draft():
    """sglang's real ``ModelRunner.load_model`` carries the plugin's BEFORE hook; the hook
    starts the warm-up only when speculative decoding is on and the draft checkpoint holds
    draft weights to dequantize (one process, the cases in an order where a wrong start
    would show: two that must not start it, then the one that must)."""
    quantized = fixture_dir("q35_dense_w8a8_dynamic")
    float_mtp = fixture_dir("q35_dense_float_mtp")
    script = (
        "import sys, threading\n"
        "from sglang_mtp_dequant.cpu_sglang import prepare_cpu_process, publish_context\n"
        f"prepare_cpu_process({quantized!r})\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.model_executor.model_runner import ModelRunner\n"
        "from sglang_mtp_dequant import plugin\n"
        "from sglang_mtp_dequant.schemes import fused_bf16\n"
        "assert hasattr(ModelRunner.load_model, '__wrapped__')\n"
        "assert plugin.WARM_UP_TARGET in plugin.registered_targets()\n"
        "eagle = dict(speculative_algorithm='EAGLE', speculative_num_steps=3,\n"
        "             speculative_eagle_topk=1, speculative_num_draft_tokens=4)\n"
        f"for folder, spec in (({float_mtp!r}, eagle), ({quantized!r}, {{}}),\n"
        f"                     ({quantized!r}, eagle)):\n"
        "    publish_context(folder, **spec)\n"
        "    assert plugin.warm_up_before_model_load(object()) is None\n"
        "    for thread in threading.enumerate():\n"
        "        if thread.name == 'mtp-dequant-warm-up':\n"
        "            thread.join()\n"
        "    print(fused_bf16._warm_up_started.is_set(), 'numba' in sys.modules)\n"
    )
    out = run_python(script)
    assert out.stdout.strip().splitlines()[-3:] == ["False False", "False False", "True True"]
