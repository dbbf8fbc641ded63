"""Other quantizers' exports told apart by name (formats/foreign.py): config.json's
quantization_config and the companions beside a weight name the format, so nothing foreign is
read with ModelSlim's rules."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang_mtp_dequant.formats.config import CheckpointConfig
from sglang_mtp_dequant.formats.foreign import (
    DeclaredFormat,
    declared_format,
    foreign_base,
    has_foreign_parts,
    tensor_format,
)

X = "mtp.fc"
F8 = torch.float8_e4m3fn
CT = DeclaredFormat("compressed-tensors", ("pack-quantized",))
MODELOPT = DeclaredFormat("modelopt", ("FP8",))


def layer(**parts: torch.dtype) -> dict[str, torch.dtype]:
    return {f"{X}.{part}": dtype for part, dtype in parts.items()}


def test_compressed_tensors_formats_from_config_groups_once_each():
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "mixed-precision",
            "config_groups": {
                "group_0": {"format": "pack-quantized"},
                "group_1": {"format": "mixed-precision"},
                "group_2": {"weights": {}},
            },
        }
    }
    declared = declared_format(config)
    assert declared == DeclaredFormat("compressed-tensors", ("mixed-precision", "pack-quantized"))
    assert declared.label == "compressed-tensors (mixed-precision, pack-quantized)"


def test_modelopt_quant_algo_flat_or_nested():
    flat = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    assert declared_format(flat) == DeclaredFormat("modelopt", ("NVFP4",))
    nested = {
        "quantization_config": {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}
    }
    assert declared_format(nested) == DeclaredFormat("modelopt", ("FP8",))


def test_a_quantization_config_under_text_config_or_without_method():
    config = {"text_config": {"quantization_config": {"weights": {}}}}
    declared = declared_format(config)
    assert declared == DeclaredFormat("unknown", ())
    assert declared.label == "unknown"


@pytest.mark.parametrize(
    "config", [{}, {"quantization_config": "fp8"}, {"text_config": []}, [], None]
)
def test_no_quantization_config_declares_nothing(config):
    assert declared_format(config) is None


def test_a_checkpoint_config_is_read_like_its_raw_dict(tmp_path):
    with open(os.path.join(str(tmp_path), "config.json"), "w") as handle:
        json.dump({"quantization_config": {"quant_method": "fp8"}}, handle)
    assert declared_format(CheckpointConfig.read(str(tmp_path))) == DeclaredFormat("fp8", ())


def test_foreign_base_only_for_parts_msmodelslim_never_writes():
    assert foreign_base(f"{X}.weight_packed") == X
    assert foreign_base(f"{X}.weight_scale_2") == X
    assert foreign_base(f"{X}.weight_g_idx") == X
    assert foreign_base(f"{X}.weight_scale") is None
    assert foreign_base(f"{X}.weight") is None
    assert foreign_base("weight_packed") is None


def test_a_modelslim_layer_and_a_float_weight_are_not_foreign():
    modelslim = layer(weight=torch.int8, weight_scale=torch.float32, weight_offset=torch.float32)
    assert tensor_format(f"{X}.weight", modelslim, None) is None
    assert tensor_format(f"{X}.weight", layer(weight=torch.bfloat16), None) is None
    fp8 = DeclaredFormat("fp8", ())  # a format the plugin's own schemes know
    assert tensor_format(f"{X}.weight", layer(weight=F8, weight_scale=torch.float32), fp8) is None


def test_compressed_tensors_pack_quantized_and_its_parts():
    dtypes = layer(
        weight_packed=torch.int32,
        weight_scale=torch.bfloat16,
        weight_shape=torch.int64,
        weight_zero_point=torch.int32,
    )
    dtypes["mtp.fc_other.weight_scale"] = torch.float32  # another layer's, not X's
    fmt = tensor_format(f"{X}.weight_packed", dtypes, CT)
    assert fmt is not None and fmt.name == "compressed-tensors pack-quantized"
    assert fmt.parts == (f"{X}.weight_scale", f"{X}.weight_shape", f"{X}.weight_zero_point")
    assert has_foreign_parts(fmt, f"{X}.weight_packed")
    assert tensor_format(f"{X}.weight_packed", dtypes, None) == fmt  # the names alone suffice


def test_compressed_tensors_nvfp4_by_its_global_scale():
    dtypes = layer(
        weight_packed=torch.uint8,
        weight_scale=F8,
        weight_global_scale=torch.float32,
        input_global_scale=torch.float32,
    )
    fmt = tensor_format(f"{X}.weight_packed", dtypes, None)
    assert fmt is not None and fmt.name == "compressed-tensors nvfp4-pack-quantized"
    assert len(fmt.parts) == 3


@pytest.mark.parametrize(
    "weight, name",
    [
        (torch.int8, "compressed-tensors int-quantized"),
        (F8, "compressed-tensors float-quantized"),
        (torch.float8_e5m2, "compressed-tensors float-quantized"),
        (torch.bfloat16, "compressed-tensors (pack-quantized)"),
    ],
)
def test_compressed_tensors_unpacked_by_the_weights_dtype(weight, name):
    fmt = tensor_format(f"{X}.weight", layer(weight=weight, weight_scale=torch.float32), CT)
    assert fmt is not None and fmt.name == name
    assert fmt.parts == (f"{X}.weight_scale",)
    assert not has_foreign_parts(fmt, f"{X}.weight")


@pytest.mark.parametrize(
    "weight, name",
    [
        (torch.uint8, "ModelOpt NVFP4"),
        (F8, "ModelOpt FP8"),
        (torch.int8, "ModelOpt (unknown)"),
    ],
)
def test_modelopt_by_weight_scale_2_without_any_config(weight, name):
    dtypes = layer(weight=weight, weight_scale=F8, weight_scale_2=torch.float32)
    fmt = tensor_format(f"{X}.weight", dtypes, None)
    assert fmt is not None and fmt.name == name
    assert has_foreign_parts(fmt, f"{X}.weight")


def test_modelopt_fp8_declared_in_config_has_only_modelslim_named_parts():
    dtypes = layer(weight=F8, weight_scale=torch.float32, input_scale=torch.float32)
    fmt = tensor_format(f"{X}.weight", dtypes, MODELOPT)
    assert fmt is not None and fmt.name == "ModelOpt FP8"
    assert fmt.parts == (f"{X}.input_scale", f"{X}.weight_scale")
    assert not has_foreign_parts(fmt, f"{X}.weight")
    declared = DeclaredFormat("modelopt_fp4", ("NVFP4",))
    odd = tensor_format(f"{X}.weight", layer(weight=torch.bfloat16), declared)
    assert odd is not None and odd.name == "modelopt_fp4 (NVFP4)"


def test_foreign_parts_with_no_config_or_an_unlisted_method():
    dtypes = layer(weight=torch.int8, weight_scale=torch.float32, weight_zero_point=torch.int8)
    unknown = tensor_format(f"{X}.weight", dtypes, None)
    assert unknown is not None and unknown.name == "an unknown format (no quantization_config)"
    gptq = tensor_format(f"{X}.weight", dtypes, DeclaredFormat("gptq", ("int4",)))
    assert gptq is not None and gptq.name == "gptq (int4)"
    assert has_foreign_parts(gptq, f"{X}.weight")
