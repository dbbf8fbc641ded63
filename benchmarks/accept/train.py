"""Train the tiny target and its MTP head on the CPU, budgeted by steps, and cache the result.

Why steps and not wall-clock: the machines are shared, so a time budget trains a different
model under load; a step budget gives the same model (same seeds, same batches, same thread
count) wherever it runs, and only the wall time changes. The cache key covers everything that
changes the weights (sizes, schedule, corpus digest, torch version), so a second ``make
accept`` reuses the model and a changed recipe retrains.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import support_on_path  # noqa: F401  (the repository root on sys.path, for e2e.*)
import torch
from e2e.corpus import Corpus, random_windows

from .model import TinyQwen35, TinySpec


@dataclass(frozen=True)
class TrainRecipe:
    """The optimisation schedule; part of the cache key."""

    steps: int = 400
    batch: int = 8
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.01
    mtp_weight: float = 1.0
    seed: int = 0
    threads: int = 2


@dataclass
class TrainResult:
    model: TinyQwen35
    log: dict
    cached: bool
    folder: str


def cache_key(spec: TinySpec, recipe: TrainRecipe, corpus: Corpus) -> str:
    payload = json.dumps(
        {
            "spec": spec.as_dict(),
            "recipe": asdict(recipe),
            "corpus": corpus.sha256,
            "torch": torch.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def lr_at(step: int, recipe: TrainRecipe) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_losses(model: TinyQwen35, corpus: Corpus, recipe: TrainRecipe) -> dict:
    """Target / MTP cross-entropy (bits per byte) and MTP top-1 accuracy on held-out text."""
    gen = torch.Generator().manual_seed(1234)
    window = random_windows(corpus.heldout, 32, recipe.seq_len + 1, gen)
    model.eval()
    target_loss, mtp_loss = model.losses(window)
    hidden = model.hidden_states(window[:, :-1])
    mtp_logits = model.lm_head(model.mtp(model.embed(window[:, 1:-1]), hidden[:, :-1]))
    mtp_top1 = (mtp_logits.argmax(-1) == window[:, 2:]).float().mean().item()
    model.train()
    bits = 1 / math.log(2)
    return {
        "target_bits_per_byte": round(target_loss.item() * bits, 4),
        "mtp_bits_per_byte": round(mtp_loss.item() * bits, 4),
        "mtp_top1_next_next": round(mtp_top1, 4),
    }


def train(
    spec: TinySpec,
    recipe: TrainRecipe,
    corpus: Corpus,
    cache_root: str,
    progress: Callable[[str], None] = print,
) -> TrainResult:
    """Load the cached model for this recipe, or train it (and cache it)."""
    key = cache_key(spec, recipe, corpus)
    folder = os.path.join(cache_root, f"model-{key}")
    weights_path = os.path.join(folder, "trained.pt")
    log_path = os.path.join(folder, "train_log.json")
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    model = TinyQwen35(spec)
    if os.path.isfile(weights_path) and os.path.isfile(log_path):
        model.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
        with open(log_path, encoding="utf-8") as handle:
            log = json.load(handle)
        progress(f"trained model: cached ({folder}), trained in {log['train_seconds']:.0f} s")
        return TrainResult(model.eval(), log, True, folder)

    torch.set_flush_denormal(True)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.lr,
        betas=(0.9, 0.95),
        weight_decay=recipe.weight_decay,
        fused=True,
    )
    gen = torch.Generator().manual_seed(recipe.seed)
    params = sum(p.numel() for p in model.parameters())
    progress(
        f"training {params / 1e6:.2f} M parameters for {recipe.steps} steps of "
        f"{recipe.batch}x{recipe.seq_len} bytes on {recipe.threads} threads (cache: {folder})"
    )
    curve = []
    started, cpu_started = time.perf_counter(), time.process_time()
    model.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        window = random_windows(corpus.train, recipe.batch, recipe.seq_len + 1, gen)
        target_loss, mtp_loss = model.losses(window)
        loss = target_loss + recipe.mtp_weight * mtp_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0 or step == recipe.steps - 1:
            elapsed = time.perf_counter() - started
            curve.append([step, round(target_loss.item(), 4), round(mtp_loss.item(), 4)])
            progress(
                f"  step {step:4d}/{recipe.steps}  target loss {target_loss.item():.3f}  "
                f"mtp loss {mtp_loss.item():.3f}  {elapsed:6.0f} s"
            )
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    model.eval()
    log = {
        "key": key,
        "spec": spec.as_dict(),
        "recipe": asdict(recipe),
        "corpus_sha256": corpus.sha256,
        "corpus_source": corpus.source,
        "train_bytes": int(corpus.train.numel()),
        "heldout_bytes": int(corpus.heldout.numel()),
        "parameters": params,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "curve": curve,
        "heldout": heldout_losses(model, corpus, recipe),
        "torch": torch.__version__,
    }
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), weights_path + ".tmp")
    os.replace(weights_path + ".tmp", weights_path)
    with open(log_path, "w", encoding="utf-8") as handle:
        json.dump(log, handle, indent=2)
    progress(
        f"trained in {seconds:.0f} s wall, {cpu_seconds:.0f} s CPU ({recipe.threads} threads); "
        f"held-out: {log['heldout']}"
    )
    return TrainResult(model, log, False, folder)
