"""Target layers sglang builds unquantized over quantized codes (``serving/target_layers.py``),
on sglang's real ``Qwen3_5ForCausalLM`` loaded by its own ``DefaultModelLoader``.

The checkpoints: msmodelslim 26.1.0's Qwen3.6-27B recipe export of the bundled hybrid model
(``hybrid_qwen36_recipe``: ``linear_attn.in_proj_qkv`` / ``in_proj_z`` W8A8_DYNAMIC in its three
Gated DeltaNet layers), its Qwen3.5-27B recipe export (``hybrid_w8a8``: every GDN projection
FLOAT) and the dense W8A8_DYNAMIC fixture (``w8a8``). Each load runs in a fresh interpreter with
the servers' ``site/`` shims, as a server on NPU would build it: sglang's NPU packed-module
mapping applied by ``_get_quantization_config`` and the Ascend kernels of the W8A8_DYNAMIC linear
method on their CPU stand-ins (``e2e_shim_npu_ops``, themselves checked in
``test_e2e_shims.py``); the plugin's hooks are registered with sglang's own ``HookRegistry``, or
not (stock sglang). The layer's output is checked against a decode written here from the
checkpoint's tensors: ``(q - offset) * scale`` in float64 and CANN's per-token int8 formula in
numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import numpy as np
import pytest
from safetensors.torch import load_file as load_torch
from test_e2e_shims import numpy_dynamic_quant, result_of, run_python

from support.paths import E2E

Q36, Q35, DENSE = (os.path.join(E2E, n) for n in ("hybrid_qwen36_recipe", "hybrid_w8a8", "w8a8"))
FLOAT = os.path.join(E2E, "hybrid_float")
GDN = "model.layers.{}.linear_attn.{}"

LOAD = """
    import json, logging, sys, torch
    import numpy as np
    from sglang_mtp_dequant.tools import cpu_sglang
    from sglang_mtp_dequant.serving import plugin, sglang_private, target_layers
    from sglang_mtp_dequant.tools.cpu_env import generic_rope_on_cpu, placeholder_vllm_rotary
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.plugins.hook_registry import HookRegistry

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    cpu_sglang.prepare_cpu_process(FOLDER, quantization="modelslim", dtype="float32")
    if LATER:
        exec(LATER_SGLANG)
    if PLUGIN:
        plugin.register()
        HookRegistry.apply_hooks()
    model_config = ModelConfig.from_server_args(
        sglang_private.published_server_args(), model_path=FOLDER
    )
    configs = []  # the quant config the loader built (through the hooks, if registered)
    import importlib
    module_name, _, attribute = sglang_private.QUANTIZATION_CONFIG_TARGET.rpartition(".")
    loader_module = importlib.import_module(module_name)
    hooked = getattr(loader_module, attribute)
    setattr(loader_module, attribute, lambda *a: configs.append(hooked(*a)) or configs[-1])
    loader = DefaultModelLoader(LoadConfig(load_format="auto"))
    try:
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            model = loader.load_model(model_config=model_config, device_config=DeviceConfig("cpu"))
    except Exception as exc:
        print(json.dumps({"refused": type(exc).__name__, "message": str(exc)}))
        sys.exit(0)
    config = configs[-1]
    layers = {}
    torch.manual_seed(0)
    x = torch.randn(5, model_config.hf_config.hidden_size) * 2
    for name, module in model.named_modules():
        if not name.endswith(("in_proj_qkvz", "in_proj_ba", "out_proj", "qkv_proj")):
            continue
        entry = {
            "method": type(module.quant_method).__name__,
            "scheme": type(getattr(module, "scheme", None)).__name__,
            "weight": module.weight.detach().double().numpy().tolist(),
        }
        for extra in ("weight_scale", "weight_offset"):
            if hasattr(module, extra):
                entry[extra] = getattr(module, extra).detach().double().numpy().tolist()
        if name.endswith("in_proj_qkvz"):
            entry["output"] = module(x)[0].detach().double().numpy().tolist()
        layers[name] = entry
    print(json.dumps({
        "x": x.double().numpy().tolist(),
        "layers": layers,
        "nested": sorted(config.packed_modules_mapping.get("model", {})),
        "mapping_is_the_class_dict": (
            config.packed_modules_mapping is type(model).packed_modules_mapping
        ),
        "unserved": [u.layer for u in target_layers.unserved_layers(model, config)],
    }))
"""


#: Stands for a later sglang, NOT the code under test: sglang main's ModelSlimConfig resolves a
#: language-model linear layer through its nested mapping merged over the model class's own
#: top-level packed entries (main's modelslim.py: ``get_packed_modules_mapping_subset``,
#: ``iter_packed_linear_prefixes``, the ``is_layer_skipped(prefix, self.packed_modules_mapping)``
#: fallback; pinned by main's test_modelslim_config.py::
#: test_resolves_qwen35_gdn_packed_projections), written here over 0.5.23's own skip check,
#: prefix resolution and scheme table.
LATER_SGLANG = """
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization.modelslim import modelslim as _modelslim
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

_stock_get_quant_method = _modelslim.ModelSlimConfig.get_quant_method

def _later_get_quant_method(self, layer, prefix):
    if not isinstance(layer, LinearBase) or "vision" in prefix or "visual" in prefix:
        return _stock_get_quant_method(self, layer, prefix)
    mapping = self.packed_modules_mapping
    flat = {name: shards for name, shards in mapping.items() if isinstance(shards, list)}
    subset = {**flat, **mapping.get("model", {})}
    if self.is_layer_skipped(prefix, subset):
        return UnquantizedLinearMethod()
    proj = prefix.split(".")[-1]
    for candidate in [prefix] + [prefix.replace(proj, s) for s in subset.get(proj, [])]:
        candidate = self._resolve_quant_prefix(candidate)
        if self.quant_description.get(candidate + ".weight", "") not in ("", "FLOAT"):
            layer.scheme = self.get_linear_scheme(layer, candidate)
            if layer.scheme is not None:
                return _modelslim.ModelSlimLinearMethod(self)
    return UnquantizedLinearMethod()

_modelslim.ModelSlimConfig.get_quant_method = _later_get_quant_method
"""


def load(folder: str, plugin: bool, later: bool = False) -> tuple[dict, str]:
    """sglang's load of ``folder`` as the target, as on NPU: the script's JSON and stderr
    (``later``: with ``LATER_SGLANG``'s resolution in sglang's ModelSlimConfig)."""
    code = (
        f"FOLDER = {folder!r}\nPLUGIN = {plugin!r}\nLATER = {later!r}\n"
        f"LATER_SGLANG = {LATER_SGLANG!r}\n" + textwrap.dedent(LOAD)
    )
    out = run_python(code, shims=True)
    return result_of(out), out.stderr


@pytest.fixture(scope="module")
def qwen36() -> dict[bool, tuple[dict, str]]:
    """The Qwen3.6-recipe export loaded by stock sglang and with the plugin."""
    return {plugin: load(Q36, plugin) for plugin in (False, True)}


def load_file(path: str) -> dict[str, np.ndarray]:
    """A safetensors file as numpy: integers as stored, floats (bf16 included) as float64."""
    return {
        name: (t.double() if t.is_floating_point() else t).numpy()
        for name, t in load_torch(path).items()
    }


def checkpoint() -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for name in sorted(os.listdir(Q36)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(Q36, name)))
    return tensors


def gdn_layers() -> list[int]:
    with open(os.path.join(Q36, "config.json")) as handle:
        types = json.load(handle)["layer_types"]
    return [i for i, kind in enumerate(types) if kind == "linear_attention"]


def test_stock_sglang_loads_the_fused_gdn_projection_as_raw_codes(qwen36):
    """The control: stock sglang on NPU builds ``in_proj_qkvz`` unquantized and copies the int8
    codes of ``in_proj_qkv`` / ``in_proj_z`` into its float weight; the check names exactly
    those layers (and not the float ``in_proj_ba`` / ``out_proj``, nor the quantized qkv_proj)."""
    result, _ = qwen36[False]
    tensors = checkpoint()
    assert "in_proj_qkvz" not in result["nested"]
    assert result["unserved"] == [GDN.format(i, "in_proj_qkvz") for i in gdn_layers()]
    for i in gdn_layers():
        layer = result["layers"][GDN.format(i, "in_proj_qkvz")]
        assert layer["method"] == "UnquantizedLinearMethod"
        codes = np.concatenate(
            [tensors[GDN.format(i, p) + ".weight"] for p in ("in_proj_qkv", "in_proj_z")]
        )
        assert codes.dtype == np.int8
        np.testing.assert_array_equal(np.asarray(layer["weight"]), codes.astype(np.float64))


def test_the_plugin_builds_the_fused_gdn_projection_with_modelslims_w8a8_scheme(qwen36):
    """With the plugin the fused layer gets sglang's ModelSlim W8A8 scheme; its int8 weight,
    ``weight_scale`` and ``weight_offset`` are the checkpoint's two shards, in shard order; the
    float ``in_proj_ba`` stays unquantized; the check finds nothing; one INFO line says what was
    supplied."""
    result, stderr = qwen36[True]
    tensors = checkpoint()
    assert result["unserved"] == []
    assert "in_proj_qkvz" in result["nested"] and "in_proj_ba" not in result["nested"]
    for i in gdn_layers():
        layer = result["layers"][GDN.format(i, "in_proj_qkvz")]
        assert [layer["method"], layer["scheme"]] == ["ModelSlimLinearMethod", "ModelSlimW8A8Int8"]
        shards = [GDN.format(i, p) for p in ("in_proj_qkv", "in_proj_z")]
        codes = np.concatenate([tensors[s + ".weight"] for s in shards])
        # sglang's NPU method stores the weight transposed (in, out) after loading
        np.testing.assert_array_equal(np.asarray(layer["weight"]).T, codes.astype(np.float64))
        for extra in ("weight_scale", "weight_offset"):
            want = np.concatenate([tensors[f"{s}.{extra}"] for s in shards]).reshape(-1)
            np.testing.assert_array_equal(np.asarray(layer[extra]).reshape(-1), want)
        assert result["layers"][GDN.format(i, "in_proj_ba")]["method"] == "UnquantizedLinearMethod"
    lines = [line for line in stderr.splitlines() if "sglang-mtp-dequant:" in line]
    assert len(lines) == 1, lines
    assert "in_proj_qkvz = in_proj_qkv + in_proj_z" in lines[0]


def test_the_fused_gdn_projections_output_equals_an_independent_decode(qwen36):
    """``in_proj_qkvz(x)`` through sglang's W8A8_DYNAMIC method: equal, to float32 rounding, to
    the activation quantized per token (CANN's formula in numpy) times ``(q - offset) * scale``
    in float64; and within the quantization step of the float model's own projection."""
    result, _ = qwen36[True]
    tensors = checkpoint()
    floats = load_file(os.path.join(FLOAT, "model.safetensors"))
    x = np.asarray(result["x"], dtype=np.float32)
    x_codes, x_scale = numpy_dynamic_quant(x)
    x_decoded = x_codes.astype(np.float64) * x_scale.astype(np.float64)[:, None]
    for i in gdn_layers():
        shards = [GDN.format(i, p) for p in ("in_proj_qkv", "in_proj_z")]
        q = np.concatenate([tensors[s + ".weight"] for s in shards]).astype(np.float64)
        scale = np.concatenate([tensors[s + ".weight_scale"] for s in shards]).astype(np.float64)
        offset = np.concatenate([tensors[s + ".weight_offset"] for s in shards]).astype(np.float64)
        weight = (q - offset) * scale
        want = x_decoded @ weight.T
        got = np.asarray(result["layers"][GDN.format(i, "in_proj_qkvz")]["output"])
        rounding = 1e-5 * (np.abs(x_decoded) @ np.abs(weight).T) + 1e-6
        assert np.all(np.abs(got - want) <= rounding), float(np.abs(got - want).max())
        # against the float model: half a weight step and half an activation step per product
        w_float = np.concatenate([floats[s + ".weight"] for s in shards]).astype(np.float64)
        reference = x.astype(np.float64) @ w_float.T
        weight_step = np.abs(x).astype(np.float64).sum(1)[:, None] * scale.reshape(1, -1) / 2
        activation_step = (x_scale.astype(np.float64)[:, None] / 2) * np.abs(weight).sum(1)
        step = weight_step + activation_step
        assert np.all(np.abs(got - reference) <= step + rounding)
        assert np.abs(got - reference).max() > 0  # a quantized layer, not the float weights


@pytest.mark.parametrize("folder", [Q35, DENSE], ids=["qwen35-recipe", "dense-w8a8"])
def test_a_checkpoint_whose_layers_have_their_method_is_untouched(folder):
    """Every linear layer finds its method with stock sglang: the plugin changes no method, no
    weight, no scale, gives sglang's config the class's own mapping object (not a copy), and
    logs nothing about target layers."""
    (stock, _), (with_plugin, stderr) = load(folder, False), load(folder, True)
    assert stock["unserved"] == [] and with_plugin["unserved"] == []
    assert stock["layers"] == with_plugin["layers"]
    assert with_plugin["nested"] == stock["nested"]
    assert with_plugin["mapping_is_the_class_dict"] and stock["mapping_is_the_class_dict"]
    assert "INFO:sglang_mtp_dequant" not in stderr and "WARNING:sglang_mtp_dequant" not in stderr


def described_as(tmp_path, scheme: str, weights: bool) -> str:
    """A copy of the Qwen3.6-recipe export whose ``in_proj_qkv`` / ``in_proj_z`` shards the
    description marks ``scheme`` (with its weight files, or without any)."""
    folder = tmp_path / f"{scheme.lower()}_gdn"
    folder.mkdir()
    for name in os.listdir(Q36):
        if name == "config.json" or (weights and name.startswith("quant_model_weights")):
            shutil.copy(os.path.join(Q36, name), folder)
    with open(os.path.join(Q36, "quant_model_description.json")) as handle:
        description = json.load(handle)
    changed = {
        k: (scheme if ".in_proj_qkv." in k or ".in_proj_z." in k else v)
        for k, v in description.items()
    }
    (folder / "quant_model_description.json").write_text(json.dumps(changed))
    return str(folder)


def test_a_layer_no_method_takes_and_the_plugin_cannot_decode_is_refused_early(tmp_path):
    """``in_proj_qkv`` / ``in_proj_z`` described W8A8SC (msmodelslim's sparse-compressed int8:
    no linear method in sglang's ModelSlim, no decoder in the plugin): the start-up stops at
    model build time naming the fused layers, their shards and schemes and what to do. The
    folder has no weight file at all: nothing was read."""
    result, _ = load(described_as(tmp_path, "W8A8SC", weights=False), True)
    assert result.get("refused") == "UnservedLayerError", result
    message = result["message"]
    for i in gdn_layers():
        assert GDN.format(i, "in_proj_qkvz") in message
    assert "model.layers.0.linear_attn.in_proj_qkv (W8A8SC)" in message
    assert "What to do:" in message and "FLOAT" in message


def test_a_layer_no_method_takes_is_decoded_as_it_streams(tmp_path):
    """The same shards described W8A16 (sglang's ModelSlim has no linear method for it either,
    and builds ``in_proj_qkvz`` unquantized): the plugin decodes both shards as they stream,
    so the fused float weight is ``(q - offset) * scale`` of each, in shard order (float32
    here, as the servers run), and the check finds nothing left. Refused before this change."""
    result, stderr = load(described_as(tmp_path, "W8A16", weights=True), True)
    assert "refused" not in result, result.get("message")
    assert result["unserved"] == [GDN.format(i, "in_proj_qkvz") for i in gdn_layers()]
    tensors = checkpoint()
    for i in gdn_layers():
        layer = result["layers"][GDN.format(i, "in_proj_qkvz")]
        assert layer["method"] == "UnquantizedLinearMethod"
        shards = [GDN.format(i, p) for p in ("in_proj_qkv", "in_proj_z")]
        want = np.concatenate(
            [
                (tensors[f"{s}.weight"].astype(np.float32)
                 - tensors[f"{s}.weight_offset"].astype(np.float32))
                * tensors[f"{s}.weight_scale"].astype(np.float32)
                for s in shards
            ]
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(layer["weight"], dtype=np.float32), want)
    assert "dequantized 6 tensors (W8A16 x6)" in stderr


def test_where_sglang_resolves_the_gdn_names_itself_the_plugin_supplies_nothing():
    """With ``LATER_SGLANG`` (a stand-in for sglang main's fallback to the class's own packed
    entries, not the code under test) sglang's config already builds ``in_proj_qkvz`` with its
    W8A8 scheme: the plugin, asking that config as sglang does, adds nothing to the nested
    mapping and logs nothing, and the model it lets sglang build is the one stock builds, with
    the fused GDN projection quantized. On 0.5.23 itself the plugin supplies the names
    (``test_the_plugin_builds_the_fused_gdn_projection_with_modelslims_w8a8_scheme``)."""
    (stock, _), (with_plugin, stderr) = load(Q36, False, later=True), load(Q36, True, later=True)
    for result in (stock, with_plugin):
        assert "in_proj_qkvz" not in result["nested"] and "in_proj_ba" not in result["nested"]
        assert result["unserved"] == []
        for i in gdn_layers():
            layer = result["layers"][GDN.format(i, "in_proj_qkvz")]
            assert [layer["method"], layer["scheme"]] == [
                "ModelSlimLinearMethod",
                "ModelSlimW8A8Int8",
            ]
    assert with_plugin["layers"] == stock["layers"]
    assert with_plugin["mapping_is_the_class_dict"]
    assert "sglang-mtp-dequant:" not in stderr
