#!/usr/bin/env python3
"""Load checkpoints' MTP drafts through sglang's real draft class and DefaultModelLoader,
and save every draft parameter: one side of ``make upstream-test``'s bit-identity check.

Usage (``upstream/run_tests.py`` runs it twice, in two processes)::

    # stock sglang 0.5.23 + the plugin
    python upstream/load_draft.py --out DIR --expect plugin FIXTURE...
    # the patched tree, plugin switched off
    PYTHONPATH=.cache/upstream/sglang/python SGLANG_PLUGINS=none \\
        python upstream/load_draft.py --out DIR --expect branch FIXTURE...
    # the patched tree with the plugin on (it must step aside: test/test_upstream_series.py)
    PYTHONPATH=.cache/upstream/sglang/python python upstream/load_draft.py --expect both ...
    # stock sglang alone (the "before" of PR 1's text), with each projection's absmax
    SGLANG_PLUGINS=none python upstream/load_draft.py --out DIR --expect stock --absmax FIXTURE

Per checkpoint folder, through the project's ``tools/cpu_sglang.py`` (what ``verify`` builds
with): sglang's ``ModelConfig`` of the draft (``is_draft_model=True``, as the draft worker
builds it), its class built by the loader's own ``_initialize_model``, every float parameter
filled with NaN (so what no loader writes is the same on both sides), then
``DefaultModelLoader.load_weights_and_postprocess`` with ``_get_all_weights`` (the stream
``load_model`` hands the model). Writes ``DIR/<name>.safetensors`` (every parameter) or
``DIR/<name>.error`` (the exception), and ``DIR/side.json`` (which sglang, whether the
plugin's hooks and PR 1's fix are present). sglang's plugin loader runs as in every
sglang process; ``SGLANG_PLUGINS`` decides whether it loads this project's plugin.

The CPU-only shims are the project's own (``sglang_mtp_dequant.tools.cpu_env``, as in the
branch's registered test): torchvision's CUDA wheel beside CPU torch gets its two missing
operator schemas, and the CUDA rotary kernel import gets a placeholder while the draft is
built. Importing them loads nothing of the plugin: sglang's own plugin loader decides that,
by ``SGLANG_PLUGINS``. ``qwen3_5_mtp``'s NPU platform check answers True on every side
(``stand_in_npu_check``): PR 1 decodes on NPU only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback

import torch

from sglang_mtp_dequant.serving.sglang_private import unwrapped
from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable
from sglang_mtp_dequant.tools.cpu_sglang import (
    build_draft,
    draft_model_config,
    init_world_size_one,
    publish_context,
    sglang_weights,
)


def load_one(folder: str) -> dict[str, torch.Tensor]:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    publish_context(folder, draft_path=folder)
    model_config = draft_model_config(folder)
    model = build_draft(model_config)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))
    with set_default_torch_dtype(model_config.dtype):
        DefaultModelLoader(LoadConfig(load_format="auto")).load_weights_and_postprocess(
            model, sglang_weights(model_config, model), torch.device("cpu")
        )
    return {
        f"{type(model).__name__}/{name}": param.detach().contiguous()
        for name, param in model.named_parameters()
    }


def start_sglang_process(folder: str) -> dict:
    """This process as one of sglang's: its context published for ``folder``, a world of one,
    the plugins loaded as sglang loads them. Returns which sglang it is and whether the plugin
    hooked Qwen3.5's MTP ``load_weights``."""
    import sglang
    from sglang.srt.plugins import load_plugins

    publish_context(folder, draft_path=folder)
    init_world_size_one()
    stand_in_npu_check()
    load_plugins()
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    hooked = Qwen3_5ForCausalLMMTP.__dict__["load_weights"]
    return {
        "sglang": os.path.dirname(sglang.__file__),
        "plugin_hooked": unwrapped(hooked) is not hooked,
        "SGLANG_PLUGINS": os.environ.get("SGLANG_PLUGINS"),
    }


def stand_in_npu_check() -> None:
    """PR 1 decodes only where ``qwen3_5_mtp``'s NPU check (sglang's platform check, which
    also builds the draft unquantized) is true: answer True there, on every side, so
    the CPU runs what an NPU runs. Only that module's check; no NPU kernel is involved."""
    from sglang.srt.models import qwen3_5_mtp

    from sglang_mtp_dequant.serving.sglang_private import set_draft_module_is_npu

    set_draft_module_is_npu(qwen3_5_mtp, lambda: True)
    print("load_draft.py: CPU stand-in: qwen3_5_mtp's NPU platform check answers True")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect", choices=["plugin", "branch", "both", "stock"], required=True)
    parser.add_argument("--absmax", action="store_true", help="print each 2-D parameter's")
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    ensure_torchvision_importable()
    from safetensors.torch import save_file
    from sglang.srt.distributed import parallel_state

    side = start_sglang_process(os.path.abspath(args.folders[0]))
    side["branch_module"] = _has_branch_module()
    with open(os.path.join(args.out, "side.json"), "w") as f:
        json.dump(side, f, indent=1)
    wanted = {"plugin": (True, False), "branch": (False, True), "both": (True, True)}.get(
        args.expect, (False, False)
    )
    if (side["plugin_hooked"], side["branch_module"]) != wanted:
        print(f"load_draft.py: expected the {args.expect} side, found {side}", file=sys.stderr)
        return 2
    for folder in args.folders:
        name = os.path.basename(os.path.normpath(folder))
        try:
            params = load_one(os.path.abspath(folder))
            save_file(params, os.path.join(args.out, f"{name}.safetensors"))
            print(f"{args.expect}: {name}: loaded")
            for key, value in params.items() if args.absmax else ():
                if value.dim() >= 2 and not value.isnan().all():
                    print(f"{args.expect}: {name}: {key} absmax {value.abs().max().item():.4g}")
        except Exception as exc:  # noqa: BLE001 - recorded for the comparison
            with open(os.path.join(args.out, f"{name}.error"), "w") as f:
                f.write(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
            print(f"{args.expect}: {name}: {type(exc).__name__}: {exc}")
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    return 0


def _has_branch_module() -> bool:
    """Whether this sglang has PR 1's fix (``upstream/series/``), asked the way the plugin
    asks it: Qwen3.5's own ``load_weights`` calls sglang's decode helper, on NPU."""
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    from sglang_mtp_dequant.serving.plugin import sglang_dequantizes_drafts

    return sglang_dequantizes_drafts(unwrapped(Qwen3_5ForCausalLMMTP.load_weights))


if __name__ == "__main__":
    sys.exit(main())
