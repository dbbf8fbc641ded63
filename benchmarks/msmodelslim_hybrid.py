"""The real msmodelslim 26.1.0 on the bundled trained hybrid Qwen3.5: what its recipes quantize.

Usage (``make e2e-hybrid-msmodelslim`` builds msmodelslim's venv and runs this with it)::

    .cache/venv-ms/bin/python benchmarks/msmodelslim_hybrid.py \\
        --float test/fixtures/e2e/hybrid_float --exporter test/fixtures/e2e/hybrid_w8a8 \\
        --work .cache/msmodelslim-hybrid --json .cache/msmodelslim-hybrid/report.json

msmodelslim's Qwen3.5 adapter reads a Qwen3.5 release folder (``Qwen3_5ForConditionalGeneration``:
vision tower, tokenizer, image processor, ``mtp.*`` in its own shard). The bundled model is the
text model of that class, so the source is written in the release layout around its exact
tensors: the text weights under ``model.language_model.``, its MTP head, a one-block random
vision tower (seed 0), and a byte tokenizer whose ids are the model's byte ids (the seven special
tokens take ids 0-6, bytes no Python source holds). The msmodelslim CLI then runs unmodified
(``test/fixtures/modelslim/_gen/ms_cpu_shim.py``: the CPU shims the ``_gen`` fixtures were made
with) for each recipe in ``RECIPES``: ``--quant_type w8a8`` resolves msmodelslim's own best
practice for the model type.

For each output the report says which Gated DeltaNet projections (``linear_attn.in_proj_qkv``,
``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``out_proj``) came out quantized, and compares the
Qwen3.5 recipe's tensors with ``--exporter`` (the project writer's export the e2e fixture
holds): every tensor equal byte for byte, names mapped from the release layout. Whether sglang's
NPU packed-module mapping covers a quantized GDN projection is asked of sglang itself in
``test/e2e/test_e2e_shims.py`` (this venv has no sglang).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MS_GEN = os.path.join(REPO, "test", "fixtures", "modelslim", "_gen")
#: label -> msmodelslim CLI arguments (model type and quant type: msmodelslim picks the recipe)
RECIPES = {
    "qwen3_5_w8a8": ("Qwen3.5-27B", "w8a8"),
    "qwen3_6_w8a8": ("Qwen3.6-27B", "w8a8"),
}
GDN_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
TEXT_PREFIX, RELEASE_TEXT_PREFIX = "model.", "model.language_model."
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (what tokenizers' ByteLevel uses)."""
    visible = list(range(ord("!"), ord("~") + 1))
    visible += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in visible:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(out: str):
    """A byte tokenizer: id = byte, except the specials at ids 0..6."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in enumerate(_byte_chars()) if byte >= len(SPECIALS)}
    vocab.update({token: index for index, token in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    ids = {t: fast.convert_tokens_to_ids(t) for t in SPECIALS}
    assert ids == {t: i for i, t in enumerate(SPECIALS)}, ids
    assert len(fast) == 256, len(fast)
    fast.save_pretrained(out)
    return ids


def write_release_source(float_dir: str, out: str) -> dict:
    """The bundled float model in Qwen3.5's release layout (see the module docstring)."""
    from transformers import Qwen2VLImageProcessor, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(float_dir, "config.json"), encoding="utf-8") as handle:
        text_config = json.load(handle)
    ids = write_tokenizer(out)
    text_config.pop("architectures", None)
    text_config["eos_token_id"] = ids["<|im_end|>"]
    vision = dict(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=text_config["hidden_size"],
        num_position_embeddings=64,
    )
    config = Qwen3_5Config(
        text_config=text_config,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.dtype = torch.bfloat16
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16)
    with safe_open(os.path.join(float_dir, "model.safetensors"), "pt") as handle:
        bundled = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    text = {
        (RELEASE_TEXT_PREFIX + n[len(TEXT_PREFIX) :] if n.startswith(TEXT_PREFIX) else n): t
        for n, t in bundled.items()
        if not n.startswith("mtp.")
    }
    missing, unexpected = model.load_state_dict(text, strict=False)
    assert not unexpected, unexpected
    assert all(name.startswith("model.visual.") for name in missing), missing
    model.save_pretrained(out, max_shard_size="2MB")
    mtp = {n: t.contiguous() for n, t in bundled.items() if n.startswith("mtp.")}
    save_file(mtp, os.path.join(out, "model-mtp.safetensors"), metadata={"format": "pt"})
    index_path = os.path.join(out, "model.safetensors.index.json")
    with open(index_path, encoding="utf-8") as handle:
        index = json.load(handle)
    index["weight_map"].update({name: "model-mtp.safetensors" for name in mtp})
    with open(index_path, "w", encoding="utf-8") as handle:
        json.dump(index, handle, indent=2)
    Qwen2VLImageProcessor(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
    ).save_pretrained(out)
    return {"text_tensors": len(text), "mtp_tensors": len(mtp)}


def run_msmodelslim(source: str, out: str, model_type: str, quant_type: str, log: str) -> int:
    command = [
        sys.executable,
        os.path.join(MS_GEN, "ms_cpu_shim.py"),
        "quant",
        "--model_type",
        model_type,
        "--model_path",
        source,
        "--save_path",
        out,
        "--device",
        "cpu",
        "--quant_type",
        quant_type,
    ]
    with open(log, "w", encoding="utf-8") as handle:
        # "y" answers msmodelslim's best-practice confirmation prompt
        return subprocess.run(
            command, input="y\n", text=True, stdout=handle, stderr=subprocess.STDOUT, cwd=MS_GEN
        ).returncode


def gdn_types(description: dict) -> dict[str, dict[str, int]]:
    """Projection -> {type: layers} for the GDN projections' weights in a description."""
    found: dict[str, Counter] = {p: Counter() for p in GDN_PROJECTIONS}
    for name, kind in description.items():
        for projection in GDN_PROJECTIONS:
            if name.endswith(f"linear_attn.{projection}.weight"):
                found[projection][kind] += 1
    return {p: dict(c) for p, c in found.items()}


def _tensors(folder: str) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), "pt") as handle:
                out.update({n: handle.get_tensor(n) for n in handle.keys()})  # noqa: SIM118
    return out


def compare_with_exporter(ms_dir: str, exporter_dir: str) -> dict:
    """msmodelslim's text tensors against the exporter's, names mapped to the text layout."""
    ms = {
        (TEXT_PREFIX + n[len(RELEASE_TEXT_PREFIX) :] if n.startswith(RELEASE_TEXT_PREFIX) else n): t
        for n, t in _tensors(ms_dir).items()
        if not n.startswith("model.visual.")
    }
    ours = _tensors(exporter_dir)
    differ = sorted(
        n
        for n in set(ms) & set(ours)
        if ms[n].dtype != ours[n].dtype or not torch.equal(ms[n], ours[n])
    )
    return {
        "tensors_compared": len(set(ms) & set(ours)),
        "only_msmodelslim": sorted(set(ms) - set(ours)),
        "only_exporter": sorted(set(ours) - set(ms)),
        "differ": differ,
    }


def write_text_layout(ms_dir: str, float_dir: str, out: str) -> None:
    """msmodelslim's output as the bundled text model's folder (``Qwen3_5ForCausalLM``): its
    text and MTP tensors and description entries unchanged, names without the release's
    ``language_model.``, the vision tower dropped, the float folder's config.json."""
    import shutil

    def text_name(name: str) -> str | None:
        if name.startswith("model.visual."):
            return None
        if name.startswith(RELEASE_TEXT_PREFIX):
            return TEXT_PREFIX + name[len(RELEASE_TEXT_PREFIX) :]
        return name

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    tensors = {text_name(n): t for n, t in _tensors(ms_dir).items() if text_name(n)}
    shard = "quant_model_weights-00001-of-00001.safetensors"
    save_file(tensors, os.path.join(out, shard), metadata={"format": "pt"})
    with open(os.path.join(out, "quant_model_weights.safetensors.index.json"), "w") as handle:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        json.dump(
            {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(tensors, shard)},
            handle,
            indent=2,
        )
    with open(os.path.join(ms_dir, "quant_model_description.json"), encoding="utf-8") as handle:
        description = json.load(handle)
    renamed = {}
    for name, kind in description.items():
        if isinstance(kind, str) and "." in name:
            if text_name(name):
                renamed[text_name(name)] = kind
        else:
            renamed[name] = kind  # the global entries (version, model_quant_type, ...)
    with open(os.path.join(out, "quant_model_description.json"), "w", encoding="utf-8") as handle:
        json.dump(renamed, handle, indent=4)
    shutil.copy(os.path.join(float_dir, "config.json"), os.path.join(out, "config.json"))


def chosen_recipe(out: str) -> str | None:
    """The config_id msmodelslim re-dumped beside its output (the best practice it chose)."""
    for file in os.listdir(out):
        if file.endswith("_best_practice.yaml"):
            with open(os.path.join(out, file), encoding="utf-8") as handle:
                for line in handle:
                    if line.strip().startswith("config_id:"):
                        return line.split(":", 1)[1].strip()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--float", required=True, help="the bundled hybrid float folder")
    parser.add_argument("--exporter", required=True, help="the project writer's ModelSlim export")
    parser.add_argument("--work", required=True, help="folder for the source and the outputs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.work = os.path.abspath(args.work)  # msmodelslim runs in _gen/, where its shims are
    import msmodelslim

    source = os.path.join(args.work, "source")
    report: dict = {
        "msmodelslim": getattr(msmodelslim, "__version__", "26.1.0"),
        "source": write_release_source(args.float, source),
        "recipes": {},
    }
    for label, (model_type, quant_type) in RECIPES.items():
        out = os.path.join(args.work, label)
        log = os.path.join(args.work, f"{label}.log")
        code = run_msmodelslim(source, out, model_type, quant_type, log)
        entry: dict = {"model_type": model_type, "quant_type": quant_type, "exit": code, "log": log}
        if code == 0:
            with open(os.path.join(out, "quant_model_description.json"), encoding="utf-8") as f:
                description = json.load(f)
            entry["config_id"] = chosen_recipe(out)
            entry["gdn"] = gdn_types(description)
            entry["mtp_quantized"] = sorted(
                n for n, k in description.items() if n.startswith("mtp.") and k != "FLOAT"
            )
            entry["vs_exporter"] = compare_with_exporter(out, args.exporter)
            entry["text_layout"] = f"{out}_text"
            write_text_layout(out, args.float, entry["text_layout"])
        report["recipes"][label] = entry
        print(f"{label}: {json.dumps(entry, indent=1)}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    return 0 if all(r["exit"] == 0 for r in report["recipes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
