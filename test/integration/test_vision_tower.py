"""The Qwen3.5/3.6 VL vision tower sglang 0.5.23 builds unquantized (``quant_config=None``) over
msmodelslim's W8A8_DYNAMIC codes (``serving/target_layers.py``, ``serving/target_stream.py``), on
sglang's real ``Qwen3_5ForConditionalGeneration`` and ``Qwen3_5MoeForConditionalGeneration``
built and loaded by its own ``DefaultModelLoader`` as the target of launch form F1 on NPU
(``support/sglang_load.py``: a fresh interpreter, the servers' CPU stand-ins).

Checkpoints: the real msmodelslim 26.1.0's exports ``test/fixtures/e2e/vl_hybrid`` (Qwen3.6-27B
dense recipe) and ``vl_moe`` (Qwen3.5-397B recipe, routed experts FLOAT; RECIPE.md of each):
``model.visual.blocks.0.attn.qkv`` / ``attn.proj`` / ``mlp.linear_fc1`` W8A8_DYNAMIC (int8,
f32 ``weight_scale`` (out, 1), zero ``weight_offset``, FLOAT bias). Expected values are computed
here from the checkpoint's tensors: ``(q - offset) * scale`` in fp32, rounded once to bf16.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from support.paths import E2E, REFERENCE
from support.sglang_load import (
    TOWER_QUANTIZED,
    load_model_in_subprocess,
    plugin_lines,
    warnings_of,
)

pytestmark = pytest.mark.slow

HYBRID, MOE = os.path.join(E2E, "vl_hybrid"), os.path.join(E2E, "vl_moe")
SHARD = "quant_model_weights-00001-of-00001.safetensors"
#: parameter of sglang's vision tower -> the checkpoint prefix that streams into it
VISION = {
    "visual.blocks.0.attn.qkv_proj": "model.visual.blocks.0.attn.qkv",
    "visual.blocks.0.attn.proj": "model.visual.blocks.0.attn.proj",
    "visual.blocks.0.mlp.linear_fc1": "model.visual.blocks.0.mlp.linear_fc1",
}
NOT_FOUND = "not found in params_dict"


def decoded(folder: str, prefix: str) -> torch.Tensor:
    """``(q - offset) * scale`` in fp32 from the checkpoint's own tensors, rounded to bf16."""
    tensors = load_file(os.path.join(folder, SHARD))
    q, scale = tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale"]
    offset = tensors[f"{prefix}.weight_offset"]
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    return ((q.float() - offset.float()) * scale.float()).to(torch.bfloat16)


#: the tower's own forward on the committed images (sglang's ``visual``, as its image requests
#: run it), processed by the folder's image processor
TOWER_FORWARD = f"""
import glob
from PIL import Image
from transformers import Qwen2VLImageProcessor
images = [Image.open(p) for p in sorted(glob.glob({os.path.join(E2E, "vl_images", "*.png")!r}))]
batch = Qwen2VLImageProcessor.from_pretrained(FOLDER)(images=images, return_tensors="pt")
with torch.no_grad():
    out = model.visual(batch["pixel_values"], batch["image_grid_thw"])
extra["tower"] = out.float().tolist()
"""


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> dict[bool, tuple[dict, dict]]:
    tmp = tmp_path_factory.mktemp("hybrid")
    return {
        p: load_model_in_subprocess(HYBRID, tmp, plugin=p, after=TOWER_FORWARD)
        for p in (False, True)
    }


def test_stock_sglang_loads_the_towers_int8_codes_as_weights(hybrid):
    """The baseline: stock sglang builds the three vision linears unquantized, copies their int8
    codes into the bf16 weights, and drops each scale and offset with a warning."""
    report, state = hybrid[False]
    tensors = load_file(os.path.join(HYBRID, SHARD))
    for param, prefix in VISION.items():
        assert report["layers"][param]["method"] == "UnquantizedLinearMethod"
        assert torch.equal(state[f"{param}.weight"], tensors[f"{prefix}.weight"].to(torch.bfloat16))
        for companion in ("weight_scale", "weight_offset"):
            assert f"Parameter {param}.{companion} {NOT_FOUND}" in warnings_of(report)


@pytest.mark.parametrize("folder", [HYBRID, MOE], ids=["dense-hybrid", "moe"])
def test_the_plugin_loads_the_decoded_tower_bit_for_bit(folder, hybrid, tmp_path):
    """With the plugin, each class's vision linears hold ``(q - offset) * scale`` (fp32, rounded
    once to bf16) exactly; the FLOAT bias and every other parameter are stock's (the MoE
    export's stock load stops at its FLOAT experts, sglang #34211: its other parameters are
    checked against the checkpoint); no scale goes missing; one INFO line names the layers."""
    report, state = (
        hybrid[True]
        if folder == HYBRID
        else load_model_in_subprocess(folder, tmp_path, plugin=True)
    )
    tensors = load_file(os.path.join(folder, SHARD))
    for param, prefix in VISION.items():
        assert report["layers"][param]["method"] == "UnquantizedLinearMethod"
        assert torch.equal(state[f"{param}.weight"], decoded(folder, prefix)), param
        assert torch.equal(state[f"{param}.bias"], tensors[f"{prefix}.bias"].to(torch.bfloat16))
    assert not [w for w in warnings_of(report) if "visual" in w], warnings_of(report)
    (line,) = [m for m in plugin_lines(report) if "linear layer(s) with the unquantized" in m]
    assert "sglang built 3 linear layer(s)" in line and "W8A8_DYNAMIC x3" in line
    assert "model.visual.blocks.0.attn.qkv_proj" in line
    if folder == HYBRID:
        stock = hybrid[False][1]
        others = [n for n in stock if not any(n.startswith(p) for p in VISION)]
        assert all(torch.equal(stock[n], state[n]) for n in others)
    else:
        assert state["visual.merger.linear_fc1.weight"].equal(
            tensors["model.visual.merger.linear_fc1.weight"]
        )


def test_where_sglang_builds_the_tower_quantized_the_plugin_steps_aside(tmp_path):
    """``support.sglang_load.TOWER_QUANTIZED`` (a stand-in for sglang PR #36426, not the code
    under test): sglang's
    ModelSlim gives the tower's layers its W8A8 scheme; the plugin finds no layer to decode,
    installs nothing and says nothing about the target, and the model is stock's."""
    (stock, stock_state), (with_plugin, state) = (
        load_model_in_subprocess(HYBRID, tmp_path, plugin=p, before=TOWER_QUANTIZED)
        for p in (False, True)
    )
    for param in VISION:
        assert with_plugin["layers"][param] == {
            "method": "ModelSlimLinearMethod",
            "scheme": "ModelSlimW8A8Int8",
        }
    assert with_plugin["layers"] == stock["layers"]
    assert stock_state.keys() == state.keys()
    assert all(torch.equal(stock_state[n], state[n]) for n in state)
    assert not [m for m in plugin_lines(with_plugin) if "unquantized" in m]


def test_a_tower_scheme_the_plugin_cannot_decode_stops_the_start_up(tmp_path):
    """``attn.qkv`` described W8A8SC (msmodelslim's sparse-compressed int8, which no decoder
    here reads): the start-up stops at build time, before any weight is read (the folder has
    no weight file), naming the layer, the recipe line and the sglang change."""
    folder = tmp_path / "w8a8sc_tower"
    folder.mkdir()
    shutil.copy(os.path.join(HYBRID, "config.json"), folder)
    with open(os.path.join(HYBRID, "quant_model_description.json")) as handle:
        described = json.load(handle)
    described.update(
        {k: "W8A8SC" for k in described if k.startswith("model.visual.blocks.0.attn.qkv.weight")}
    )
    (folder / "quant_model_description.json").write_text(json.dumps(described))
    report, _ = load_model_in_subprocess(str(folder), tmp_path, plugin=True)
    assert report.get("refused") == "UnservedLayerError", report
    message = report["message"]
    assert "model.visual.blocks.0.attn.qkv_proj: model.visual.blocks.0.attn.qkv (W8A8SC)" in message
    assert "'*visual.blocks*'" in message and "#36426" in message
    assert "attn.proj" not in message  # a W8A8_DYNAMIC layer the plugin decodes is not named


@pytest.mark.parametrize(
    "folder",
    ["vl_float", os.path.join(E2E, "hybrid_w8a8")],
    ids=["bf16-vl", "modelslim-no-layer-over-codes"],
)
def test_a_checkpoint_the_plugin_does_not_concern_loads_exactly_as_stock(folder, tmp_path):
    """A BF16 VL checkpoint (the float VL folder ``e2e/vl.py`` serves) and a ModelSlim export
    whose every linear layer finds its method (msmodelslim's Qwen3.5 recipe on the bundled
    hybrid): with the plugin every parameter, every method and every warning is stock's, and
    the plugin says nothing."""
    quantization = "modelslim"
    if folder == "vl_float":
        from e2e.vl import float_folder

        folder, quantization = float_folder("hybrid", str(tmp_path)), None
    (stock, stock_state), (with_plugin, state) = (
        load_model_in_subprocess(folder, tmp_path, plugin=p, quantization=quantization)
        for p in (False, True)
    )
    assert with_plugin["layers"] == stock["layers"]
    assert stock_state.keys() == state.keys()
    assert all(torch.equal(stock_state[n], state[n]) for n in state)
    assert warnings_of(with_plugin) == warnings_of(stock)
    assert plugin_lines(with_plugin) == []


#: msmodelslim's static-W8A8 export of the tower (``_gen/vl_static_tower.yaml``): its tensors,
#: its description entries in the metadata
STATIC = os.path.join(REFERENCE, "vl_hybrid_static_tower.safetensors")


def static_tower_folder(tmp_path) -> str:
    """``vl_hybrid`` with its tower's three layers as msmodelslim wrote them static W8A8."""
    with safe_open(STATIC, "pt") as handle:
        entries = json.loads(handle.metadata()["description"])
    tower = load_file(STATIC)
    layers = tuple(f"{prefix}." for prefix in VISION.values())
    folder = tmp_path / "static_tower"
    folder.mkdir()
    for name in os.listdir(HYBRID):
        if not name.startswith(("quant_model", "RECIPE")):
            shutil.copy(os.path.join(HYBRID, name), folder)
    tensors = {
        k: v for k, v in load_file(os.path.join(HYBRID, SHARD)).items() if not k.startswith(layers)
    }
    save_file({**tensors, **tower}, str(folder / SHARD), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys([*tensors, *tower], SHARD)}
    (folder / "quant_model_weights.safetensors.index.json").write_text(json.dumps(index))
    with open(os.path.join(HYBRID, "quant_model_description.json")) as handle:
        described = {k: v for k, v in json.load(handle).items() if not k.startswith(layers)}
    (folder / "quant_model_description.json").write_text(json.dumps({**described, **entries}))
    return str(folder)


def test_a_static_w8a8_tower_is_decoded_bit_for_bit(tmp_path):
    """The tower static W8A8 as msmodelslim writes it (int8 ``weight``, ``deq_scale`` (out),
    ``input_scale`` / ``input_offset`` (1), int32 ``quant_bias``, FLOAT ``bias``; no
    ``weight_scale``), spliced into ``vl_hybrid``: each vision linear holds
    ``q * (deq_scale / input_scale)`` in fp32, rounded once to bf16, exactly, and its bias."""
    report, state = load_model_in_subprocess(static_tower_folder(tmp_path), tmp_path, plugin=True)
    assert "refused" not in report, report.get("message")
    tower = load_file(STATIC)
    for param, prefix in VISION.items():
        q, deq = tower[f"{prefix}.weight"], tower[f"{prefix}.deq_scale"]
        # a float32 source: msmodelslim stores deq_scale's f32 bits widened to int64
        assert f"{prefix}.weight_scale" not in tower and deq.dtype == torch.int64
        deq = (deq & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        scale = deq.reshape(-1, 1) / tower[f"{prefix}.input_scale"].float()
        want = (q.float() * scale).to(torch.bfloat16)
        assert torch.equal(state[f"{param}.weight"], want), param
        assert torch.equal(state[f"{param}.bias"], tower[f"{prefix}.bias"].to(torch.bfloat16))
    (line,) = [m for m in plugin_lines(report) if "linear layer(s) with the unquantized" in m]
    assert "W8A8 x3" in line


def test_the_towers_own_forward_stock_plugin_and_float(hybrid, tmp_path):
    """sglang's tower forward on the committed images: with the plugin exactly the float VL
    folder's (the fixture's tower layers sit on msmodelslim's int8 grid, so the decode is the
    float tower bit for bit); stock's is off by more than the output itself (raw codes through
    three layers: the merger's norm bounds its size, not its direction)."""
    from e2e.vl import float_folder

    folder = float_folder("hybrid", str(tmp_path))
    floats, _ = load_model_in_subprocess(
        folder, tmp_path, plugin=False, quantization=None, after=TOWER_FORWARD
    )
    want = torch.tensor(floats["extra"]["tower"])
    plugin = torch.tensor(hybrid[True][0]["extra"]["tower"])
    stock = torch.tensor(hybrid[False][0]["extra"]["tower"])
    assert want.shape == (16, 192)  # four images, four merged tokens each
    assert torch.equal(plugin, want)
    assert (stock - want).norm() > want.norm()
