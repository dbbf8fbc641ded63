"""What the guard says (serving/guard/report.py): sources, findings and the error an operator
reads, on small hand-built inputs."""

from __future__ import annotations

import os

import torch

from sglang_mtp_dequant.errors import DraftWeightError
from sglang_mtp_dequant.formats.library import DECODED_FORMATS
from sglang_mtp_dequant.serving.guard.report import (
    MODE_ENV,
    Finding,
    MisloadedDraftError,
    Source,
    SourceIndex,
    quantized_draft_hint,
    sources_from_checkpoint,
)
from sglang_mtp_dequant.serving.guard.values import CodeEvidence
from unit.helpers import W, open_folder, w8a8_checkpoint

QKV = "model.layers.0.self_attn.qkv_proj.weight"
Q, K, V = (f"mtp.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
EVIDENCE = CodeEvidence(((128, 256),), 384, 127.0, 16, "integer")


def codes_finding(sources: list[Source] | None = None) -> Finding:
    return Finding(QKV, torch.bfloat16, (384, 64), EVIDENCE, sources=sources or [])


def test_a_source_says_how_it_streamed():
    raw = Source(K, torch.int8, "/ckpt/part-00002.safetensors", "W8A8_DYNAMIC")
    assert raw.raw_codes
    assert raw.describe() == (
        f"{K} (int8, copied as raw codes, described as W8A8_DYNAMIC, in part-00002.safetensors)"
    )
    decoded = Source(K, torch.int8, dequantized=True)
    assert not decoded.raw_codes
    assert decoded.describe() == f"{K} (int8, dequantized by the plugin)"
    assert not Source(Q, torch.bfloat16).raw_codes
    assert Source(Q, torch.float8_e4m3fn).raw_codes
    assert Source(Q).describe() == Q and not Source(Q).raw_codes


def test_a_finding_of_codes_names_rows_and_sources():
    finding = codes_finding([Source(Q, torch.bfloat16), Source(K, torch.int8)])
    assert finding.describe() == (
        f"{QKV} [bfloat16 [384, 64]]: rows 128-255 of 384 are all integers (absmax 127, at "
        f"least 16 distinct values); fed by {Q} (bfloat16), {K} (int8, copied as raw codes)"
    )


def test_a_finding_lists_six_sources_and_counts_the_rest():
    sources = [Source(f"mtp.layers.0.mlp.experts.{e}.up_proj.weight") for e in range(9)]
    text = codes_finding(sources).describe()
    assert text.endswith("mtp.layers.0.mlp.experts.5.up_proj.weight and 3 more")
    assert "experts.6." not in text


def test_unwritten_and_nonfinite_findings_say_what_is_wrong():
    unwritten = Finding("model.fc.weight", torch.bfloat16, (8, 16), unwritten="all of it")
    assert unwritten.describe() == (
        "model.fc.weight [bfloat16 [8, 16]]: never written by sglang's loaders (all of it); "
        "no checkpoint tensor of this name streamed"
    )
    meant = Finding(
        "model.fc.weight", torch.bfloat16, (8, 16), unwritten="rows 0-7", meant=["mtp.fc.scale"]
    )
    assert meant.describe().endswith(
        "no checkpoint tensor of this name streamed, only mtp.fc.scale, which sglang's loaders "
        "skipped"
    )
    nan = Finding("model.norm.weight", torch.float32, (16,), nonfinite_rows=3)
    assert nan.describe() == (
        "model.norm.weight [float32 [16]]: 3 rows hold NaN or inf; checkpoint tensor not "
        "identified (no streamed draft name maps to it)"
    )
    bare = Finding("model.x.weight", torch.bfloat16, (2, 2))
    assert "loaded from codes that nothing dequantized" in bare.describe()


def test_sources_from_a_checkpoint_carry_dtype_file_and_description(tmp_path):
    w8a8_checkpoint(str(tmp_path))
    by_name = {s.name: s for s in sources_from_checkpoint(open_folder(str(tmp_path)))}
    assert set(by_name) == {
        f"{W}.weight",
        f"{W}.weight_scale",
        f"{W}.weight_offset",
        "mtp.norm.weight",
    }
    weight = by_name[f"{W}.weight"]
    assert (weight.dtype, weight.description_type) == (torch.int8, "W8A8_DYNAMIC")
    assert weight.file == os.path.join(str(tmp_path), "quant_model_weights.safetensors")
    assert by_name["mtp.norm.weight"].description_type == "FLOAT"
    assert not weight.dequantized


def test_the_source_index_maps_a_stacked_parameter_to_its_parts():
    index = SourceIndex([Source(n, torch.int8) for n in (Q, K, V)])
    assert [s.name for s in index.sources_of(QKV)] == [Q, K, V]
    assert all(s.dtype == torch.int8 for s in index.sources_of(QKV))
    assert index.sources_of("model.layers.0.mlp.gate_up_proj.weight") == []


def test_the_write_record_wins_over_naming_and_unknown_names_are_bare_sources():
    index = SourceIndex([Source(Q, torch.int8)], fed_by={QKV: [K, Q]})
    assert index.sources_of(QKV) == [Source(K), Source(Q, torch.int8)]


def test_the_error_names_the_first_source_its_file_and_what_to_do():
    source = Source(K, torch.int8, "/ckpt/part-00002.safetensors")
    error = MisloadedDraftError([codes_finding([source])], "Qwen3_5ForCausalLMMTP", "/ckpt")
    assert isinstance(error, DraftWeightError)
    assert (error.tensor, error.file) == (K, "/ckpt/part-00002.safetensors")
    assert error.problem == (
        "the Qwen3_5ForCausalLMMTP draft loaded from /ckpt would serve garbage: raw codes "
        "instead of weights in 1 parameter(s)"
    )
    message = str(error)
    assert message.startswith(f"sglang-mtp-dequant: {error.problem}:\n  - {QKV} [bfloat16")
    assert "What to do: run `sglang-mtp-dequant doctor /ckpt` to see" in message
    assert f"{MODE_ENV}=warn starts anyway" in message


def test_the_error_without_sources_names_the_parameter_and_kinds_of_harm():
    findings = [
        Finding("model.fc.weight", torch.bfloat16, (8, 16), unwritten="all of it"),
        Finding("model.norm.weight", torch.float32, (16,), nonfinite_rows=1),
        codes_finding(),
    ]
    error = MisloadedDraftError(findings, "DeepseekV3ForCausalLMNextN", None)
    assert (error.tensor, error.file) == ("model.fc.weight", None)
    assert error.problem == (
        "the DeepseekV3ForCausalLMNextN draft would serve garbage: parts no checkpoint tensor "
        "wrote and raw codes instead of weights and NaN or inf in 3 parameter(s)"
    )
    assert "run `sglang-mtp-dequant doctor` to see" in error.hint
    assert len(error.details) == 3


def test_the_error_lists_eight_skipped_tensors_and_a_note():
    skipped = [f"mtp.extra.{i}" for i in range(10)]
    error = MisloadedDraftError([codes_finding()], "C", "/m", skipped=skipped, note="see above")
    assert error.skipped == skipped
    assert error.details[-2] == (
        "  checkpoint tensors sglang's loaders skipped: " + ", ".join(skipped[:8]) + " and 2 more"
    )
    assert error.details[-1] == "  see above"


def test_a_draft_built_quantized_gets_the_quantized_hint():
    error = MisloadedDraftError([codes_finding()], "C", "/m", built_quantized="modelslim")
    assert "loaded from /m, built quantized (modelslim), would serve garbage" in error.problem
    assert error.hint == quantized_draft_hint("sglang-mtp-dequant doctor /m")
    hint = quantized_draft_hint("sglang-mtp-dequant doctor /m")
    assert hint.startswith("run `sglang-mtp-dequant doctor /m <your launch flags")
    assert ", ".join(DECODED_FORMATS) in hint
    assert hint.endswith(f"{MODE_ENV}=warn starts anyway (the draft then proposes garbage tokens)")
