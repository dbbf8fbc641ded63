"""The Qwen3.5/3.6 vision tower's bytes at the real shapes: decoded to bf16 by the plugin, or int8.

Usage (``make bench-vision-memory``)::

    .venv/bin/python benchmarks/vision_memory.py --json .cache/bench/vision_memory.json

What it measures, per released model (``MODELS``): a folder holding the release's
``vision_config`` (depth 27, hidden 1152, 16 heads, MLP 4304, 16-pixel patches, no deepstack:
Qwen3.6-27B's config.json, and transformers' ``Qwen3_5VisionConfig`` for Qwen/Qwen3.5-27B;
Qwen3.5-397B-A17B's tower is the same with ``out_hidden_size`` its text width, 4096), a one-layer
text model of the release's width, and the description msmodelslim's recipes write for the tower
(``*visual.blocks*`` W8A8_DYNAMIC, ``*linear_fc2*`` excluded: ``attn.qkv``, ``attn.proj``,
``mlp.linear_fc1`` of each block). sglang 0.5.23 builds the target from it on the meta device
for NPU, as the doctor does (``tools/target_check.py``, world size 1: one rank holding
the whole tower), and the parameter bytes are counted:

- ``bf16``: the recipe's layers as sglang builds them (``quant_config=None``): what stock holds
  (raw codes) and what the plugin fills with the decoded weights;
- ``int8``: the same layers built with the model's quant config (sglang's ModelSlim W8A8
  scheme: int8 weight, bf16 ``weight_scale`` / ``weight_offset``), what an sglang that builds
  the tower quantized (PR #36426) would hold: ``support.sglang_load.TOWER_QUANTIZED`` is
  that build's stand-in, shared with the tests;
- ``tower``: every parameter of the tower as sglang 0.5.23 builds it.

The tower is one per rank: sglang shards these layers over the attention-TP group (each rank
holds 1/TP of them) unless ``--mm-enable-dp-encoder`` replicates it; the figures are at TP 1.
The last line: ``vision_memory <model> bf16=B int8=I extra=E tower=T (MiB) ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import support_on_path  # noqa: F401 - test/support on the path
from machine import describe

from support.sglang_load import TOWER_QUANTIZED

#: model -> its text width (the tower's out_hidden_size)
MODELS = {"Qwen3.5-27B": 5120, "Qwen3.6-27B": 5120, "Qwen3.5-397B-A17B": 4096}
VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "num_heads": 16,
    "intermediate_size": 4304,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 2304,
    "in_channels": 3,
    "hidden_act": "gelu_pytorch_tanh",
    "deepstack_visual_indexes": [],
}
QUANTIZED = ("attn.qkv", "attn.proj", "mlp.linear_fc1")
MIB = 2**20


def write_folder(folder: str, width: int) -> None:
    """config.json and the recipe's description for a release of text width ``width``."""
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": width,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 256,
        "layer_types": ["full_attention"],
        "full_attention_interval": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                            "partial_rotary_factor": 0.25, "mrope_section": [4, 2, 2],
                            "mrope_interleaved": True},
    }  # fmt: skip
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {**VISION, "out_hidden_size": width},
        "tie_word_embeddings": False,
    }
    described = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0"}
    for block in range(VISION["depth"]):
        for layer in QUANTIZED:
            for part in ("weight", "weight_scale", "weight_offset"):
                described[f"model.visual.blocks.{block}.{layer}.{part}"] = "W8A8_DYNAMIC"
    for name, content in (("config.json", config), ("quant_model_description.json", described)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
            json.dump(content, handle)


def tower_bytes(folder: str) -> dict[str, int]:
    """Parameter bytes of sglang's meta build of the target's tower for NPU (the doctor's build,
    ``tools/target_check.py``): the recipe's layers and the whole tower."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_mtp_dequant.serving import sglang_private
    from sglang_mtp_dequant.tools import target_check
    from sglang_mtp_dequant.tools.launch import parse_launch

    args = sglang_private.published_server_args()
    model_config = ModelConfig.from_server_args(args, model_path=folder)
    load_config = LoadConfig(load_format="auto")
    with parse_launch(folder, ["--device", "npu"]).platform():
        build = sglang_private.unwrapped(target_check._quantization_config())
        quant_config = build(model_config, load_config)
        model, _ = target_check._build_on_meta(model_config, load_config, quant_config)
    recipe, layers = 0, set()
    for name, param in model.visual.named_parameters():
        layer = name.rpartition(".")[0].replace("qkv_proj", "qkv")
        if layer.endswith(QUANTIZED):
            recipe += param.numel() * param.element_size()
            layers.add(layer)
    tower = sum(p.numel() * p.element_size() for p in model.visual.parameters())
    return {"recipe_layers": recipe, "tower": tower, "layers": len(layers)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    print(describe(), flush=True)
    results: dict[str, dict] = {model: {} for model in MODELS}
    for build in ("bf16", "int8"):  # the quantized build patches sglang for the process: last
        if build == "int8":
            exec(TOWER_QUANTIZED, {})
        for model, width in MODELS.items():
            with tempfile.TemporaryDirectory() as folder:
                write_folder(folder, width)
                prepare_cpu_process(folder, quantization="modelslim", dtype="bfloat16")
                results[model][build] = tower_bytes(folder)
    for model, result in results.items():
        bf16, int8 = result["bf16"]["recipe_layers"], result["int8"]["recipe_layers"]
        print(
            f"vision_memory {model} bf16={bf16 / MIB:.1f} int8={int8 / MIB:.1f} "
            f"extra={(bf16 - int8) / MIB:.1f} tower={result['bf16']['tower'] / MIB:.1f} "
            f"(MiB, one rank at TP 1; {result['bf16']['layers']} linear layers)",
            flush=True,
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": describe(), "models": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
