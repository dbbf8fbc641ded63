#!/usr/bin/env python3
"""BF16 checkpoints of every MTP/NextN draft class, and their loads: one side of
``make upstream-test``'s no-regression check (``run_tests.py``, step ``bf16``).

Usage (``upstream/run_tests.py`` runs both)::

    python upstream/bf16_drafts.py write DIR              # the checkpoints, once
    PYTHONPATH=<tree>/python:upstream/site:test SGLANG_PLUGINS=none|mtp_dequant \\
        python upstream/bf16_drafts.py load DIR OUT        # one side: sglang x plugin

The checkpoints are the tests' own tiny drafts (``test/support/draft_cases.py``: each class's
config type, its architecture's tensor names), with every quantized tensor decoded to bf16 and
no ``quant_model_description.json``: a plain BF16 export, which no step of the stack and not
the plugin may change. Qwen3.5 dense and MoE are the msmodelslim fixtures, decoded the same way.

``load`` builds each draft class on the CPU with sglang's own constructor (Qwen3.5 through the
draft's ``ModelConfig``, as the draft worker does), fills every float parameter with NaN (so
what no loader writes is the same on both sides), streams the folder through
``DefaultModelLoader``'s iterator into the class's ``load_weights`` (hooked when sglang loaded
the plugin), and saves every parameter to ``OUT/<case>.safetensors`` (``OUT/<case>.error`` if
the load raised). ``OUT/side.json`` says which sglang ran and whether the plugin was loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
#: case -> (draft class, draft_cases.CASES key or a Qwen3.5 fixture folder name)
CASES = {
    "qwen3_5_dense": ("Qwen3_5ForCausalLMMTP", "q35_dense_w8a8_dynamic"),
    "qwen3_5_moe": ("Qwen3_5ForCausalLMMTP", "q35moe_w8a8_dynamic"),
    "qwen4_exp": ("Qwen4ExpForCausalLMMTP", "qwen4_exp"),
    "qwen3_next": ("Qwen3NextForCausalLMMTP", "qwen3_next"),
    "qwen3_moe": ("Qwen3MoeForCausalLMMTP", "qwen3_moe"),
    "glm4_moe": ("Glm4MoeForCausalLMNextN", "glm4_moe"),
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLMNextN", "glm4_moe_lite"),
    "deepseek_v3": ("DeepseekV3ForCausalLMNextN", "deepseek_v3"),
    "glm5_next": ("Glm5NextForConditionalGenerationNextN", "glm5_next"),
}
FIXTURE_CASES = {"qwen3_5_dense", "qwen3_5_moe"}


def as_bf16(tensors: dict[str, torch.Tensor], desc: dict) -> dict[str, torch.Tensor]:
    """A quantized checkpoint as a BF16 export: every quantized weight decoded (the tests'
    reference decoder), its companions dropped, float tensors kept as they are."""
    from support.draft_cases import expected

    out = {}
    for name, value in tensors.items():
        scheme = desc.get(name, "FLOAT")
        if scheme == "FLOAT":
            out[name] = value
        elif name.endswith(".weight"):
            out[name] = expected(tensors, desc, name).contiguous()
    return out


def write_checkpoints(dest: Path) -> list[str]:
    """Every case's BF16 folder under ``dest``; returns the case names."""
    from safetensors.torch import save_file

    from support.draft_cases import CASES as DRAFT_CASES
    from support.paths import fixture_dir
    from support.reference import description, load_all

    for case, (_, source) in CASES.items():
        folder = dest / case
        folder.mkdir(parents=True, exist_ok=True)
        if case in FIXTURE_CASES:
            src = fixture_dir(source)
            tensors = as_bf16(load_all(src), description(src))
            shutil.copy(os.path.join(src, "config.json"), folder / "config.json")
        else:
            draft = DRAFT_CASES[source]
            layout = draft.checkpoint()
            tensors = as_bf16(layout.tensors, layout.desc)
            config = draft.config()
            config.architectures = [draft.architecture]
            config.to_json_file(str(folder / "config.json"))
        save_file(tensors, str(folder / "model.safetensors"))
    return list(CASES)


def load_case(case: str, folder: str) -> dict[str, torch.Tensor]:
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
    )
    from support.cpu_sglang import build_draft_class, path_weights
    from support.draft_cases import CASES as DRAFT_CASES

    # the draft's own path is what a load reads; the target path is any valid model folder
    # (as the tests' draft_case does: ServerArgs adjusts itself to the target's config)
    target = folder if case in FIXTURE_CASES else str(Path(folder).parent / "qwen3_5_dense")
    publish_context(target, draft_path=folder)
    if case in FIXTURE_CASES:
        model_config = draft_model_config(folder)
        model, dtype = build_draft(model_config), model_config.dtype
    else:
        draft = DRAFT_CASES[CASES[case][1]]
        config = draft.config()
        model, dtype = build_draft_class(draft.class_path, config), torch.bfloat16
    if type(model).__name__ != CASES[case][0]:
        raise RuntimeError(f"{case}: built {type(model).__name__}, not {CASES[case][0]}")
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))
    with set_default_torch_dtype(dtype):
        DefaultModelLoader.load_weights_and_postprocess(
            model, path_weights(folder), torch.device("cpu")
        )
    return {n: p.detach().contiguous() for n, p in model.named_parameters()}


def registered_drafts() -> dict[str, str]:
    """Every MTP/NextN class sglang registers -> the file (under ``sglang/``) of the
    ``load_weights`` it runs (unwrapped: sglang's own, whether or not the plugin hooked it)."""
    import inspect

    import sglang
    from sglang.srt.models.registry import ModelRegistry

    from sglang_mtp_dequant.serving.sglang_private import unwrapped

    root = os.path.dirname(sglang.__file__)
    found = {}
    for arch in ModelRegistry.get_supported_archs():
        if not arch.endswith(("MTP", "NextN")):
            continue
        cls, _ = ModelRegistry.resolve_model_cls(arch)
        source = inspect.getsourcefile(unwrapped(cls.load_weights))
        found[arch] = os.path.relpath(source, root)
    return found


def load_side(folders: Path, out: Path) -> int:
    from load_draft import start_sglang_process
    from safetensors.torch import save_file
    from sglang.srt.distributed import parallel_state

    out.mkdir(parents=True, exist_ok=True)
    side = start_sglang_process(str(folders / next(iter(CASES))))
    side["registered_drafts"] = registered_drafts()
    side["loaded_classes"] = sorted({cls for cls, _ in CASES.values()})
    (out / "side.json").write_text(json.dumps(side, indent=1))
    for case in CASES:
        try:
            save_file(load_case(case, str(folders / case)), str(out / f"{case}.safetensors"))
            print(f"{case}: loaded")
        except Exception as exc:  # noqa: BLE001 - recorded for the comparison
            error = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
            (out / f"{case}.error").write_text(error)
            print(f"{case}: {type(exc).__name__}: {exc}")
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["write", "load"])
    parser.add_argument("folders", type=Path)
    parser.add_argument("out", type=Path, nargs="?")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "test"))
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()  # transformers imports torchvision (CPU torch here)
    if args.command == "write":
        print(" ".join(write_checkpoints(args.folders)))
        return 0
    return load_side(args.folders, args.out)


if __name__ == "__main__":
    sys.exit(main())
