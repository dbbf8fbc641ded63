"""The CPU stand-ins of ``make e2e``'s servers (``e2e/site/``), each against a reference
that does not share its code.

The stand-ins exist only because the hardware they stand in for is absent: the Ascend kernels
sglang's ModelSlim linear method calls, two NPU-platform conditions of sglang's ModelSlim path,
and the checks that stop sglang's Gated DeltaNet Triton kernels under Triton's interpreter.
The kernels' arithmetic is checked here against numpy and against a float matmul; sglang's own
linear method, config and loader are run through them; the GDN kernels of sglang are run under
the interpreter against transformers' torch implementation of the same layer. Anything that
installs a shim into sglang runs in a subprocess (the shims patch sglang modules for the
process), started with the servers' ``PYTHONPATH`` (``site/`` first, so ``sitecustomize.py``
installs everything as in a server), or without it for the control.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import e2e_shim_npu_ops as npu_ops
import numpy as np
import pytest
import torch

from support.paths import E2E, ROOT

SITE = os.path.join(ROOT, "e2e", "site")

MARK = "sglang-mtp-dequant e2e shim:"


def run_python(code: str, *, shims: bool, interpret: bool = False, timeout: float = 600.0):
    """``code`` in a fresh interpreter: with the servers' shims (``site/`` on PYTHONPATH, so
    ``sitecustomize`` runs first) or without them."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    if shims:
        env["PYTHONPATH"] = SITE
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def result_of(out) -> dict:
    """The JSON the subprocess printed on its last stdout line."""
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- npu_dynamic_quant / npu_quant_matmul: the arithmetic --------------------------------------


def numpy_dynamic_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CANN's documented formula in float32 numpy: scale = row_max(|x|) / 127, y = round(x /
    scale) (numpy's rint: ties to even)."""
    scale = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint(x / safe[:, None]), -128, 127).astype(np.int8)
    return codes, scale


def test_dynamic_quant_is_cann_per_token_formula():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((33, 192)) * rng.uniform(0.01, 30, (33, 1))).astype(np.float32)
    x[5] = 0.0  # an all-zero token: codes 0, scale 0
    x[7, 3] = -x[7].__abs__().max() * 2  # the row's extreme is negative: code -127
    codes, scale = npu_ops.dynamic_quant(torch.from_numpy(x))
    want_codes, want_scale = numpy_dynamic_quant(x)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.shape == (33,)
    np.testing.assert_array_equal(scale.numpy(), want_scale)
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    assert codes[5].abs().max() == 0 and scale[5] == 0
    assert codes[7, 3] == -127 and codes.abs().max() == 127


def test_quant_matmul_accumulates_integers_exactly():
    """Unit scales: the int8 product itself, against numpy's int64 matmul, bit for bit; with
    a K large enough that float32 accumulation would round."""
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (9, 4096), dtype=np.int8)
    b = rng.integers(-128, 128, (4096, 24), dtype=np.int8)
    a[0], b[:, 0] = 127, 127  # 127*127*4096 = 66 M > 2**24: float32 sums would round
    got = npu_ops.quant_matmul(
        torch.from_numpy(a),
        torch.from_numpy(b),
        torch.ones(24),
        pertoken_scale=torch.ones(9),
        output_dtype=torch.float64,
    )
    exact = a.astype(np.int64) @ b.astype(np.int64)
    # the kernel hands the int32 accumulator to float32 before scaling, as the NPU does
    np.testing.assert_array_equal(got.numpy(), exact.astype(np.float32).astype(np.float64))
    assert exact[0, 0] == 127 * 127 * 4096


def test_quant_matmul_scales_and_biases():
    """Per-channel and per-token scales against float64 numpy; an int32 bias joins the
    accumulator (static W8A8's quant_bias), a float bias is added after scaling."""
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (5, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (64, 7), dtype=np.int8)
    channel = rng.uniform(1e-4, 1e-2, 7).astype(np.float32)
    token = rng.uniform(1e-3, 1e-1, 5).astype(np.float32)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    int_bias = rng.integers(-1000, 1000, 7).astype(np.int32)
    float_bias = rng.standard_normal(7).astype(np.float32)

    def run(**kw):
        return npu_ops.quant_matmul(
            torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(channel),
            output_dtype=torch.float32, **kw,
        ).numpy()  # fmt: skip

    per_token = run(pertoken_scale=torch.from_numpy(token))
    np.testing.assert_allclose(per_token, acc * channel[None] * token[:, None], rtol=3e-7)
    with_int_bias = run(bias=torch.from_numpy(int_bias))
    np.testing.assert_allclose(with_int_bias, (acc + int_bias) * channel[None], rtol=3e-7)
    with_float_bias = run(bias=torch.from_numpy(float_bias))
    np.testing.assert_allclose(with_float_bias, acc * channel[None] + float_bias, rtol=1e-6)


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: npu_ops.dynamic_quant(torch.ones(2, 4), smooth_scales=torch.ones(4)), "smooth"),
        (lambda: npu_ops.dynamic_quant(torch.ones(2, 8), dst_type=torch.quint4x2), "dst_type"),
        (
            lambda: npu_ops.quant_matmul(
                torch.ones(2, 4, dtype=torch.int8),
                torch.ones(4, 3, dtype=torch.int8),
                torch.ones(3),
                output_dtype=None,
            ),
            "an int8 output",
        ),  # fmt: skip
        (
            lambda: npu_ops.quant_matmul(
                torch.ones(2, 4, dtype=torch.int8),
                torch.ones(4, 3, dtype=torch.int8),
                torch.ones(3),
                offset=torch.ones(3),
                output_dtype=torch.float32,
            ),
            "offset",
        ),  # fmt: skip
    ],
    ids=["smooth-scales", "int4", "int8-output", "offset"],
)
def test_what_the_stand_ins_do_not_compute_raises(call, said):
    with pytest.raises(NotImplementedError, match=said):
        call()


# -- the ops registered, and sglang's own linear method through them ---------------------------

LINEAR_METHOD = """
    import json, sys, torch
    from torch import nn
    import sglang.srt.layers.quantization.modelslim.modelslim  # sglang's own import order
    from sglang.srt.hardware_backend.npu.quantization.linear_method_npu import (
        NPUW8A8Int8DynamicLinearMethod,
    )
    torch.manual_seed(0)
    out_features, in_features, tokens = 24, 96, 5
    weight = torch.randn(out_features, in_features) * 0.05
    scale = weight.abs().amax(1, keepdim=True) / 127
    codes = torch.round(weight / scale).to(torch.int8)
    layer = nn.Module()
    layer.weight = nn.Parameter(codes.clone(), requires_grad=False)
    layer.weight_scale = nn.Parameter(scale.clone(), requires_grad=False)
    layer.weight_offset = nn.Parameter(torch.zeros_like(scale), requires_grad=False)
    method = NPUW8A8Int8DynamicLinearMethod()
    method.process_weights_after_loading(layer)   # sglang's own: transpose, NZ cast (a no-op)
    x = torch.randn(tokens, in_features) * 3
    y = method.apply(layer, x)                    # sglang's own apply -> torch.ops.npu.*
    dequant = codes.to(torch.float64) * scale.to(torch.float64)
    reference = x.to(torch.float64) @ dequant.T
    # per-token int8 of x moves each product by at most half an activation step
    step = x.abs().amax(1, keepdim=True).to(torch.float64) / 127
    bound = (step / 2) * dequant.abs().sum(1)[None, :] + 1e-5
    print(json.dumps({
        "dtype": str(y.dtype), "shape": list(y.shape),
        "max_error_over_bound": float(((y.double() - reference).abs() / bound).max()),
        "max_error": float((y.double() - reference).abs().max()),
    }))
"""


def test_sglang_w8a8_dynamic_linear_method_runs_through_the_stand_ins():
    """sglang's ``NPUW8A8Int8DynamicLinearMethod`` (``process_weights_after_loading`` and
    ``apply``, unchanged) on the CPU: its output is the float matmul with the dequantized
    weight, within the activation quantization bound; both stand-ins announced themselves."""
    out = run_python(LINEAR_METHOD, shims=True)
    result = result_of(out)
    assert result["dtype"] == "torch.float32" and result["shape"] == [5, 24]
    assert 0 < result["max_error_over_bound"] <= 1.0, result
    for op in ("npu_dynamic_quant", "npu_quant_matmul"):
        assert f"{MARK} torch.ops.npu.{op} ran on the CPU stand-in" in out.stderr


def test_without_the_stand_ins_sglangs_linear_method_cannot_run_here():
    """The control: no torch_npu and no stand-in, so sglang's linear method stops."""
    code = "from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable\n"
    code += "ensure_torchvision_importable()\n" + textwrap.dedent(LINEAR_METHOD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode != 0
    assert "npu_dynamic_quant" in out.stderr.splitlines()[-1], out.stderr[-2000:]


# -- ModelSlimConfig: float32, and sglang's NPU packed-module mapping --------------------------

QUANT_METHODS = """
    import json, sys, torch
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable
    ensure_torchvision_importable()
    from sglang_mtp_dequant.tools import cpu_sglang
    from sglang_mtp_dequant.serving import sglang_private
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import loader
    from sglang.srt.layers.linear import (
        MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear,
    )
    get_config = loader._get_quantization_config
    results = []
    # (folder, with sglang's NPU mapping): the mapping is added to the model class once and
    # for good (as on NPU), so the case without it comes first
    for folder, npu_mapping in CASES:
        cpu_sglang.prepare_cpu_process(folder, quantization="modelslim", dtype="float32")
        model_config = ModelConfig.from_server_args(
            sglang_private.published_server_args(), model_path=folder
        )
        # the shim's wrapper, or (its control) the function it wraps: sglang's CPU branch
        build = get_config if npu_mapping else getattr(get_config, "__wrapped__", get_config)
        try:
            config = build(model_config, LoadConfig(load_format="auto"))
        except ValueError as exc:
            results.append({"refused": str(exc)})
            continue
        text = json.load(open(folder + "/config.json"))
        hidden, heads, kv, head_dim = (text[k] for k in (
            "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
        layers = {
            "model.layers.3.self_attn.qkv_proj":
                lambda p: QKVParallelLinear(hidden, head_dim, heads * 2, kv, bias=False,
                                            quant_config=config, prefix=p),
            "model.layers.3.mlp.gate_up_proj":
                lambda p: MergedColumnParallelLinear(hidden, [64, 64], bias=False,
                                                     quant_config=config, prefix=p),
            "model.layers.3.self_attn.o_proj":
                lambda p: RowParallelLinear(heads * head_dim, hidden, bias=False,
                                            quant_config=config, prefix=p),
            "model.layers.0.linear_attn.in_proj_qkvz":
                lambda p: MergedColumnParallelLinear(hidden, [64, 64, 128, 128], bias=False,
                                                     quant_config=config, prefix=p),
            "model.layers.0.linear_attn.in_proj_ba":
                lambda p: MergedColumnParallelLinear(hidden, [4, 4], bias=False,
                                                     quant_config=config, prefix=p),
            "model.layers.0.linear_attn.out_proj":
                lambda p: RowParallelLinear(128, hidden, bias=False, quant_config=config,
                                            prefix=p),
        }
        methods = {}
        for prefix, make in layers.items():
            layer = make(prefix)
            scheme = getattr(layer, "scheme", None)
            methods[prefix] = [type(layer.quant_method).__name__, type(scheme).__name__]
        results.append({
            "nested_mapping": config.packed_modules_mapping.get("model", {}),
            "methods": methods,
        })
    print(json.dumps(results))
"""
W8A8, Q36 = os.path.join(E2E, "w8a8"), os.path.join(E2E, "hybrid_qwen36_recipe")
W8A8_SCHEME = ["ModelSlimLinearMethod", "ModelSlimW8A8Int8"]


def quant_methods(cases: list[tuple[str, bool]], shims: bool) -> list[dict]:
    code = f"CASES = {cases!r}\n" + textwrap.dedent(QUANT_METHODS)
    return result_of(run_python(code, shims=shims))


@pytest.fixture(scope="module")
def with_shims() -> list[dict]:
    """The W8A8 fixture without and with the NPU mapping, the Qwen3.6-recipe one with it."""
    return quant_methods([(W8A8, False), (W8A8, True), (Q36, True)], shims=True)


def test_modelslim_target_in_float32_is_refused_without_the_shim():
    """sglang's loader refuses float32 for ModelSlim (``get_supported_act_dtypes``)."""
    (result,) = quant_methods([(W8A8, True)], shims=False)
    assert "float32 is not supported for quantization method modelslim" in result["refused"]


def test_the_npu_mapping_gives_fused_projections_their_scheme(with_shims):
    """float32 allowed, the W8A8_DYNAMIC fixture's fused ``qkv_proj`` / ``gate_up_proj``: with
    ``_get_quantization_config`` run as on NPU they get sglang's ModelSlim W8A8 scheme, as the
    description says their q/k/v and gate/up shards are; with sglang's CPU branch (the
    control) they get the unquantized method, i.e. the raw codes would load as weights.
    ``o_proj`` (not fused) has its scheme either way."""
    with open(os.path.join(W8A8, "quant_model_description.json")) as handle:
        description = json.load(handle)
    assert description["model.layers.3.self_attn.q_proj.weight"] == "W8A8_DYNAMIC"
    assert description["model.layers.3.mlp.up_proj.weight"] == "W8A8_DYNAMIC"
    cpu_branch, npu_branch = with_shims[0], with_shims[1]
    assert "model" not in cpu_branch["nested_mapping"]
    assert npu_branch["nested_mapping"]["qkv_proj"] == ["q_proj", "k_proj", "v_proj"]
    for prefix in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        key = f"model.layers.3.{prefix}"
        assert cpu_branch["methods"][key][0] == "UnquantizedLinearMethod", cpu_branch
        assert npu_branch["methods"][key] == W8A8_SCHEME, npu_branch
    for branch in (cpu_branch, npu_branch):
        assert branch["methods"]["model.layers.3.self_attn.o_proj"] == W8A8_SCHEME


def test_sglangs_npu_mapping_does_not_cover_quantized_gdn_projections(with_shims):
    """The Qwen3.6-27B recipe's export of the hybrid model (msmodelslim 26.1.0; fixture
    ``hybrid_qwen36_recipe``) quantizes ``linear_attn.in_proj_qkv`` / ``in_proj_z``. sglang
    fuses them into ``in_proj_qkvz``, which its NPU packed-module mapping (the one sglang
    adds on NPU, applied here) does not name: the fused layer gets the unquantized method
    although both shards are W8A8_DYNAMIC, so its int8 codes would load as weights. The
    float ``in_proj_ba`` / ``out_proj`` stay unquantized, correctly."""
    with open(os.path.join(Q36, "quant_model_description.json")) as handle:
        description = json.load(handle)
    assert description["model.layers.0.linear_attn.in_proj_qkv.weight"] == "W8A8_DYNAMIC"
    assert description["model.layers.0.linear_attn.in_proj_z.weight"] == "W8A8_DYNAMIC"
    assert description["model.layers.0.linear_attn.out_proj.weight"] == "FLOAT"
    result = with_shims[2]
    assert "in_proj_qkvz" not in result["nested_mapping"]
    methods = result["methods"]
    for projection in ("in_proj_qkvz", "in_proj_ba", "out_proj"):
        key = f"model.layers.0.linear_attn.{projection}"
        assert methods[key][0] == "UnquantizedLinearMethod", methods
    assert methods["model.layers.3.self_attn.qkv_proj"] == W8A8_SCHEME


# -- Gated DeltaNet: sglang's Triton kernels under the interpreter -----------------------------

GDN_KERNELS = """
    import json, torch
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable
    ensure_torchvision_importable()
    from sglang.kernels.ops.attention.fla.chunk import chunk_gated_delta_rule
    from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_gated
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        Qwen3_5RMSNormGated, torch_chunk_gated_delta_rule,
    )
    torch.manual_seed(0)
    T, H, K, V = 37, 2, 32, 32
    q, k = torch.randn(1, T, H, K), torch.randn(1, T, H, K)
    v = torch.randn(1, T, H, V)
    g = -torch.rand(1, T, H) * 0.5                        # log decay, <= 0
    beta = torch.rand(1, T, H)
    state = torch.zeros(1, H, V, K)                        # sglang's pool layout [N, H, V, K]
    o, _, _ = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=state,
        initial_state_indices=torch.tensor([0]), cu_seqlens=torch.tensor([0, T]),
        use_qk_l2norm_in_kernel=True,
    )
    want, final = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=None, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    x, z = torch.randn(T * H, V), torch.randn(T * H, V)
    norm = Qwen3_5RMSNormGated(V, eps=1e-6)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    got_norm = rms_norm_gated(x=x, weight=norm.weight.detach(), bias=None, z=z, eps=1e-6,
                              norm_before_gate=True, is_rms_norm=True)
    want_norm = norm(x, z).detach()
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import (
        fused_mamba_state_scatter_with_mask,
    )
    dst, src = torch.zeros(2, 5, 3, 4), torch.randn(2, 3, 4, 3, 4)
    dst_rows, steps = torch.tensor([4, 1, 2]), torch.tensor([2, -1, 0])
    fused_mamba_state_scatter_with_mask(dst, src, dst_rows, steps)
    # its docstring: for each valid i (step >= 0), dst[:, dst_rows[i]] = src[:, i, steps[i]]
    want_dst = torch.zeros_like(dst)
    want_dst[:, 4], want_dst[:, 2] = src[:, 0, 2], src[:, 2, 0]
    print(json.dumps({
        "scatter_equal": bool(torch.equal(dst, want_dst)),
        "chunk_error": float((o - want).abs().max()),
        "chunk_scale": float(want.abs().max()),
        "state_error": float((state[0].transpose(-1, -2) - final[0]).abs().max()),
        "norm_error": float((got_norm - want_norm).abs().max()),
    }))
"""


@pytest.mark.slow
def test_sglangs_gdn_kernels_under_the_interpreter_match_transformers():
    """sglang's FLA chunk gated delta rule (the core of a Qwen3.5 linear-attention layer) and
    its gated RMSNorm, as Triton kernels under the interpreter in float32 with the GDN fixes,
    against transformers' torch implementation: outputs and the final recurrent state (written
    in place into sglang's state pool) agree to float32 rounding; sglang's EAGLE mamba state
    scatter does what its docstring says; each fix announced itself."""
    out = run_python(GDN_KERNELS, shims=True, interpret=True, timeout=900)
    result = result_of(out)
    assert result["chunk_error"] <= 1e-4 * max(1.0, result["chunk_scale"]), result
    assert result["state_error"] <= 1e-4, result
    assert result["norm_error"] <= 1e-5, result
    assert result["scatter_equal"], result
    for fix in ("float32-chunk", "fla-device-ctx", "autotune-one-config", "fla-op-aliases",
                "sm-count", "device-context", "scatter-device-check"):  # fmt: skip
        assert f"{MARK} gdn fix {fix}:" in out.stderr, (fix, out.stderr[-3000:])


def test_recompile_changes_exactly_the_named_text(tmp_path):
    """``recompile`` redefines a function from its own source with one text replaced (its
    decorator applied again, its line numbers kept); a text not found exactly once raises
    instead of guessing."""
    import importlib.util
    import traceback

    import e2e_shim_gdn

    source = tmp_path / "fake_module.py"
    source.write_text(
        "import functools\n\n\n@functools.lru_cache\ndef f(x):\n"
        "    assert x > 0, 'positive only'\n    return 1 // (x + 1)\n"
    )
    spec = importlib.util.spec_from_file_location("fake_module", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(AssertionError):
        module.f(-1)
    e2e_shim_gdn.recompile(module, "f", "assert x > 0, 'positive only'", "pass")
    assert module.f(1) == 0
    assert module.f.cache_info().currsize == 1  # lru_cache applied to the new function
    with pytest.raises(ZeroDivisionError) as raised:
        module.f(-1)
    assert traceback.extract_tb(raised.tb)[-1].lineno == 7  # sglang's line numbers
    with pytest.raises(RuntimeError, match="holds 0 copies"):
        e2e_shim_gdn.recompile(module, "f", "no such text", "pass")
