"""Which parameters of a built draft a quantization method owns, and which are plain.

Usage::

    owned = quant_owned(model)       # {"model.layers.0.qkv_proj.weight_packed", ...}
    linears = plain_linears(model)   # {"fc": ("fc",)}: plain linear parts, by name tokens
    feeds_plain_linear("mtp.fc.weight_packed", linears)      # True
    meant_for("fc.weight", ["mtp.fc.weight_scale"])          # ["mtp.fc.weight_scale"]

Why: in a draft built with a quant config, a real quantization method's parameters hold
whatever the kernel wants, so only whether they were written can be judged; the rest (``fc`` /
``eh_proj``, the norms, a layer with no scheme) are float weights, where codes are the bug this
package exists for, so the plugin decodes what streams into them (``load.LoadSetting``).
"""

from __future__ import annotations

import torch

from .parameter_names import DEFAULT_PACKED, tokens


def quant_owned(model: torch.nn.Module) -> set[str]:
    """Parameter names of the layers a (non-trivial) quantization method builds."""
    owned = set()
    for module_name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__.startswith("Unquantized"):
            continue
        for param_name, _ in module.named_parameters(recurse=False):
            owned.add(f"{module_name}.{param_name}" if module_name else param_name)
    return owned


def plain_linears(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """Each plain linear part of the draft -> its name tokens as a checkpoint spells them: every
    ``torch.nn.Linear`` and, in a draft built with a quant config, every checkpoint part of a
    layer sglang built with the unquantized method (``q_proj`` for ``qkv_proj``)."""
    found = {
        name: tokens(name)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    if getattr(model, "quant_config", None) is None:
        return found
    from sglang.srt.layers.linear import LinearBase

    declared = getattr(model, "packed_modules_mapping", None) or {}
    packed = {**DEFAULT_PACKED, **{k: v for k, v in declared.items() if isinstance(v, list)}}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, LinearBase) and type(method).__name__.startswith("Unquantized"):
            head, _, proj = name.rpartition(".")
            found.update({f"{head}.{p}": tokens(f"{head}.{p}") for p in packed.get(proj, [proj])})
    return found


def feeds_plain_linear(name: str, linears: dict[str, tuple[str, ...]]) -> bool:
    """Whether checkpoint tensor ``name`` (``X.<part>``) belongs to one of ``linears``: ``X``
    spelled with the same tokens, after the ``layers.<n>`` a NextN checkpoint puts its draft
    layer under (``model.layers.61.eh_proj`` is the draft's ``model.eh_proj``)."""
    candidates = _module_spellings(name)
    return any(t in candidates for t in linears.values())


def meant_for(parameter: str, skipped: list[str]) -> list[str]:
    """The checkpoint names among ``skipped`` (streamed, placed by no loader) that belong to
    ``parameter``'s layer: for a parameter never written, what should have fed it, e.g. the
    ``mtp.fc.weight_scale`` of a checkpoint whose ``mtp.fc.weight_packed`` is missing."""
    layer = tokens(parameter.rpartition(".")[0])
    return [n for n in skipped if layer and layer in _module_spellings(n)]


def _module_spellings(name: str) -> set[tuple[str, ...]]:
    """The layer of checkpoint tensor ``name`` by its name tokens, with and without the
    ``layers.<n>`` a NextN checkpoint puts its draft layer under."""
    base = tokens(name.rpartition(".")[0])
    if not base:
        return set()
    candidates = {base}
    if len(base) > 2 and base[0] == "layers" and base[1].isdigit():
        candidates.add(base[2:])
    return candidates
