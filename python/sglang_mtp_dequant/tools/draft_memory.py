"""The memory a draft's own parameters take on one rank, counted on sglang's meta build.

Usage::

    built = build_meta_draft(folder, launch)          # tools/dryrun.py: sglang's class on meta
    draft_parameter_bytes(built.model)                 # 851,443,712
    bytes_by_dtype(built.model)                        # {"bfloat16": ..., "int8": ...}
    vocab_copy_bytes(built.model)                      # the draft's own embed_tokens + lm_head
    size_text(851_443_712)                             # "812.0 MiB"

Why on the meta device: sglang's own class, built for the launch, has exactly the parameters
it would allocate, with no memory taken, so a full-size draft is counted on any CPU. The
embedding and lm_head are counted apart (``vocab_copy_bytes``): stock holds them at KV sizing,
the plugin never allocates them (``serving/draft_vocab.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

#: parameter name parts the draft takes from the target (``DraftSpec.from_target``)
FROM_TARGET = ("embed_tokens", "lm_head")


def _own_parameters(
    model: torch.nn.Module, from_target: Iterable[str]
) -> list[tuple[str, torch.nn.Parameter]]:
    taken = tuple(from_target)
    return [
        (name, param)
        for name, param in model.named_parameters()
        if not any(part in taken for part in name.split("."))
    ]


def draft_parameter_bytes(model: torch.nn.Module, from_target: Iterable[str] = FROM_TARGET) -> int:
    """The bytes of ``model``'s parameters on this rank, less those taken from the target."""
    return sum(p.numel() * p.element_size() for _, p in _own_parameters(model, from_target))


def vocab_copy_bytes(model: torch.nn.Module, from_target: Iterable[str] = FROM_TARGET) -> int:
    """The bytes of the parameters the draft takes from the target on this rank: what stock
    sglang still holds when the KV pool is sized, and what the plugin never allocates."""
    taken = tuple(from_target)
    return sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if any(part in taken for part in name.split("."))
    )


def bytes_by_dtype(
    model: torch.nn.Module, from_target: Iterable[str] = FROM_TARGET
) -> dict[str, int]:
    """``draft_parameter_bytes`` split by parameter dtype (``"bfloat16"``, ``"int8"``, ...)."""
    out: dict[str, int] = {}
    for _, param in _own_parameters(model, from_target):
        key = str(param.dtype).removeprefix("torch.")
        out[key] = out.get(key, 0) + param.numel() * param.element_size()
    return out


def size_text(count: int) -> str:
    """Bytes as ``"812.0 MiB"`` / ``"1.53 GiB"`` (binary units)."""
    if count >= 1 << 30:
        return f"{count / (1 << 30):.2f} GiB"
    if count >= 1 << 20:
        return f"{count / (1 << 20):.1f} MiB"
    return f"{count / 1024:.1f} KiB"
