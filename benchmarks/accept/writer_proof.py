"""Prove the export (``export.modelslim_tensors``) writes what msmodelslim writes, byte for byte.

The shared fixture ``q35_dense_w8a8_dynamic`` is unmodified msmodelslim 26.1.0 output (V1
engine, shipped ``Qwen3_5_dense_w8a8`` recipe) of a tiny Qwen3.5, and the reference file next
to it holds the ORIGINAL float ``mtp.*`` tensors it was quantized from. Running our writer on
those originals must give the fixture's bytes for every ``mtp.*`` tensor (int8 codes, f32
scales and offsets, untouched FLOAT tensors) and the same description entries. Runs on every
``make accept`` (it takes well under a second), so the claim is re-checked wherever the
numbers are produced.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from .export import modelslim_tensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO, "test", "fixtures", "modelslim", "q35_dense_w8a8_dynamic")
REFERENCE = os.path.join(
    REPO, "test", "fixtures", "reference", "q35_dense_w8a8_dynamic.safetensors"
)


@dataclass
class Proof:
    fixture: str
    compared: int
    identical: int
    quantized_weights: int
    description_matches: bool
    mismatches: list[str]
    fp32_identical: int  # the same writer computing in fp32: how many quantized tensors match
    quantized_tensors: int

    @property
    def ok(self) -> bool:
        return self.compared > 0 and self.identical == self.compared and self.description_matches

    def line(self) -> str:
        verdict = "byte-identical" if self.ok else "DIFFERENT"
        return (
            f"writer vs msmodelslim 26.1.0 ({os.path.basename(self.fixture)}): "
            f"{self.identical}/{self.compared} mtp.* tensors {verdict} "
            f"({self.quantized_weights} W8A8_DYNAMIC weights with their scales and offsets), "
            f"description entries {'identical' if self.description_matches else 'DIFFERENT'}; "
            f"the same writer in fp32 arithmetic matches only {self.fp32_identical}/"
            f"{self.quantized_tensors} quantized tensors, so the check discriminates"
        )


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def prove(fixture: str = FIXTURE, reference: str = REFERENCE) -> Proof:
    theirs: dict[str, torch.Tensor] = {}
    for path in sorted(glob.glob(os.path.join(fixture, "*.safetensors"))):
        theirs.update(load_file(path))
    with open(os.path.join(fixture, "quant_model_description.json"), encoding="utf-8") as handle:
        their_description = json.load(handle)
    originals = load_file(reference)
    ours, our_description = modelslim_tensors(originals)
    mismatches = []
    names = sorted(n for n in theirs if n.startswith("mtp."))
    identical = 0
    for name in names:
        mine = ours.get(name)
        same = (
            mine is not None
            and mine.dtype == theirs[name].dtype
            and tuple(mine.shape) == tuple(theirs[name].shape)
            and _bytes(mine) == _bytes(theirs[name])
        )
        identical += int(same)
        if not same:
            mismatches.append(name)
    extra = sorted(set(n for n in ours if n.startswith("mtp.")) - set(names))
    mismatches.extend(f"{n} (not in fixture)" for n in extra)
    description_matches = all(our_description.get(n) == their_description.get(n) for n in names)
    quantized = sum(1 for n in names if n.endswith(".weight") and theirs[n].dtype == torch.int8)
    # sensitivity: msmodelslim rounds in the layer's bf16; the fp32 formula must NOT match
    in_fp32, _ = modelslim_tensors({k: v.float() for k, v in originals.items()})
    quantized_names = [n for n in names if their_description.get(n) == "W8A8_DYNAMIC"]
    fp32_identical = sum(
        1
        for n in quantized_names
        if in_fp32[n].dtype == theirs[n].dtype and _bytes(in_fp32[n]) == _bytes(theirs[n])
    )
    return Proof(
        fixture,
        len(names) + len(extra),
        identical,
        quantized,
        description_matches,
        mismatches,
        fp32_identical,
        len(quantized_names),
    )
