"""``verify``'s rows for the target layers sglang builds unquantized over codes (vision tower).

Usage::

    target_rows(report, check, source)   # check: target_check's TargetCheck of the launch

Per layer the plugin decodes as it streams, what sglang's ``load_weights`` put in its weight
stock and with the plugin, against the independent decode; only those layers are allocated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ...formats.checkpoint import Checkpoint, WeightSource
from ...formats.plan import DequantPlan
from ...serving.target_stream import decode_as_streamed
from .independent import reference_stream
from .report import ParamRow, VerifyReport

if TYPE_CHECKING:
    from ..target_check import TargetCheck


def target_rows(report: VerifyReport, check: TargetCheck, source: WeightSource) -> None:
    """One row per decoded target layer's weight added to ``report``."""
    if not check.decoded or check.built is None:
        return
    model, model_config = check.built
    for layer in check.decoded:
        module = model.get_submodule(layer.module)
        for name, param in list(module.named_parameters(recurse=False)):
            real = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype), False)
            real.__dict__.update(param.__dict__)  # sglang's weight_loader and its attributes
            setattr(module, name, real)
    shards = {s.name for layer in check.decoded for s in layer.shards}
    ckpt = Checkpoint.open(source, wanted=lambda n: n.rpartition(".")[0] in shards)
    tensors = ckpt.read_many(ckpt.tensors.values())
    stream = sorted(tensors.items())

    def load(weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        for layer in check.decoded:
            model.get_submodule(layer.module).weight.data.fill_(float("nan"))
        model.load_weights(weights)
        return {
            u.module: model.get_submodule(u.module).weight.detach().clone() for u in check.decoded
        }

    stock = load(stream)
    dtype = next(iter(stock.values())).dtype
    plan = DequantPlan.build(ckpt)  # the plan the plugin's decode builds for these shards
    unverifiable: set[str] = set()
    reference = load(reference_stream(stream, plan, tensors, dtype, unverifiable))
    decode_as_streamed(model, check.decoded, model_config, None)
    try:
        plugin = load(stream)
    except Exception as exc:  # noqa: BLE001 - a load that stops is a finding, reported
        report.problems.append(f"the plugin's load of the target layers stopped: {exc}")
        return
    finally:
        del model.load_weights  # the instance's decoding wrapper: sglang's own method again
    for layer in check.decoded:
        got, want = plugin[layer.module], reference[layer.module]
        row = ParamRow(
            f"target {layer.module}.weight",
            [f"{s.name}.weight" for s in layer.shards],
            quantized=True,
            stock_absmax=float(stock[layer.module].float().abs().max()),
            plugin_absmax=float(got.float().abs().max()),
        )
        blocked = sorted(set(row.sources) & unverifiable)
        if blocked:
            row.why = f"no independent rule for {blocked[0]}"
        else:
            row.compare(got, want)
        report.rows.append(row)
