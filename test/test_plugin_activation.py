"""The plugin as sglang runs it: found through the entry point, hooked once, off when asked."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import torch

from conftest import fixture_dir
from sglang_mtp_dequant.drafts import DraftSpec, mtp_prefix


def test_entry_point_is_installed_in_sglang_plugin_group():
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "mtp_dequant"]
    assert len(found) == 1
    assert found[0].value == "sglang_mtp_dequant.plugin:register"
    assert found[0].dist.name == "sglang-mtp-dequant"


def test_load_plugins_wrapped_the_draft_class(sglang_cpu):
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    method = Qwen3_5ForCausalLMMTP.load_weights
    assert hasattr(method, "__wrapped__"), "load_weights is not wrapped: the hook did not apply"
    assert method.__wrapped__.__qualname__ == "Qwen3_5ForCausalLMMTP.load_weights"


def test_register_twice_hooks_once(sglang_cpu):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.plugin import register

    before = len(HookRegistry._hooks[sglang_cpu])
    register()
    assert len(HookRegistry._hooks[sglang_cpu]) == before


def test_missing_hook_target_warns_with_sglang_version(sglang_cpu, caplog):
    from sglang_mtp_dequant.plugin import register, sglang_version

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
    assert sglang_version() == "0.5.23"


def test_float_mtp_checkpoint_loads_bit_identical_and_silent(sglang_cpu, caplog):
    """Nothing quantized in the draft: the plugin changes no bit and logs no line."""
    from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, publish_context

    folder = fixture_dir("q35_dense_float_mtp")
    publish_context(folder)
    builder = CpuDraftBuilder(folder)
    stock_model, plugin_model = builder.build_draft(), builder.build_draft()
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    type(stock_model).load_weights.__wrapped__(stock_model, builder.weights())
    stock_lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    caplog.clear()
    type(plugin_model).load_weights(plugin_model, builder.weights())
    plugin_lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert plugin_lines == stock_lines
    stock = dict(stock_model.named_parameters())
    for name, param in plugin_model.named_parameters():
        if name == "lm_head.weight":  # shared from the target at serve time; never loaded here
            continue
        assert torch.equal(param.view(torch.int16), stock[name].view(torch.int16)), name


def test_quantized_draft_requested_is_left_to_sglang(load_draft, sglang_cpu, caplog):
    """With a quant config (the user asked for a quantized draft), the plugin changes nothing.

    The draft is built with sglang's real ModelSlimConfig from the checkpoint's description:
    its quantized layers get int8 parameters that must receive the raw codes.
    """
    from sglang.srt.layers.quantization.modelslim.modelslim import ModelSlimConfig

    from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, publish_context

    folder = fixture_dir("q35_dense_w8a8_dynamic")
    with open(os.path.join(folder, "quant_model_description.json")) as handle:
        quant_config = ModelSlimConfig.from_config(json.load(handle))
    publish_context(folder)
    builder = CpuDraftBuilder(folder)
    loaded = []
    for use_plugin in (False, True):
        model = builder.build_draft(quant_config=quant_config)
        method = type(model).load_weights if use_plugin else type(model).load_weights.__wrapped__
        caplog.clear()
        method(model, builder.weights())
        assert not [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
        loaded.append(dict(model.named_parameters()))
    stock, plugin = loaded
    assert plugin["model.layers.0.o_proj.weight"].dtype == torch.int8
    for name, param in stock.items():
        if name == "lm_head.weight":
            continue
        assert torch.equal(param.view(torch.uint8), plugin[name].view(torch.uint8)), name


def test_sglang_plugins_whitelist_switches_it_off(tmp_path):
    """SGLANG_PLUGINS naming another plugin: sglang skips ours, the draft class stays stock."""
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from sglang_mtp_dequant.cpu_sglang import ensure_torchvision_importable\n"
        "ensure_torchvision_importable()\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP as C\n"
        "print('HOOKED' if hasattr(C.load_weights, '__wrapped__') else 'STOCK')\n"
    )
    env = dict(os.environ, SGLANG_PLUGINS="none")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "STOCK"
    assert "Skipping plugin mtp_dequant (not in SGLANG_PLUGINS)" in out.stderr
