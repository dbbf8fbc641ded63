"""Which servers an end-to-end run starts, and which run's tokens each must reproduce.

Usage::

    plan = one_folder_plan(model="/m/w8a8", float_folder="/m/float", tp_size=1, short=False)
    plan = two_folder_plan(target="/m/float", draft="/m/w8a8", tp_size=1, upstream_tree=None)
    for run in plan.runs: ...            # in start order
    plan.reference_of["plugin"]          # "reference": the label whose tokens it must equal

The one-folder plan is the user's launch: ONE ModelSlim folder served with
``--quantization modelslim`` (its target quantized), EAGLE with no draft path (sglang drafts
with the folder's own MTP head). Its runs:

- ``reference``: the folder without speculation (the tokens every run on it must reproduce);
- ``stock``: EAGLE, the draft built unquantized, the plugin off (``SGLANG_PLUGINS=none``);
- ``plugin``: the same with the plugin on;
- ``quantized_draft``: EAGLE with the draft built quantized
  (``--speculative-draft-model-quantization modelslim``; the plugin on, with nothing to do);
- with a float folder of the same model (not in ``short``): ``float_reference`` (no
  speculation) and ``float`` (EAGLE with its own float MTP head: the ceiling), and
  ``stock_reference`` (the folder without speculation, the plugin off): stock sglang's own
  target, which ``stock`` must reproduce and whose tokens are set against the float target's
  (``target_agree``): a target layer stock sglang builds unquantized over int8 codes (the
  Qwen3.6 recipe's Gated DeltaNet projections) makes it differ from ``reference``.

``plugin`` is started first: a draft the plugin refuses stops the run at its first server.
With a float folder, ``float`` is started next and both stay up together (``plan.paired``),
so their tokens/s are measured with requests alternated between them.

The two-folder plan is the earlier form (``--target`` float folder, ``--draft`` ModelSlim folder
passed as ``--speculative-draft-model-path``; the MoE family, ``--upstream-tree``): reference,
float, stock, and plugin (or the feature branch's ``branch``), all against ``reference``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .server import ServerRun

MODELSLIM = "modelslim"


@dataclass
class Plan:
    """The servers of one end-to-end run, in start order, and each run's reference."""

    form: str  # "one-folder" or "two-folder"
    runs: list[ServerRun]
    reference_of: dict[str, str]
    #: labels started together and kept up together (the tokens/s pairing), first one first
    paired: tuple[str, ...] = ()
    #: the ModelSlim folder the fixed run's draft comes from (its INFO line must name it)
    draft_folder: str = ""
    notes: list[str] = field(default_factory=list)

    def labels(self) -> list[str]:
        return [run.label for run in self.runs]


def one_folder_plan(
    model: str, float_folder: str | None, tp_size: int = 1, short: bool = False
) -> Plan:
    """The user's launch of ``model`` (see the module docstring)."""

    def on_model(label: str, speculative: bool, plugin: bool = True, draft_q: str = "unquant"):
        return ServerRun(
            label,
            model,
            speculative=speculative,
            plugin=plugin,
            quantization=MODELSLIM,
            draft_quantization=draft_q,
            tp_size=tp_size,
        )

    runs = [on_model("plugin", True)]
    reference_of = {"plugin": "reference", "stock": "reference", "quantized_draft": "reference"}
    paired: tuple[str, ...] = ()
    if float_folder is not None and not short:
        runs.append(ServerRun("float", float_folder, True, True, tp_size=tp_size))
        reference_of["float"] = "float_reference"
        paired = ("plugin", "float")
    runs += [
        on_model("stock", True, plugin=False),
        on_model("quantized_draft", True, draft_q=MODELSLIM),
        on_model("reference", False),
    ]
    if "float" in reference_of:
        runs.append(ServerRun("float_reference", float_folder, False, True, tp_size=tp_size))
        runs.append(on_model("stock_reference", False, plugin=False))
        reference_of["stock"] = "stock_reference"
    return Plan("one-folder", runs, reference_of, paired, draft_folder=model)


def two_folder_plan(
    target: str, draft: str, tp_size: int = 1, upstream_tree: str | None = None
) -> Plan:
    """A float target with the ModelSlim folder's MTP head passed as the draft path."""
    tree = None if upstream_tree is None else f"{upstream_tree}/python"
    plugin = tree is None  # the feature branch's servers run with the plugin off

    def run(label: str, speculative: bool, draft_path: str | None, on_tree: bool, on: bool):
        return ServerRun(
            label,
            target,
            speculative=speculative,
            plugin=on,
            draft=draft_path,
            tp_size=tp_size,
            sglang_path=tree if on_tree else None,
        )

    fixed = "plugin" if plugin else "branch"
    runs = [
        run("reference", False, None, True, plugin),
        run("float", True, target, True, plugin),
        run("stock", True, draft, False, False),
        run(fixed, True, draft, True, plugin),
    ]
    reference_of = {label: "reference" for label in ("float", "stock", fixed)}
    return Plan("two-folder", runs, reference_of, draft_folder=draft)
