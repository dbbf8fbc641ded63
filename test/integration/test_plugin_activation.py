"""The plugin as sglang runs it: found through the entry point, hooked once, off when asked."""

from __future__ import annotations

import contextlib
import logging
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

from sglang_mtp_dequant.serving.drafts import DraftSpec, mtp_prefix
from sglang_mtp_dequant.serving.sglang_private import unwrapped
from support.paths import fixture_dir
from support.sglang_release import TARGET_FILLED


def test_entry_point_is_installed_in_sglang_plugin_group():
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "mtp_dequant"]
    assert len(found) == 1
    assert found[0].value == "sglang_mtp_dequant.serving.plugin:register"
    assert found[0].dist.name == "sglang-mtp-dequant"


def test_load_plugins_wrapped_the_draft_class(sglang_cpu):
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    method = Qwen3_5ForCausalLMMTP.load_weights
    assert unwrapped(method) is not method, "load_weights is not wrapped: the hook did not apply"
    assert unwrapped(method).__qualname__ == "Qwen3_5ForCausalLMMTP.load_weights"


def test_register_twice_hooks_once(sglang_cpu):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.plugin import register

    before = len(HookRegistry._hooks[sglang_cpu])
    register()
    assert len(HookRegistry._hooks[sglang_cpu]) == before


@pytest.fixture
def hook_registry_restored(sglang_cpu):
    """sglang's ``HookRegistry`` state and every draft class's ``load_weights`` as they were,
    put back after the test (the session's other tests need the plugin's hooks)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS

    hooks = {target: list(entries) for target, entries in HookRegistry._hooks.items()}
    patched = set(HookRegistry._patched)
    classes = {}
    for spec in DRAFT_SPECS:
        owner, _, attribute = spec.target.rpartition(".")
        with contextlib.suppress(Exception):
            cls = pkgutil.resolve_name(owner)
            classes[spec.target] = (cls, attribute, cls.__dict__[attribute])
    yield HookRegistry
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(hooks)
    HookRegistry._patched.clear()
    HookRegistry._patched.update(patched)
    for cls, attribute, method in classes.values():
        setattr(cls, attribute, method)


def test_after_sglangs_hook_registry_reset_the_installed_hooks_are_reported(
    hook_registry_restored,
):
    """sglang's own ``HookRegistry.reset()`` forgets every hook but leaves each wrapper
    installed: the draft classes still run the plugin's hook, and ``inactive_targets`` says so
    (read from the methods, not from the registry). Removing one wrapper by hand is reported
    for that class alone."""
    from sglang_mtp_dequant.serving.drafts import DRAFT_SPECS
    from sglang_mtp_dequant.serving.ray_setup import inactive_targets
    from sglang_mtp_dequant.serving.sglang_private import patched_targets

    present = [s.target for s in DRAFT_SPECS if _resolvable(s.target)]
    # every draft class this sglang has (7 on 0.5.23; 0.5.14 lacks one)
    assert len(present) >= 6 and inactive_targets() == []
    hook_registry_restored.reset()  # sglang's own test helper
    assert not patched_targets()  # the registry forgot what it applied ...
    for target in present:  # ... while every wrapper is still there
        assert unwrapped(pkgutil.resolve_name(target)) is not pkgutil.resolve_name(target)
    assert inactive_targets() == []
    owner, _, attribute = present[0].rpartition(".")
    cls = pkgutil.resolve_name(owner)
    setattr(cls, attribute, unwrapped(getattr(cls, attribute)))
    assert inactive_targets() == [present[0]]


def _resolvable(target: str) -> bool:
    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def test_missing_hook_target_warns_with_sglang_version(sglang_cpu, caplog):
    from sglang_mtp_dequant.serving.context import sglang_version
    from sglang_mtp_dequant.serving.plugin import register

    spec = DraftSpec(
        target="sglang.srt.models.qwen3_5_mtp.NoSuchDraftClass.load_weights",
        architectures=("Nothing",),
        name_rule=mtp_prefix,
    )
    caplog.set_level(logging.WARNING)
    register(specs=(spec,))
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert spec.target in message and f"sglang {sglang_version()}" in message
    assert "has no attribute 'NoSuchDraftClass'" in message


BROKEN_MODULES = {
    # a missing native dependency, as on a host without the NPU stack
    "missing_native": (
        "raise ModuleNotFoundError(\"No module named 'torch_npu'\", name='torch_npu')\n",
        "ModuleNotFoundError: No module named 'torch_npu'",
    ),
    "fails_at_import": (
        "raise RuntimeError('CANN toolkit not found')\n",
        "RuntimeError: CANN toolkit not found",
    ),
}


def test_unimportable_hook_target_is_reported_with_its_own_error(
    sglang_cpu, caplog, tmp_path, monkeypatch
):
    """pkgutil.resolve_name would say "module ... has no attribute ..."; the WARNING must carry
    the exception the module itself raised."""
    from sglang_mtp_dequant.serving.plugin import register

    package = tmp_path / "brokenmodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, (body, _) in BROKEN_MODULES.items():
        (package / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level(logging.WARNING)
    for name, (_, expected) in BROKEN_MODULES.items():
        caplog.clear()
        target = f"brokenmodels.{name}.SomeMTP.load_weights"
        register(specs=(DraftSpec(target=target, architectures=("X",), name_rule=mtp_prefix),))
        (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert target in warning and expected in warning, warning
        assert "has no attribute" not in warning


def test_float_mtp_checkpoint_loads_bit_identical_and_silent(sglang_cpu, caplog):
    """Nothing quantized in the draft: the plugin changes no bit and logs no line (the
    completeness audit and the value guard ran, silently)."""
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
        sglang_weights,
    )

    folder = fixture_dir("q35_dense_float_mtp")
    publish_context(folder)
    config = draft_model_config(folder)
    stock_model, plugin_model = build_draft(config), build_draft(config)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    unwrapped(type(stock_model).load_weights)(stock_model, sglang_weights(config, stock_model))
    stock_lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    caplog.clear()
    type(plugin_model).load_weights(plugin_model, sglang_weights(config, plugin_model))
    plugin_lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert plugin_lines == stock_lines
    assert not [line for line in plugin_lines if line[0].startswith("sglang_mtp_dequant")]
    stock = dict(stock_model.named_parameters())
    for name, param in plugin_model.named_parameters():
        if name in TARGET_FILLED:  # shared from the target at serve time; never loaded here
            continue
        assert torch.equal(param.view(torch.int16), stock[name].view(torch.int16)), name


def build_quantized_modelslim_draft(folder: str, npu: bool):
    """``--speculative-draft-model-quantization modelslim``: sglang's draft class for
    ``folder`` built with sglang's own ``ModelSlimConfig`` as its loader picks it, as on NPU
    (``npu=True``: the loader's packed-module mapping, tools/cpu_env.npu_quantization_rule) or
    as on this CPU."""
    from sglang_mtp_dequant.tools.cpu_env import npu_quantization_rule
    from sglang_mtp_dequant.tools.cpu_sglang import build_draft, draft_model_config, publish_context

    publish_context(folder, speculative_draft_model_quantization="modelslim")
    config = draft_model_config(folder)
    with npu_quantization_rule() if npu else contextlib.nullcontext():
        return config, build_draft(config)


def test_quantized_draft_requested_is_left_to_sglang(sglang_cpu, caplog, rmsnorm_restored):
    """With a quant config (the user asked for a quantized draft), the plugin changes nothing
    of what sglang loads and says nothing: every quantized layer, the fused ``qkv_proj`` and
    ``gate_up_proj`` too, gets int8 parameters that must receive the raw codes."""
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights

    folder = fixture_dir("q35_dense_w8a8_dynamic")
    loaded = []
    for use_plugin in (False, True):
        config, model = build_quantized_modelslim_draft(folder, npu=True)
        method = type(model).load_weights if use_plugin else unwrapped(type(model).load_weights)
        caplog.clear()
        method(model, sglang_weights(config, model))
        assert not [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
        loaded.append(dict(model.named_parameters()))
    stock, plugin = loaded
    quantized = [n for n, p in plugin.items() if p.dtype == torch.int8]
    assert any("qkv_proj" in n for n in quantized) and any("gate_up_proj" in n for n in quantized)
    for name, param in stock.items():
        if name in TARGET_FILLED:
            continue
        assert torch.equal(param.view(torch.uint8), plugin[name].view(torch.uint8)), name


def test_quantized_draft_misbuilt_off_npu_is_refused(sglang_cpu, rmsnorm_restored, monkeypatch):
    """Off NPU sglang gives a ModelSlim draft's fused ``qkv_proj`` no scheme (the packed-module
    mapping is added only on NPU), so stock copies its int8 codes into a bf16 weight; with the
    plugin the start-up stops when the draft is built, before any weight is read, naming that
    layer and its quantized shards (``serving/target_layers.py``); and were it built, the plugin
    decodes the codes sglang would copy into that unquantized layer (``LoadSetting``)."""
    import importlib

    from sglang_mtp_dequant.errors import UnservedLayerError
    from sglang_mtp_dequant.serving.sglang_private import INITIALIZE_MODEL_TARGET
    from sglang_mtp_dequant.tools.cpu_sglang import sglang_weights

    folder = fixture_dir("q35_dense_w8a8_dynamic")
    default_dtype = torch.get_default_dtype()
    try:
        build_quantized_modelslim_draft(folder, npu=False)
    except UnservedLayerError as refused:
        # raised inside sglang's set_default_torch_dtype, which does not restore the dtype on
        # an exception: restored here, or the tests after it create bf16 tensors by default
        torch.set_default_dtype(default_dtype)
        said = str(refused)
    except AttributeError as exc:
        # sglang 0.5.14 gives that unmapped fused layer a ModelSlim method with no scheme and
        # stops building the draft, loudly, before any weight loads: no misload to refuse
        # (and its set_default_torch_dtype does not restore the dtype on an exception)
        torch.set_default_dtype(default_dtype)
        assert "'NoneType' object has no attribute 'create_weights'" in str(exc), exc
        return
    else:
        pytest.fail("the draft was built over quantized codes without a word")
    assert "qkv_proj: mtp.layers.0.self_attn.q_proj (W8A8_DYNAMIC)" in said, said
    assert "mtp.layers.0.mlp.gate_up_proj: mtp.layers.0.mlp.gate_proj (W8A8_DYNAMIC)" in said
    assert "only on Ascend NPU" in said
    module, _, name = INITIALIZE_MODEL_TARGET.rpartition(".")
    loader = importlib.import_module(module)
    monkeypatch.setattr(loader, name, unwrapped(getattr(loader, name)))  # sglang's own build
    config, model = build_quantized_modelslim_draft(folder, npu=False)
    unwrapped(type(model).load_weights)(model, sglang_weights(config, model))
    stock = dict(model.named_parameters())
    fused = next(n for n in stock if n.endswith("qkv_proj.weight"))
    assert stock[fused].dtype == torch.bfloat16 and stock[fused].abs().max() > 64  # raw codes
    config, model = build_quantized_modelslim_draft(folder, npu=False)
    model.load_weights(sglang_weights(config, model))
    shards = [decoded(folder, f"mtp.layers.0.self_attn.{p}_proj") for p in "qkv"]
    assert torch.equal(dict(model.named_parameters())[fused], torch.cat(shards))


def decoded(folder: str, layer: str) -> torch.Tensor:
    """``layer``'s W8A8_DYNAMIC weight decoded independently: ``(q - offset) * scale`` in fp32,
    then bf16."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "quant_model_weights-00001-of-00001.safetensors"))
    codes, scale = tensors[f"{layer}.weight"], tensors[f"{layer}.weight_scale"]
    offset = tensors[f"{layer}.weight_offset"]
    return ((codes.float() - offset.float()) * scale.float()).to(torch.bfloat16)


def test_sglang_plugins_whitelist_switches_it_off(tmp_path):
    """SGLANG_PLUGINS naming another plugin: sglang skips ours, the draft class stays stock."""
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable\n"
        "ensure_torchvision_importable()\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP as C\n"
        "from sglang_mtp_dequant.serving.sglang_private import unwrapped\n"
        "print('HOOKED' if unwrapped(C.load_weights) is not C.load_weights else 'STOCK')\n"
    )
    env = dict(os.environ, SGLANG_PLUGINS="none")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "STOCK"
    assert "Skipping plugin mtp_dequant (not in SGLANG_PLUGINS)" in out.stderr
