"""A model (a target or a draft) built and loaded by sglang's own ``DefaultModelLoader`` in a fresh
interpreter, as a server on NPU would, with the plugin's hooks or without them (stock sglang).

Usage::

    report, state = load_model_in_subprocess(folder, tmp_path, plugin=True)
    report["layers"]["visual.blocks.0.attn.qkv_proj"]   # {"method": ..., "scheme": ...}
    report["records"]     # [[logger, level, message], ...]: WARNING and up, and the plugin's
    state["visual.blocks.0.attn.qkv_proj.weight"]        # the loaded parameter

Why a fresh interpreter: the plugin's hooks are process-wide. The servers' ``e2e/site/`` shims
are on its path (sglang's NPU packed-module mapping applied by ``_get_quantization_config``,
the Ascend kernels of the W8A8_DYNAMIC linear method on their CPU stand-ins, float32 accepted:
``test/e2e/test_e2e_shims.py`` checks them); nothing else stands in for anything. ``before``
is code run after the plugin's hooks are applied and before the build (a stand-in for a later
sglang, said so where a test passes one); ``after`` runs on the loaded ``model`` and puts what
it measures in ``extra`` (the report's ``extra``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

from support.paths import ROOT

SITE = os.path.join(ROOT, "e2e", "site")

#: Stands for a later sglang, NOT sglang 0.5.23 (the code under test never runs it): the vision
#: tower built with the model's quant config, as sglang PR #36426 builds it (0.5.23's
#: ``Qwen3VLForConditionalGeneration`` passes ``quant_config=None``); sglang's own ModelSlimConfig
#: then gives the tower its schemes. Run as ``before`` (or ``exec(TOWER_QUANTIZED, {})``).
TOWER_QUANTIZED = """
from sglang.srt.models import qwen3_vl
_built, _config = qwen3_vl.Qwen3VLMoeVisionModel.__init__, []
_init = qwen3_vl.Qwen3VLForConditionalGeneration.__init__
def _model_init(self, config, quant_config=None, *a, **k):
    _config.append(quant_config)
    _init(self, config, quant_config, *a, **k)
def _tower_init(self, vision_config, norm_eps=1e-6, quant_config=None, *a, **k):
    _built(self, vision_config, norm_eps, quant_config or _config[-1], *a, **k)
qwen3_vl.Qwen3VLForConditionalGeneration.__init__ = _model_init
qwen3_vl.Qwen3VLMoeVisionModel.__init__ = _tower_init
"""

LOAD = """
    import json, logging, sys, torch
    from sglang_mtp_dequant.tools import cpu_sglang
    from sglang_mtp_dequant.serving import plugin, sglang_private
    from sglang_mtp_dequant.tools.cpu_env import generic_rope_on_cpu, placeholder_vllm_rotary

    FOLDER, PLUGIN, DRAFT = {folder!r}, {plugin!r}, {draft!r}
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING or record.name.startswith("sglang_mtp_dequant"):
                records.append([record.name, record.levelname, record.getMessage()])
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.INFO)
    cpu_sglang.prepare_cpu_process(FOLDER, **{server_args!r})
    if PLUGIN:
        from sglang.srt.plugins.hook_registry import HookRegistry
        plugin.register()
        HookRegistry.apply_hooks()
    exec({before!r})
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    args = sglang_private.published_server_args()
    config = ModelConfig.from_server_args(args, model_path=FOLDER, is_draft_model=DRAFT)
    loader = DefaultModelLoader(LoadConfig(load_format="auto"))
    try:
        with placeholder_vllm_rotary(), generic_rope_on_cpu():
            model = loader.load_model(model_config=config, device_config=DeviceConfig("cpu"))
    except Exception as exc:
        print(json.dumps({{"refused": type(exc).__name__, "message": str(exc),
                          "records": records}}))
        sys.exit(0)
    layers = {{
        name: {{"method": type(module.quant_method).__name__,
                "scheme": type(getattr(module, "scheme", None)).__name__}}
        for name, module in model.named_modules()
        if getattr(module, "quant_method", None) is not None
    }}
    torch.save({{n: p.detach().clone() for n, p in model.state_dict().items()}}, {state!r})
    extra = {{}}
    exec({after!r})
    print(json.dumps({{"class": type(model).__name__, "layers": layers, "records": records,
                      "extra": extra}}))
"""


def load_model_in_subprocess(
    folder: str,
    tmp_path,
    *,
    plugin: bool,
    draft: bool = False,
    before: str = "",
    after: str = "",
    **server_args,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(report, state dict) of the model sglang builds and loads from ``folder``; the report
    holds ``refused`` and ``message`` instead when the build or the load raised."""
    server_args = {"quantization": "modelslim", "dtype": "bfloat16", **server_args}
    state = str(tmp_path / f"state-{plugin}-{draft}-{abs(hash(before))}.pt")
    code = LOAD.format(
        folder=folder, plugin=plugin, draft=draft, server_args=server_args, before=before,
        after=after, state=state,
    )  # fmt: skip
    return run_load_script(code, state)


def run_load_script(code: str, state: str) -> tuple[dict, dict]:
    """Run ``code`` in a fresh Python (the CPU site set up, this checkout's package): (the JSON
    report its last stdout line prints, the state dict it saved at ``state``, if any)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    # the package of this checkout (what an editable install gives; a copy of the tests in
    # another checkout then loads that checkout's package)
    env["PYTHONPATH"] = os.pathsep.join((SITE, os.path.join(ROOT, "python")))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    tensors = torch.load(state) if os.path.exists(state) else {}
    return report, tensors


def warnings_of(report: dict) -> list[str]:
    """The WARNING-and-up messages of a load, in order (sglang's and the plugin's)."""
    return [message for _, level, message in report["records"] if level != "INFO"]


def plugin_lines(report: dict) -> list[str]:
    return [m for name, _, m in report["records"] if name.startswith("sglang_mtp_dequant")]
