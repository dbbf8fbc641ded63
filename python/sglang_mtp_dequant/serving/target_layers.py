"""Linear layers sglang builds unquantized over ModelSlim codes: supplied, decoded, or refused.

Usage (``plugin.register`` arranges it in every sglang process)::

    TARGET_HOOKS             # two AROUND hooks on sglang's model loader, beside the plugin's own
    supplied = supply_packed_names(quant_config)   # {"in_proj_qkvz": ["in_proj_qkv", ...]}
    unserved = unserved_layers(model, quant_config)  # [UnservedLayer(layer, shards, ...)]

Why: a layer sglang builds with the unquantized method loads its shards' codes as weights
(fused layers the NPU nested mapping lacks, like Gated DeltaNet's ``in_proj_qkvz``; W8A16 and
WFP8AFP8; the vision tower sglang 0.5.23 builds with ``quant_config=None``). Missing packed
names are supplied; layers still unquantized over codes are decoded as they stream or refused
before any weight is read (docs/layouts.md, "Target layers").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UnservedLayerError
from ..formats.description import (
    WEIGHT,
    ShardScheme,
    is_quantized,
    quantized_leaves,
    shard_schemes,
)
from ..formats.schemes import known_types, scheme_for
from . import context, sglang_private
from .drafts import spec_for_class
from .parameter_names import DEFAULT_PACKED
from .target_stream import decode_as_streamed

logger = logging.getLogger("sglang_mtp_dequant")

#: the quantization method whose config reads a nested packed-module mapping
MODELSLIM = "modelslim"
#: the nested mapping's key for language-model layers (``ModelSlimConfig.get_quant_method``)
LANGUAGE_KEY = "model"
#: how many layers an error or a report names before counting the rest
SHOWN = 6


def is_modelslim(quant_config: Any) -> bool:
    get_name = getattr(quant_config, "get_name", None)
    return callable(get_name) and get_name() == MODELSLIM


def nested_key(prefix: str) -> str:
    """The nested mapping ``ModelSlimConfig.get_quant_method`` consults for ``prefix``."""
    if "vision_model" in prefix:
        return "vision_model"
    if "visual" in prefix:
        return "visual"
    return LANGUAGE_KEY


def flat_entries(mapping: Mapping[str, Any]) -> dict[str, list[str]]:
    """The model class's own packed names (the nested per-prefix mappings left out)."""
    return {name: list(shards) for name, shards in mapping.items() if isinstance(shards, list)}


def missing_packed_names(quant_config: Any) -> dict[str, list[str]]:
    """The class's packed names the nested mapping lacks; empty off NPU (no nested mapping)."""
    if not is_modelslim(quant_config):
        return {}
    mapping = quant_config.packed_modules_mapping or {}
    nested = mapping.get(LANGUAGE_KEY)
    if not isinstance(nested, dict):
        return {}
    missing = {n: s for n, s in flat_entries(mapping).items() if n not in nested}
    if not missing:
        return {}
    leaves = {shard for shards in missing.values() for shard in shards}
    quantized = quantized_leaves(quant_config.quant_description, leaves)
    return {
        name: shards
        for name, shards in missing.items()
        if quantized.intersection(shards) and not resolved_by_sglang(quant_config, name, shards)
    }


def fused_prefix(description: Mapping[str, Any], name: str, shards: Sequence[str]) -> str | None:
    """The first quantized entry of one of ``shards``, renamed to fused layer ``name``."""
    suffixes = tuple(f".{shard}{WEIGHT}" for shard in shards)
    for key in description:
        if key.endswith(suffixes) and is_quantized(description[key]):
            return f"{key[: -len(WEIGHT)].rpartition('.')[0]}.{name}"
    return None


def _dropped(record: logging.LogRecord) -> bool:
    return False


def resolved_by_sglang(quant_config: Any, name: str, shards: Sequence[str]) -> bool:
    """Whether sglang's own config builds fused layer ``name`` with a ModelSlim scheme, asked
    as sglang asks (``get_quant_method`` on a bare ``LinearBase``).

    Why by behaviour: a later sglang whose ``ModelSlimConfig`` falls back to the class's own
    packed entries answers with a scheme and the plugin steps aside. A lookup exception counts
    as "not resolved" (sglang raises it again at the real build); what the config logs while
    asked is dropped, since the probe is not a layer sglang builds."""
    prefix = fused_prefix(quant_config.quant_description, name, shards)
    if prefix is None:
        return False
    import torch
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    probe = LinearBase.__new__(LinearBase)
    torch.nn.Module.__init__(probe)
    config_logger = logging.getLogger(type(quant_config).__module__)
    config_logger.addFilter(_dropped)
    try:
        method = quant_config.get_quant_method(probe, prefix)
    except Exception:  # noqa: BLE001 - any failure of sglang's lookup: it does not resolve it
        return False
    finally:
        config_logger.removeFilter(_dropped)
    quantized = method is not None and not isinstance(method, UnquantizedLinearMethod)
    return quantized and getattr(probe, "scheme", None) is not None


def supply_packed_names(quant_config: Any) -> dict[str, list[str]]:
    """Add ``missing_packed_names`` to the config's nested ``model`` mapping; return them.

    In place: the class hands that same dict to the config again when it is built
    (``Qwen3_5ForCausalLM.__init__``), so a copy would be dropped.
    """
    supplied = missing_packed_names(quant_config)
    if supplied:
        quant_config.packed_modules_mapping[LANGUAGE_KEY].update(supplied)
    return supplied


@dataclass(frozen=True)
class UnservedLayer:
    """A linear layer sglang built with the unquantized method over quantized shards."""

    layer: str  # the prefix sglang built it with
    shards: tuple[ShardScheme, ...]
    #: the table that named the shards (``shards_of``)
    found_by: str
    module: str = ""  # its path in the model (``visual.blocks.0.attn.qkv_proj``)

    @property
    def quantized(self) -> tuple[ShardScheme, ...]:
        return tuple(s for s in self.shards if s.quantized)

    @property
    def decodable(self) -> bool:
        """Every quantized shard is of a scheme the plugin decodes (``formats/schemes``)."""
        return all(scheme_for(s.scheme or "") is not None for s in self.quantized)

    @property
    def vision(self) -> bool:
        return "visual" in self.layer

    def line(self) -> str:
        return f"{self.layer}: {', '.join(str(s) for s in self.shards)}"


#: the checkpoint names sglang's vision-tower loaders read a fused layer from
VISION_PACKED = {"qkv_proj": ["qkv"]}


def shards_of(
    prefix: str, mapping: Mapping[str, Any], described: Callable[[str], bool]
) -> tuple[list[str], str]:
    """The checkpoint prefixes of layer ``prefix`` and which table named them ("nested",
    "class", "stacked", "vision" or "none"): the first whose names the description lists,
    else the first."""
    proj = prefix.rpartition(".")[2]
    nested = mapping.get(nested_key(prefix))
    tables = (
        ("nested", nested if isinstance(nested, dict) else {}),
        ("class", flat_entries(mapping)),
        ("stacked", DEFAULT_PACKED),
        ("vision", VISION_PACKED if "visual" in prefix else {}),
    )
    candidates = [
        ([prefix.replace(proj, s) for s in t[proj]], how) for how, t in tables if proj in t
    ]
    candidates.append(([prefix], "none"))
    return next((c for c in candidates if any(map(described, c[0]))), candidates[0])


@contextlib.contextmanager
def recorded_prefixes(active: bool = True) -> Iterator[dict[int, str]]:
    """While sglang builds a model (if ``active``): ``id(layer) -> prefix`` of every linear
    layer. The description is keyed by that prefix, which need not be the module's path (an MTP
    draft's ``mtp.layers.0...`` under ``model.layers.0...``), and no config is asked about
    a tower built with ``quant_config=None``."""
    import inspect

    from sglang.srt.layers.linear import LinearBase

    prefixes: dict[int, str] = {}
    if not active:
        yield prefixes
        return
    built = LinearBase.__init__
    signature = inspect.signature(built)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs).arguments
        prefixes[id(self)] = str(bound.get("prefix", ""))
        built(self, *args, **kwargs)

    LinearBase.__init__ = __init__
    try:
        yield prefixes
    finally:
        LinearBase.__init__ = built


def unserved_layers(
    model: Any, quant_config: Any, prefixes: Mapping[int, str] | None = None
) -> list[UnservedLayer]:
    """Every linear layer of ``model`` with the unquantized method over a quantized shard,
    named by its build prefix (``recorded_prefixes``), else ``prefix``, else its path."""
    if not is_modelslim(quant_config):
        return []
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    description = quant_config.quant_description
    mapping = quant_config.packed_modules_mapping or {}

    def resolved(name: str) -> str:
        return str(sglang_private.resolve_quant_prefix(quant_config, name))

    found = []
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        if not isinstance(module.quant_method, UnquantizedLinearMethod):
            continue
        prefix = (prefixes or {}).get(id(module)) or getattr(module, "prefix", None) or name
        names, found_by = shards_of(
            prefix, mapping, lambda n: f"{resolved(n)}.weight" in description
        )
        shards = shard_schemes(description, [resolved(n) for n in names])
        if any(s.quantized for s in shards):
            found.append(UnservedLayer(prefix, tuple(shards), found_by, name))
    return found


def on_npu(quant_config: Any) -> bool:
    """Whether the config has its NPU nested mapping: only there do ModelSlim methods run."""
    return isinstance((quant_config.packed_modules_mapping or {}).get(LANGUAGE_KEY), dict)


def refused_layers(layers: Sequence[UnservedLayer], quant_config: Any) -> list[UnservedLayer]:
    """The layers the plugin cannot serve: off NPU all, else those it does not decode."""
    return list(layers) if not on_npu(quant_config) else [u for u in layers if not u.decodable]


def remedy(layers: Sequence[UnservedLayer], quant_config: Any) -> str:
    """What the operator can do about ``layers`` (the platform and the schemes decide)."""
    if not on_npu(quant_config):
        return (
            "sglang gives ModelSlim its packed-module mapping, and runs ModelSlim's quantized "
            "linear methods, only on Ascend NPU (model_loader/loader.py): serve this checkpoint "
            "on an NPU"
        )
    schemes = ", ".join(sorted({s.scheme or "?" for layer in layers for s in layer.quantized}))
    decoded = f"the plugin decodes {', '.join(known_types())}, not {schemes}"
    if all(layer.vision for layer in layers):
        return (
            f"sglang {context.sglang_version()} builds the vision tower unquantized "
            f"(quant_config=None) and {decoded}: re-export with msmodelslim with "
            "'*visual.blocks*' removed from the recipe's include list (the vision tower FLOAT), "
            "or serve with an sglang that builds the tower with its quant config (sglang PR "
            "#36426)"
        )
    return (
        f"sglang {context.sglang_version()}'s ModelSlim builds no quantized linear method for "
        f"these layers and {decoded}; re-export the checkpoint with msmodelslim keeping these "
        "projections FLOAT (exclude them in the recipe) or quantized with a scheme sglang's "
        "ModelSlim serves for linear layers (W8A8_DYNAMIC, W8A8)"
    )


def refusal(layers: Sequence[UnservedLayer], quant_config: Any, role: str) -> UnservedLayerError:
    shown = [layer.line() for layer in layers[:SHOWN]]
    if len(layers) > SHOWN:
        shown.append(f"... and {len(layers) - SHOWN} more")
    return UnservedLayerError(
        role=role,
        problem=(
            f"sglang built {len(layers)} linear layer(s) with the unquantized method while "
            "quant_model_description.json marks their shards quantized: their int8 codes "
            "would load as weights and every output would be wrong"
        ),
        hint=remedy(layers, quant_config),
        details=shown,
    )


# -- the hooks ----------------------------------------------------------------------------------


#: (checkpoint path, names supplied) already said in this process
_SAID: set[tuple[str | None, tuple[str, ...]]] = set()


def supplied_quantization_config(
    original: Callable[..., Any], model_config: Any, load_config: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``_get_quantization_config``: sglang's config, with ``supply_packed_names``."""
    quant_config = original(model_config, load_config, *args, **kwargs)
    supplied = supply_packed_names(quant_config)
    said = (getattr(model_config, "model_path", None), tuple(supplied))
    if supplied and said not in _SAID:  # the draft's config of the same folder: said once
        _SAID.add(said)
        logger.info(
            "sglang-mtp-dequant: sglang's ModelSlim packed-module mapping for %r layers lacks "
            "%s, whose shards %s quantizes; supplied from %s.packed_modules_mapping so those "
            "layers get their ModelSlim scheme",
            LANGUAGE_KEY,
            ", ".join(f"{name} = {' + '.join(shards)}" for name, shards in supplied.items()),
            getattr(model_config, "model_path", "the checkpoint"),
            _architecture(model_config),
        )
    return quant_config


def checked_model(
    original: Callable[..., Any], model_config: Any, load_config: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``_initialize_model``: layers built unquantized over codes decoded as they
    stream (a hooked draft's own load decodes its own), or ``UnservedLayerError`` before any
    weight is read."""
    quant_config = kwargs.get("quant_config", args[0] if args else None)
    with recorded_prefixes(is_modelslim(quant_config)) as prefixes:
        model = original(model_config, load_config, *args, **kwargs)
    unserved = unserved_layers(model, quant_config, prefixes)
    if not unserved:
        return model
    role = "draft" if getattr(model_config, "is_draft_model", False) else "target"
    refused = refused_layers(unserved, quant_config)
    if refused:
        raise refusal(refused, quant_config, f"{role} {_architecture(model_config)}")
    spec = spec_for_class(type(model))
    if spec is None or spec.target not in context.registered_targets():
        decode_as_streamed(model, unserved, model_config, load_config)
    return model


def _architecture(model_config: Any) -> str:
    architectures = getattr(getattr(model_config, "hf_config", None), "architectures", None)
    return str(architectures[0]) if architectures else "model"


#: (target, AROUND hook): registered by ``plugin.register`` beside its own hooks
TARGET_HOOKS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (sglang_private.QUANTIZATION_CONFIG_TARGET, supplied_quantization_config),
    (sglang_private.INITIALIZE_MODEL_TARGET, checked_model),
)
