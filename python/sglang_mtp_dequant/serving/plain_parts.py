"""Which parameters of a built draft a quantization method owns, and which are plain.

Usage::

    owned = quant_owned(model)       # {"model.layers.0.qkv_proj.weight_packed", ...}
    linears = plain_linears(model)   # {"fc": ("fc",)}: plain linear parts, by name tokens
    feeds_plain_linear("mtp.fc.weight_packed", linears)      # True
    meant_for("fc.weight", ["mtp.fc.weight_scale"])          # ["mtp.fc.weight_scale"]

Why: a draft sglang builds with a quant config holds two kinds of parameters. Those of a
layer whose quantization method is a real one (``CompressedTensorsLinearMethod``, ...) are the
method's: packed codes, scales, shapes, in whatever dtype the kernel wants, so only whether
they were written can be judged. The rest (``fc`` / ``eh_proj``, which every MTP class builds
as a plain ``nn.Linear``, the norms, a layer the config ignores or has no scheme for) are
ordinary float weights: codes in them are the bug this package exists for. The plain linear
parts are also where a quantized export's codes land with nothing to consume them, so the
plugin decodes what streams into them (``load.LoadSetting``).
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
    """Each plain linear part of the draft -> its name tokens as a checkpoint would spell them
    (``parameter_names.tokens``): every ``torch.nn.Linear`` (sglang's own linear layers are
    not ``nn.Linear``) by its name and, in a draft built with a quant config, every checkpoint
    part of a linear layer sglang built with the unquantized method (a scheme its config has
    no linear method for: W8A16, WFP8AFP8_DYNAMIC, linear W4A8_DYNAMIC under sglang 0.5.23's
    ModelSlim) by its name with the part for the stacked name (``q_proj`` for ``qkv_proj``):
    a float weight the codes would be copied into."""
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
