"""Qwen3.5 MTP checkpoints in other quantizers' formats, for the doctor's foreign-format tests.

Usage::

    folder = compressed_tensors_checkpoint(tmp_path / "ct", "W4A16")     # the library writes it
    folder = modelopt_nvfp4_checkpoint(tmp_path / "mo")                  # header-faithful

- compressed-tensors: written by compressed-tensors 0.18.0 itself (sglang's pinned dependency):
  the MTP layer's projections of the float-MTP fixture (``q35_dense_float_mtp``) become
  ``nn.Linear`` modules under their checkpoint names, ``apply_quantization_config`` with one of
  the library's presets (``W8A8`` int-quantized, ``W4A16`` pack-quantized, ``FP8``
  float-quantized, ``NVFP4A16`` nvfp4-pack-quantized; groups of 32 where the preset's are wider
  than the fixture's 64 columns), min/max weight calibration with the
  library's ``calculate_qparams``, ``ModelCompressor.compress_model``; config.json gets the
  compressor's ``quantization_config``; no ModelSlim description.
- ModelOpt NVFP4: nvidia-modelopt is not installed here, so this one is built by hand from
  ModelOpt's documented export layout (uint8 ``weight`` [out, in/2], float8 ``weight_scale``
  [out, in/16], f32 scalar ``weight_scale_2`` and ``input_scale``; config.json
  ``quantization_config`` ``{"quant_method": "modelopt", "quant_algo": "NVFP4"}``), with
  arbitrary code bytes: a header-faithful replica, not an export.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from support.paths import fixture_dir

FLOAT_MTP = "q35_dense_float_mtp"
FORMATS = {
    "W8A8": "int-quantized",
    "W4A16": "pack-quantized",
    "FP8": "float-quantized",
    "NVFP4A16": "nvfp4-pack-quantized",
}


def _float_fixture(dest: str) -> tuple[dict[str, torch.Tensor], str]:
    shutil.copytree(fixture_dir(FLOAT_MTP), dest)
    for name in os.listdir(dest):
        os.chmod(os.path.join(dest, name), 0o644)
        if name.startswith("quant_model_description") or name.endswith(".index.json"):
            os.remove(os.path.join(dest, name))
    (path,) = [os.path.join(dest, n) for n in os.listdir(dest) if n.endswith(".safetensors")]
    return load_file(path), path


def _projections(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(
        n[: -len(".weight")]
        for n, t in tensors.items()
        if n.startswith("mtp.layers.0.") and n.endswith("_proj.weight") and t.dim() == 2
    )


def _write_config(folder: str, quantization_config: dict) -> None:
    path = os.path.join(folder, "config.json")
    with open(path) as handle:
        config = json.load(handle)
    config["quantization_config"] = quantization_config
    with open(path, "w") as handle:
        json.dump(config, handle)


def compressed_tensors_checkpoint(dest: str, preset: str) -> str:
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()  # compressed_tensors imports transformers
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )

    dest = str(dest)
    tensors, path = _float_fixture(dest)
    root = torch.nn.Module()
    names = _projections(tensors)
    for name in names:
        parent = root
        *parts, last = name.split(".")
        for part in parts:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        weight = tensors.pop(f"{name}.weight").float()
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight.data.copy_(weight)
        parent.add_module(last, linear)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.group_size and scheme.weights.group_size > 32:
        scheme.weights.group_size = 32  # the fixture's projections are 64 wide
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=FORMATS[preset])
    apply_quantization_config(root, config)
    for name in names:
        calibrate_minmax(root.get_submodule(name), scheme.weights)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(root)
    state = {k: v.contiguous() for k, v in root.state_dict().items()}
    save_file({**tensors, **state}, path, metadata={"format": "pt"})
    quantization = compressor.quantization_config.model_dump(mode="json")
    quantization["quant_method"] = "compressed-tensors"
    _write_config(dest, quantization)
    return dest


def calibrate_minmax(module: torch.nn.Module, args) -> None:
    """Min/max weight observers (llm-compressor's default ``minmax``) for one module the
    library set up, through its own ``calculate_qparams`` / ``generate_gparam``; also used by
    ``fixtures/compressed_tensors/_gen/make_ct_fixtures.py``."""
    from compressed_tensors.quantization.utils import calculate_qparams
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    w = module.weight.detach()
    strategy = str(getattr(args.strategy, "value", args.strategy))
    if strategy in ("group", "tensor_group"):
        grouped = w.reshape(w.shape[0], -1, args.group_size)
        low, high = grouped.amin(-1), grouped.amax(-1)
    elif strategy == "channel":
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    else:
        low, high = w.amin().reshape(1), w.amax().reshape(1)
    kwargs = {}
    if hasattr(module, "weight_global_scale"):
        global_scale = generate_gparam(w.amin(), w.amax())
        module.weight_global_scale.data.copy_(
            global_scale.reshape(module.weight_global_scale.shape)
        )
        kwargs["global_scale"] = global_scale
    scale, zero = calculate_qparams(low, high, args, **kwargs)
    module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(
        module.weight_scale.shape
    )
    module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(
        module.weight_zero_point.shape
    )


def modelopt_nvfp4_checkpoint(dest: str) -> str:
    dest = str(dest)
    tensors, path = _float_fixture(dest)
    generator = torch.Generator().manual_seed(0)
    for name in _projections(tensors):
        out, inp = tensors.pop(f"{name}.weight").shape
        tensors[f"{name}.weight"] = torch.randint(0, 256, (out, inp // 2), generator=generator,
                                                  dtype=torch.uint8)  # fmt: skip
        tensors[f"{name}.weight_scale"] = torch.full((out, inp // 16), 0.5).to(torch.float8_e4m3fn)
        tensors[f"{name}.weight_scale_2"] = torch.tensor(0.01)
        tensors[f"{name}.input_scale"] = torch.tensor(0.02)
    save_file(tensors, path, metadata={"format": "pt"})
    _write_config(dest, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                         "exclude_modules": ["lm_head"]})  # fmt: skip
    return dest
