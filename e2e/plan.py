"""Which servers an end-to-end run starts, and which run's tokens each must reproduce.

Usage::

    plan = one_folder_plan(model="/m/w8a8", float_folder="/m/float", form="F1", short=False)
    plan = upstream_plan(model="/m/w8a8", float_folder="/m/float", tree="/t", form="F1")
    plan = two_folder_plan(target="/m/float", draft="/m/w8a8", tp_size=1)
    for run in plan.runs: ...            # in start order
    plan.reference_of["plugin"]          # "reference": the label whose tokens it must equal

The launch forms are the package's (``sglang_mtp_dequant.tools.forms.FORMS``): the
quantization flags users type for ONE ModelSlim folder served with EAGLE and no draft path
(sglang drafts with the folder's own MTP head); everything else is the same launch. F1 flagless
and F3 build the draft unquantized, F2 and F4 quantized; the target auto-detects ModelSlim
in every form but F2, which asks for it.

The one-folder plan serves ``model`` in one form (``make e2e``: F1; ``--form`` others). Its runs:

- ``reference``: the folder without speculation (the tokens every run on it must reproduce);
- ``stock``: EAGLE in the form, the plugin off (``SGLANG_PLUGINS=none``);
- ``plugin``: the same with the plugin on;
- ``quantized_draft`` (forms whose draft is built unquantized, F1/F3): F4 with the plugin on,
  the draft built quantized (the plugin has nothing to do): without a float folder the ceiling;
- with a float folder of the same model (not in ``short``): ``float_reference`` (no
  speculation) and ``float`` (EAGLE with its own float MTP head: the ceiling), and
  ``stock_reference`` (the folder without speculation, the plugin off): stock sglang's own
  target, which ``stock`` must reproduce and whose tokens are set against the float target's
  (``target_agree``): a target layer stock sglang builds unquantized over int8 codes (the
  Qwen3.6 recipe's Gated DeltaNet projections) makes it differ from ``reference``.

``plugin`` is started first: a draft the plugin refuses stops the run at its first server.
With a float folder, ``float`` is started next and both stay up together (``plan.paired``),
so their tokens/s are measured with requests alternated between them.

The upstream plan (``--upstream-tree``) serves the same folder in step 01's form (F1, or F3)
through the feature branch's tree with the plugin off: ``reference`` and ``branch`` on the
tree, ``stock`` on the installed sglang, ``float`` / ``float_reference`` the float folder.

The two-folder plan is the earlier form (``--target`` float folder, ``--draft`` ModelSlim folder
passed as ``--speculative-draft-model-path`` with ``unquant``; the MoE family, whose target's
quantized experts need NPU-only kernels): reference, float, stock and plugin, against
``reference``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sglang_mtp_dequant.tools.forms import FORMS, MODELSLIM, Form

from .server import ServerRun

__all__ = ["FORMS", "MODELSLIM", "Form", "Plan"]
#: the forms step 01 of the feature branch may launch (the bug needs the draft built unquantized)
UPSTREAM_FORMS = ("F1", "F3")


@dataclass
class Plan:
    """The servers of one end-to-end run, in start order, and each run's reference."""

    form: str  # "one-folder", "upstream" or "two-folder"
    runs: list[ServerRun]
    reference_of: dict[str, str]
    #: labels started together and kept up together (the tokens/s pairing), first one first
    paired: tuple[str, ...] = ()
    #: the ModelSlim folder the fixed run's draft comes from (its INFO line must name it)
    draft_folder: str = ""
    notes: list[str] = field(default_factory=list)
    #: the launch form of the stock and fixed runs (None: the two-folder form)
    launch: Form | None = None

    def labels(self) -> list[str]:
        return [run.label for run in self.runs]


def form_run(
    label: str,
    model: str,
    form: Form,
    speculative: bool,
    plugin: bool,
    tp_size: int = 1,
    sglang_path: str | None = None,
    draft_npu_check: bool = False,
) -> ServerRun:
    """``model`` served in ``form`` (without speculation only the target's flag matters)."""
    return ServerRun(
        label,
        model,
        speculative=speculative,
        plugin=plugin,
        quantization=form.quantization,
        draft_quantization=form.draft,
        tp_size=tp_size,
        sglang_path=sglang_path,
        draft_npu_check=draft_npu_check,
    )


def one_folder_plan(
    model: str,
    float_folder: str | None,
    tp_size: int = 1,
    short: bool = False,
    form: str = "F1",
) -> Plan:
    """``model`` served in launch form ``form`` (see the module docstring)."""
    launch = FORMS[form]

    def on_model(label: str, speculative: bool, plugin: bool = True, how: Form = launch):
        return form_run(label, model, how, speculative, plugin, tp_size)

    runs = [on_model("plugin", True)]
    reference_of = {"plugin": "reference", "stock": "reference"}
    paired: tuple[str, ...] = ()
    if float_folder is not None and not short:
        float_run = ServerRun("float", float_folder, True, True, draft_quantization=None)
        runs.append(replace(float_run, tp_size=tp_size))
        reference_of["float"] = "float_reference"
        paired = ("plugin", "float")
    runs.append(on_model("stock", True, plugin=False))
    if launch.draft_built is None:
        runs.append(on_model("quantized_draft", True, how=FORMS["F4"]))
        reference_of["quantized_draft"] = "reference"
    runs.append(on_model("reference", False))
    if "float" in reference_of:
        runs.append(ServerRun("float_reference", float_folder, False, True, tp_size=tp_size))
        runs.append(on_model("stock_reference", False, plugin=False))
        reference_of["stock"] = "stock_reference"
    return Plan("one-folder", runs, reference_of, paired, draft_folder=model, launch=launch)


def upstream_plan(model: str, float_folder: str, tree: str, form: str = "F1") -> Plan:
    """Step 01's launch of ``model`` (``form``: F1 or F3) on the feature branch's tree
    (``tree``/python first on the path) and on stock sglang, both with the plugin off, and the
    float folder's own MTP head as the ceiling. ``stock`` and ``branch`` see the draft module's
    ``is_npu`` answer True (``draft_npu_check``), as on the NPU step 01 runs on: PR 1 decodes
    there only."""
    if form not in UPSTREAM_FORMS:
        raise ValueError(f"step 01 launches {' or '.join(UPSTREAM_FORMS)}, not {form}")
    launch, path = FORMS[form], f"{tree}/python"
    runs = [
        form_run("reference", model, launch, False, False, sglang_path=path),
        ServerRun("float", float_folder, True, False, draft_quantization=None, sglang_path=path),
        ServerRun("float_reference", float_folder, False, False, sglang_path=path),
        form_run("stock", model, launch, True, False, draft_npu_check=True),
        form_run("branch", model, launch, True, False, sglang_path=path, draft_npu_check=True),
    ]
    reference_of = {"float": "float_reference", "stock": "reference", "branch": "reference"}
    return Plan("upstream", runs, reference_of, draft_folder=model, launch=launch)


def two_folder_plan(
    target: str, draft: str, tp_size: int = 1, upstream_tree: str | None = None
) -> Plan:
    """A float target with the ModelSlim folder's MTP head passed as the draft path
    (``unquant``); with ``upstream_tree``, the branch's servers on that tree, plugin off."""
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
