"""sglang's own server with EAGLE on the CPU serving the bundled VL exports: text and images.

Usage (``make e2e-vl`` runs the first line)::

    .venv/bin/python -m e2e.vl --log-dir .cache/e2e/vl --json .cache/e2e/vl.json
    .venv/bin/python -m e2e.vl --family hybrid

Per family (``FAMILIES``): the msmodelslim export ``test/fixtures/e2e/vl_<family>`` (its vision
tower W8A8_DYNAMIC, as msmodelslim's Qwen3.6 / Qwen3.5-397B recipes write it; RECIPE.md) served
as users serve it, one folder in launch form F1 (no quantization flag: sglang auto-detects
ModelSlim for the target and builds the vision tower unquantized, the MTP draft unquantized),
EAGLE 3/1/4, with the plugin (``plugin``) and without it (``stock``, ``SGLANG_PLUGINS=none``).
Beside them, assembled under ``--log-dir``: ``float_tower``, the same export with the tower's
quantized layers replaced by their float originals and described FLOAT (the target's text path
exactly the export's: what a right tower gives there), and ``float``, the float VL folder (the
text model of ``../<family>_float``, the float tower, the export's config, tokenizer and image
processor: the model before msmodelslim). The float tower is
``test/fixtures/reference/vl_<family>_visual.safetensors``; the fixture's quantized tower layers
sit on msmodelslim's int8 grid, so their decode is that tower bit for bit. Each server gets the
held-out text prompts (byte ids, greedy, EOS ignored) and one image request per
``test/fixtures/e2e/vl_images/*.png`` (four coloured squares the tower reads as four bytes,
``_gen/vl_fixture.py``) through sglang's own multimodal processor, the servers running with
their tokenizer (``e2e.server``'s CPU flags without ``--skip-tokenizer-init``). The NPU-only
pieces are the other runs' CPU stand-ins (``e2e/site/``).

Passes when, per family: the plugin's text accept length is at least 0.97 x the float folder's;
the plugin answers every image with ``float_tower``'s tokens; the float folder's answers differ
between images (the image decides); stock either answers (shown; at least one must differ from
``float_tower``'s) or stops at start-up (its error shown). How many of the plugin's answers equal
the float folder's is reported: where they differ, the export's W8A8 text layers (per-token int8
activations) answer otherwise than the float model's, with or without a tower. Last line:
``e2e-vl <family> accept_length float=F plugin=P stock=S images plugin=float_tower N/N ...``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from e2e.client import Generation, generate
from e2e.inputs import heldout_prompts
from e2e.server import Server, ServerError, ServerRun, plugin_messages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "test", "fixtures")
IMAGES = os.path.join(FIXTURES, "e2e", "vl_images")
#: family -> (the export, the float text folder it was made from)
FAMILIES = {
    "hybrid": ("vl_hybrid", "hybrid_float"),
    "moe": ("vl_moe", "moe_float"),
}
#: what the float folder takes from the export besides weights (tokenizer, processor, config)
COPIED = ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json")
COPIED += ("tokenizer_config.json", "chat_template.jinja")
#: an image request's text: the image alone, as Qwen's chat template places it
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
ACCEPT_BAR = 0.97


@dataclass(frozen=True)
class VLRun(ServerRun):
    """A server with its tokenizer (sglang's multimodal processor needs it)."""

    def command(self, port: int) -> list[str]:
        return [a for a in super().command(port) if a != "--skip-tokenizer-init"]


@dataclass
class Served:
    """One server's answers: text generations, image answers by image, or its start-up error."""

    label: str
    text: list[Generation] = field(default_factory=list)
    images: dict[str, list[int]] = field(default_factory=dict)
    error: str = ""
    log: str = ""

    @property
    def accept_length(self) -> float | None:
        steps = sum(int(g.meta.get("spec_verify_ct", 0)) for g in self.text)
        tokens = sum(int(g.meta["completion_tokens"]) for g in self.text)
        return tokens / steps if steps else None


def float_folder(family: str, out: str) -> str:
    """The float VL folder of ``family`` under ``out`` (see the module docstring)."""
    from safetensors.torch import load_file, save_file

    export, text = (os.path.join(FIXTURES, "e2e", n) for n in FAMILIES[family])
    folder = os.path.join(out, f"vl_{family}_float")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)  # its parent too
    tensors = {
        f"model.language_model.{n[len('model.') :]}" if n.startswith("model.") else n: t
        for n, t in load_file(os.path.join(text, "model.safetensors")).items()
    }
    reference = os.path.join(FIXTURES, "reference", f"vl_{family}_visual.safetensors")
    tensors.update(load_file(reference))
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    for name in COPIED:
        if os.path.isfile(os.path.join(export, name)):
            shutil.copy(os.path.join(export, name), folder)
    return folder


def float_tower_folder(family: str, out: str) -> str:
    """The export with the tower's quantized layers as their float originals, described FLOAT
    (see the module docstring)."""
    from safetensors.torch import load_file, save_file

    export = os.path.join(FIXTURES, "e2e", FAMILIES[family][0])
    folder = os.path.join(out, f"vl_{family}_float_tower")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(export, folder)
    tower = load_file(os.path.join(FIXTURES, "reference", f"vl_{family}_visual.safetensors"))
    with open(os.path.join(export, "quant_model_description.json"), encoding="utf-8") as handle:
        described = json.load(handle)
    weight_map: dict[str, str] = {}
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        tensors = load_file(path)
        quantized = {n for n in tensors if ".visual." in n and described.get(n) != "FLOAT"}
        for name in quantized:
            del tensors[name]
            described.pop(name)
            if name.endswith(".weight"):
                tensors[name], described[name] = tower[name], "FLOAT"
        save_file(tensors, path, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, os.path.basename(path)))
    index = os.path.join(folder, "quant_model_weights.safetensors.index.json")
    with open(index, "w", encoding="utf-8") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    with open(
        os.path.join(folder, "quant_model_description.json"), "w", encoding="utf-8"
    ) as handle:
        json.dump(described, handle, indent=1)
    return folder


def ask_image(url: str, image: str, new_tokens: int) -> list[int]:
    """One greedy request of ``image`` alone (EOS ignored): the answer's token ids."""
    body: dict[str, Any] = {
        "text": IMAGE_TEXT,
        "image_data": image,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True},
    }
    request = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        return list(json.loads(response.read())["output_ids"])


def serve(run: VLRun, args: argparse.Namespace, log_dir: str, prompts: list[list[int]]) -> Served:
    served = Served(run.label)
    try:
        with Server(run, log_dir, start_timeout=args.start_timeout) as server:
            served.log = server.log_path
            served.text = [generate(server.url, p, args.new_tokens) for p in prompts]
            for image in sorted(glob.glob(os.path.join(IMAGES, "*.png"))):
                name = os.path.basename(image)
                served.images[name] = ask_image(server.url, image, args.image_tokens)
    except ServerError as exc:
        served.log = os.path.join(log_dir, f"server-{run.label}.log")
        with open(served.log, encoding="utf-8", errors="replace") as handle:
            raised = [line.strip() for line in handle if re.match(r"\w+(Error|Exception): ", line)]
        served.error = raised[-1] if raised else str(exc).splitlines()[0]
    return served


def as_text(ids: list[int]) -> str:
    """The byte tokenizer's ids as text (ids 0-6 are its special tokens)."""
    return bytes(i for i in ids if i > 6).decode("utf-8", errors="replace")


def check(family: str, runs: dict[str, Served]) -> list[str]:
    """The pass conditions of the module docstring, as failures."""
    plugin, stock, floats, tower = (runs[n] for n in ("plugin", "stock", "float", "float_tower"))
    failures = [f"{r.label}: did not start: {r.error}" for r in (plugin, floats, tower) if r.error]
    if failures:
        return failures
    if (plugin.accept_length or 0) < ACCEPT_BAR * (floats.accept_length or 0):
        failures.append(
            f"plugin's accept length {plugin.accept_length} < {ACCEPT_BAR} x float's "
            f"{floats.accept_length}"
        )
    for name, want in tower.images.items():
        if plugin.images.get(name) != want:
            failures.append(f"{name}: the plugin answers {as_text(plugin.images[name])!r}, the "
                            f"float tower {as_text(want)!r}")  # fmt: skip
    if len({tuple(v) for v in floats.images.values()}) < 2:
        failures.append("the float folder gives every image the same answer: no image decides")
    if not stock.error and stock.images == tower.images:
        failures.append("stock answers every image as the float tower: the export shows no bug")
    plugin_said = plugin_messages(plugin.log)
    if f"from {os.path.join(FIXTURES, 'e2e', FAMILIES[family][0])}" not in plugin_said:
        failures.append(f"the plugin's log line naming the vision tower is missing: {plugin_said}")
    return failures


def agreeing(run: Served, reference: Served) -> str:
    """How many of ``run``'s image answers are ``reference``'s, as ``N/M``."""
    same = sum(run.images.get(n) == v for n, v in reference.images.items())
    return f"{same}/{len(reference.images)}" if not run.error else "(did not start)"


def run_family(family: str, args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    export = os.path.join(FIXTURES, "e2e", FAMILIES[family][0])
    log_dir = os.path.join(args.log_dir, family)
    runs = {
        "plugin": VLRun("plugin", export, True, True, draft_quantization=None),
        "float_tower": VLRun(
            "float_tower", float_tower_folder(family, log_dir), True, True, draft_quantization=None
        ),
        "float": VLRun("float", float_folder(family, log_dir), True, True, draft_quantization=None),
        "stock": VLRun("stock", export, True, False, draft_quantization=None),
    }
    served = {}
    for label, run in runs.items():
        served[label] = serve(run, args, log_dir, prompts)
        what = served[label].error or f"accept length {served[label].accept_length:.3f}"
        print(f"{family} {label}: {what}", flush=True)
        for name, ids in served[label].images.items():
            print(f"  {name}: {as_text(ids)!r}", flush=True)
    failures = check(family, served)
    plugin, tower, stock = served["plugin"], served["float_tower"], served["stock"]
    print(
        f"e2e-vl {family} accept_length float={served['float'].accept_length} "
        f"plugin={plugin.accept_length} stock={stock.accept_length} images "
        f"plugin=float_tower {agreeing(plugin, tower)} stock=float_tower {agreeing(stock, tower)} "
        f"plugin=float {agreeing(plugin, served['float'])}",
        flush=True,
    )
    for failure in failures:
        print(f"FAILED: {failure}", flush=True)
    return {
        "family": family,
        "failures": failures,
        "runs": {
            label: {
                "command": runs[label].shell_command(0),
                "error": s.error,
                "log": s.log,
                "accept_length": s.accept_length,
                "text": [{"output_ids": g.output_ids, "meta_info": g.meta} for g in s.text],
                "images": {n: {"output_ids": v, "text": as_text(v)} for n, v in s.images.items()},
            }
            for label, s in served.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--image-tokens", type=int, default=12)
    parser.add_argument("--log-dir", default=os.path.join(REPO, ".cache", "e2e", "vl"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    os.makedirs(args.log_dir, exist_ok=True)
    prompts = heldout_prompts(args.prompts, 64)
    results = [run_family(f, args, prompts) for f in args.family or sorted(FAMILIES)]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    failed = [f for r in results for f in r["failures"]]
    print("e2e-vl " + ("FAILED" if failed else "passed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
