"""The ledger of sglang's private surface: every private sglang name this package touches.

Usage::

    from .sglang_private import LEDGER, prepare_weights, patched_targets
    folder, files, use_safetensors = prepare_weights(loader, path, revision)
    for entry in LEDGER: print(entry.name, entry.checked_in, entry.remove_when)

Why one module: sglang has no stable API for "which files does the loader stream", "which
experts does this rank keep" or "is this hook applied", so the package reaches into names
sglang may rename in any release. Each is written here and nowhere else
(``test/test_packaging.py`` checks it), so an sglang upgrade is a review of this file and of
``sglang_public.py``. Accessors adapt by feature where releases differ.

Accessors import sglang lazily: importing this module imports nothing of sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import releases


@dataclass(frozen=True)
class Private:
    """One private sglang name: what it is, why and how it is used, and when it can go.

    ``spelled`` tokens may appear only here (in ``accessors``) and in ``also_spelled_in``.
    """

    name: str
    why: str
    how: str
    remove_when: str
    spelled: tuple[str, ...] = ()
    accessors: tuple[str, ...] = ()
    also_spelled_in: tuple[str, ...] = ()
    #: the sglang releases the matrix (``make compat``) checked it in
    checked_in: tuple[str, ...] = releases.TESTED
    #: a dotted path the release test resolves in the installed sglang
    where: str | None = None


_LOADER = "sglang.srt.model_loader.loader"
_NEXTN = "sglang.srt.models.deepseek_nextn"

#: ``DefaultModelLoader._prepare_weights``, observed with an AROUND hook (``load.py``)
PREPARE_WEIGHTS_TARGET = f"{_LOADER}.DefaultModelLoader._prepare_weights"
#: ``maybe_add_mtp_safetensors`` (module-level but undocumented), observed the same way
MTP_FILE_TARGET = f"{_LOADER}.maybe_add_mtp_safetensors"
#: ``_get_quantization_config`` and ``_initialize_model``, AROUND hooks (``target_layers.py``)
QUANTIZATION_CONFIG_TARGET = f"{_LOADER}._get_quantization_config"
INITIALIZE_MODEL_TARGET = f"{_LOADER}._initialize_model"
#: ``UnquantizedEmbeddingMethod.create_weights``, an AROUND hook (``draft_vocab.py``)
VOCAB_WEIGHTS_TARGET = (
    "sglang.srt.layers.quantization.unquant.UnquantizedEmbeddingMethod.create_weights"
)
#: ``RayEngine._launch_scheduler_processes``, a BEFORE hook (``ray_setup.py``)
RAY_LAUNCH_TARGET = "sglang.srt.ray.engine.RayEngine._launch_scheduler_processes"
#: ``FusedMoE._map_global_expert_id_to_local_expert_id``: global expert id -> local or -1
EXPERT_MAP_METHOD = "_map_global_expert_id_to_local_expert_id"
#: a parameter attribute FusedMoE sets when a parameter holds every expert on every rank
GLOBAL_EXPERTS_ATTRIBUTE = "_sglang_require_global_experts"
#: where BasevLLMParameter keeps the loader its ``weight_loader`` property returns
V2_LOADER_ATTRIBUTE = "_weight_loader"

#: ``ModelSlimConfig._resolve_quant_prefix`` (from 0.5.18): a layer's description prefix
_RESOLVE_QUANT_PREFIX = (
    "sglang.srt.layers.quantization.modelslim.modelslim.ModelSlimConfig._resolve_quant_prefix"
)

LEDGER: tuple[Private, ...] = (
    Private(
        name=PREPARE_WEIGHTS_TARGET,
        where=PREPARE_WEIGHTS_TARGET,
        why="the folder and exact file list sglang streams (folder, HF snapshot of symlinks, "
        "hub id in a cache or --download-dir, ModelScope, index filtering) are only known "
        "inside it",
        how="AROUND hook that records the result, and inside a hooked draft load narrows the "
        "file list to the files holding the draft's tensors (narrowing.py); the CLI calls it "
        "offline. Not allow_patterns_overrides: only its first matching pattern is globbed",
        remove_when="sglang reports resolved weight files to plugins (e.g. a loader event) and "
        "lets a draft class name the weight files it needs",
        spelled=("_prepare_weights",),
        accessors=("PREPARE_WEIGHTS_TARGET", "prepare_weights"),
    ),
    Private(
        name=MTP_FILE_TARGET,
        where=MTP_FILE_TARGET,
        why="GLM NextN checkpoints whose index omits mtp.safetensors get it added here",
        how="AROUND hook recording the returned file list; called by the CLI after "
        "_prepare_weights",
        remove_when="as _prepare_weights",
        spelled=("maybe_add_mtp_safetensors",),
        accessors=("MTP_FILE_TARGET", "mtp_file_added"),
    ),
    Private(
        name=f"{_LOADER}.DefaultModelLoader._maybe_download_from_modelscope",
        where=f"{_LOADER}.DefaultModelLoader._maybe_download_from_modelscope",
        why="the CLI must resolve a ModelScope id the way the server does (SGLANG_USE_MODELSCOPE)",
        how="called by the CLI only, before publishing sglang's context for the local folder",
        remove_when="sglang exposes its path resolution as one public function",
        spelled=("_maybe_download_from_modelscope",),
        accessors=("modelscope_local_copy",),
    ),
    Private(
        name=f"{_LOADER}.DefaultModelLoader._get_all_weights",
        where=f"{_LOADER}.DefaultModelLoader._get_all_weights",
        why="verify and the tests feed load_weights exactly the stream the server builds",
        how="called on a fresh DefaultModelLoader by the CPU tools (tools/cpu_sglang.py)",
        remove_when="DefaultModelLoader offers a public weight iterator",
        spelled=("_get_all_weights",),
        accessors=("all_weights",),
    ),
    Private(
        name=f"{_LOADER}.DefaultModelLoader._get_weights_iterator",
        where=f"{_LOADER}.DefaultModelLoader._get_weights_iterator",
        why="the stream for a path with no ModelConfig (a draft class built from a hand-made "
        "config in tests)",
        how="called by the CPU tools with DefaultModelLoader.Source(path, revision)",
        remove_when="as _get_all_weights",
        spelled=("_get_weights_iterator",),
        accessors=("weights_iterator",),
    ),
    Private(
        name=INITIALIZE_MODEL_TARGET,
        where=INITIALIZE_MODEL_TARGET,
        why="the CPU tools build the draft class exactly as the loader does; right after it, "
        "before any weight is read, layers built unquantized over codes can be found",
        how="called by the CPU tools; an AROUND hook (target_layers.py) checks its model",
        remove_when="a public 'build model without weights' in sglang",
        spelled=("_initialize_model",),
        accessors=("INITIALIZE_MODEL_TARGET", "initialize_model"),
    ),
    Private(
        name=QUANTIZATION_CONFIG_TARGET,
        where=QUANTIZATION_CONFIG_TARGET,
        why="the draft's quant config decides whether the plugin acts; on NPU it writes the "
        "nested packed-module mapping, which lacks some fused layers (Qwen3.5's in_proj_qkvz)",
        how="called by the CPU tools; an AROUND hook (target_layers.py) adds the missing "
        "packed names whose shards the description quantizes",
        remove_when="as _initialize_model",
        spelled=("_get_quantization_config",),
        accessors=("QUANTIZATION_CONFIG_TARGET", "quantization_config"),
        also_spelled_in=(
            # the e2e shim wraps it before the plugin loads; its checks and test read it
            "e2e/site/e2e_shim_modelslim.py",
            "e2e/checks.py",
            "test/e2e/test_e2e_shims.py",
        ),
    ),
    Private(
        name="sglang.srt.plugins.hook_registry.HookRegistry._patched",
        where="sglang.srt.plugins.hook_registry.HookRegistry._patched",
        why="whether a registered hook was really applied in this process (Ray workers, "
        "a failed apply)",
        how="read only, by tests; the plugin asks the installed wrappers (hooks_around), "
        "since HookRegistry.reset() clears this set",
        remove_when="HookRegistry offers an is_applied(target) query",
        spelled=("_patched",),
        accessors=("patched_targets",),
        also_spelled_in=(
            # the HookRegistry.reset() test puts the registry's record back afterwards
            "test/integration/test_plugin_activation.py",
        ),
    ),
    Private(
        name="HookRegistry's wrapper (_wrap_fn): its hook in the closure variable 'hook' "
        "(co_freevars), what it wraps in __wrapped__",
        where="sglang.srt.plugins.hook_registry._wrap_fn",
        why="whether this package's hook is really on a draft class in this process "
        "(_patched is cleared by reset(), and misses a removed wrapper)",
        how="read only: hooks_around(method) walks the installed wrappers (ray_setup)",
        remove_when="HookRegistry offers an is_applied(target) query on installed objects",
        spelled=("co_freevars",),
        accessors=("hooks_around",),
    ),
    Private(
        name="functools.wraps' __wrapped__ on HookRegistry's wrapper",
        why="the CLI loads a draft 'as stock sglang would', i.e. through the unhooked method",
        how="unwrapped(method) is the original of a hooked method, for tests and benchmarks; "
        "the CLI switches the hook off instead (a subclass's super() reaches the hooked parent)",
        remove_when="HookRegistry keeps a public map target -> original",
        spelled=("__wrapped__",),
        accessors=("unwrapped",),
        also_spelled_in=(
            # the e2e shim's test tells the shim's wrapper from the function it wraps
            "test/e2e/test_e2e_shims.py",
        ),
    ),
    Private(
        name=VOCAB_WEIGHTS_TARGET,
        where=VOCAB_WEIGHTS_TARGET,
        why="where the draft's own embed_tokens / lm_head allocate, which EAGLE swaps for the "
        "target's only after the KV pool is sized",
        how="AROUND hook: under torch.device('meta') while a hooked draft is built (draft_vocab)",
        remove_when="sglang's MTP/NextN drafts bind the target's vocab layers at construction "
        "(sglang #38147's way), or share them before the KV pool is sized",
        spelled=("UnquantizedEmbeddingMethod",),
        accessors=("VOCAB_WEIGHTS_TARGET",),
    ),
    Private(
        name=RAY_LAUNCH_TARGET,
        where=RAY_LAUNCH_TARGET,
        why="sglang's Ray actors never call load_plugins(); the launch is the last moment "
        "the driver can make Ray run the plugin's setup hook in every worker",
        how="BEFORE hook: initialises Ray with the setup hook, or asks an initialised job's "
        "workers whether the hook is applied",
        remove_when="sglang's SchedulerActor calls load_plugins()",
        spelled=("_launch_scheduler_processes",),
        accessors=("RAY_LAUNCH_TARGET",),
        also_spelled_in=(
            # these tests launch sglang's schedulers as its engines do
            "test/integration/test_processes.py",
            "test/integration/test_ray.py",
        ),
    ),
    Private(
        name=f"FusedMoE.{EXPERT_MAP_METHOD}",
        where=f"sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.{EXPERT_MAP_METHOD}",
        why="under expert parallelism each rank decodes only the experts its FusedMoE keeps",
        how="called per expert id on the built draft's FusedMoE layers (ownership.py)",
        remove_when="FusedMoE exposes the local expert set publicly",
        spelled=(EXPERT_MAP_METHOD,),
        accessors=("expert_map",),
    ),
    Private(
        name=f"parameter attribute {GLOBAL_EXPERTS_ATTRIBUTE}",
        why="a parameter that holds every expert on every rank: every expert must be decoded",
        how="read with getattr on FusedMoE's own parameters",
        remove_when="as the expert map",
        spelled=(GLOBAL_EXPERTS_ATTRIBUTE,),
        accessors=("holds_global_experts", "GLOBAL_EXPERTS_ATTRIBUTE"),
    ),
    Private(
        name="sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments (through "
        "0.5.18 ServerArgs._handle_model_specific_adjustments)",
        why="its DSA branch (DeepSeek-V3.2, GLM-5) calls torch.cuda.get_device_capability() "
        "off NPU/XPU, which raises on a CPU box",
        how="not called: the CPU tools answer (0, 0) while they publish "
        "(tools/cpu_env.cuda_capability_answered)",
        remove_when="sglang's DSA adjustment checks torch.cuda.is_available() first",
    ),
    Private(
        name="sglang.srt.layers.rotary_embedding.factory.get_rope_cpu",
        where="sglang.srt.layers.rotary_embedding.factory.get_rope_cpu",
        why="sglang's CPU rope asserts deepseek_yarn scaling, which GLM-5's DSA indexer lacks",
        how="swapped while the CPU tools build a draft (tools/cpu_env.generic_rope_on_cpu)",
        remove_when="sglang's CPU rope supports every rope type",
        spelled=("get_rope_cpu",),
        accessors=("cpu_rope_builder", "set_cpu_rope_builder", "generic_rope_builder"),
    ),
    Private(
        name="is_npu as the draft modules see it (qwen3_5_mtp, qwen3_next_mtp, glm4_moe_nextn, "
        "glm4_moe_lite_nextn)",
        why="each of these draft classes builds itself unquantized on NPU when the draft "
        "quantization is unset; the doctor must get the answer the Ascend server gets",
        how="answers True while the doctor builds the draft (tools/cpu_env."
        "npu_quantization_rule); read by serving/upstream_fix.py too (upstream/ PR 1)",
        remove_when="sglang exposes the draft's quantization decision as a function",
        spelled=("is_npu",),
        accessors=("NPU_RULE_MODULES", "draft_module_is_npu", "set_draft_module_is_npu"),
        also_spelled_in=(
            # the upstream e2e run's shim sets it in sglang's servers; its checks read the log
            "e2e/site/e2e_shim_npu_check.py",
            "e2e/checks.py",
            # the branch's clause is checked in the patched tree's source text
            "test/test_upstream_series.py",
        ),
    ),
    Private(
        name=_RESOLVE_QUANT_PREFIX,
        where=_RESOLVE_QUANT_PREFIX,
        why="the name ModelSlimConfig looks a layer's scheme up under: the target-layer check "
        "must read the description entry sglang read",
        how="called with a shard's prefix (target_layers.py); before 0.5.18, the prefix as is",
        checked_in=releases.since("0.5.18"),
        remove_when="ModelSlimConfig exposes its layer-to-description lookup publicly",
        spelled=("_resolve_quant_prefix",),
        accessors=("resolve_quant_prefix",),
        # the test's stand-in for a later sglang resolves prefixes with sglang's own lookup
        also_spelled_in=("test/e2e/test_target_layers.py",),
    ),
    Private(
        name=f"{_LOADER}._is_npu",
        where=f"{_LOADER}._is_npu",
        why="_get_quantization_config adds the nested packed-module mapping only when it is "
        "True: a ModelSlim draft checked on a CPU box must be built with it",
        how="answers True while the CPU tools build (or load) a draft as on NPU "
        "(tools/cpu_env.npu_quantization_rule)",
        remove_when="sglang applies its packed-module mapping on every platform",
        spelled=("_is_npu",),
        accessors=("loader_is_npu", "set_loader_is_npu"),
        also_spelled_in=("e2e/site/e2e_shim_modelslim.py",),  # see _get_quantization_config
    ),
    Private(
        name=f"{_NEXTN}._is_npu",
        where=f"{_NEXTN}._is_npu",
        why="on NPU DeepSeek's NextN class names its layer model.layers.<n>, elsewhere "
        "model.decoder: the prefix ModelSlimConfig looks schemes up under",
        how="answers True while the CPU tools build a draft as on NPU "
        "(tools/cpu_env.npu_quantization_rule)",
        remove_when="sglang names the NextN layer the same way on every platform",
        spelled=("_is_npu",),
        accessors=("nextn_module_is_npu", "set_nextn_module_is_npu"),
    ),
    Private(
        name="sglang.srt.plugins._get_excluded_dists",
        where="sglang.srt.plugins._get_excluded_dists",
        why="the CLI tells the user whether sglang would load this plugin (SGLANG_PLATFORM)",
        how="called by tools/activation.py, passed to sglang's public load_plugins_by_group",
        remove_when="sglang exposes 'which plugins would load' publicly",
        spelled=("_get_excluded_dists",),
        accessors=("excluded_plugin_dists",),
    ),
    Private(
        name=f"sglang.srt.layers.parameter.BasevLLMParameter.{V2_LOADER_ATTRIBUTE}",
        why="the write recorder wraps every draft parameter's weight_loader; a "
        "BasevLLMParameter's is a read-only property over this attribute",
        how="swapped for a recording wrapper for one load (guard/writes.py, swap_weight_loader)",
        remove_when="sglang reports parameter writes to plugins, or the property gets a setter",
        spelled=(V2_LOADER_ATTRIBUTE,),
        accessors=("swap_weight_loader", "weight_loader_slot"),
    ),
    Private(
        name="sglang.srt.runtime_context (get_model, get_spec, get_server_args, publish, "
        "SpawnRanks)",
        why="the draft's launch path, revision and --download-dir inside a scheduler; the CPU "
        "tools publish a context as the scheduler does before building a class",
        how="read in the server (context.draft_launch); published by the CPU tools (per "
        "release: the entries below)",
        remove_when="load_weights receives its load config",
        spelled=("runtime_context",),
        accessors=("published_server_args", "draft_server_args", "publish_server_args"),
        where="sglang.srt.runtime_context.get_parallel",
        also_spelled_in=(
            # the rank tests read get_parallel and publish(role="tokenizer")
            "test/support/rank_worker.py",
            "test/integration/test_processes.py",
            "test/integration/test_ray.py",
        ),
    ),
    Private(
        name="sglang.srt.runtime_context.SpawnRanks (publish(..., ranks=))",
        why="from 0.5.21 VocabParallelEmbedding and FusedMoE read their rank from the ranks "
        "published with the server args, not from the torch process group",
        how="publish_server_args passes SpawnRanks(world_rank) where it exists",
        remove_when="as runtime_context",
        checked_in=releases.since("0.5.21"),
        where="sglang.srt.runtime_context.SpawnRanks",
    ),
    Private(
        name="sglang.srt.runtime_context.publish, get_model, get_spec",
        why="0.5.17 split the server args into config bags; get_spec() is where the draft's "
        "path and quantization are read",
        how="publish_server_args / draft_server_args where they exist; before 0.5.17 the "
        "ServerArgs itself holds the same fields",
        remove_when="as runtime_context",
        checked_in=releases.since("0.5.17"),
        where="sglang.srt.runtime_context.get_spec",
    ),
    Private(
        name="sglang.srt.runtime_context.get_server_args",
        why="the published ServerArgs (the CLI publishes only once, and reads it back)",
        how="published_server_args; in 0.5.14 server_args.get_global_server_args (retired, "
        "raising, from 0.5.20)",
        remove_when="as runtime_context",
        checked_in=releases.since("0.5.15"),
        where="sglang.srt.runtime_context.get_server_args",
    ),
    Private(
        name="sglang.srt.server_args.get_global_server_args, set_global_server_args_for_scheduler",
        why="sglang 0.5.14 keeps the published ServerArgs in a module global",
        how="published_server_args / publish_server_args where runtime_context lacks "
        "get_server_args / publish (0.5.14-0.5.16 for publishing, 0.5.14 for reading)",
        remove_when="0.5.16 leaves the supported range",
        spelled=("get_global_server_args", "set_global_server_args_for_scheduler"),
        accessors=("published_server_args", "publish_server_args"),
        checked_in=releases.before("0.5.17"),
        where="sglang.srt.server_args.set_global_server_args_for_scheduler",
    ),
    Private(
        name="sglang.srt.layers.dp_attention.initialize_dp_attention(server_args, model_config)",
        why="through 0.5.20 every layer's communicator reads the attention-DP placement the "
        "model runner sets: the CPU tools must set it too",
        how="set_attention_dp_placement calls it when its signature takes model_config",
        remove_when="0.5.20 leaves the supported range",
        spelled=("initialize_dp_attention",),
        accessors=("set_attention_dp_placement",),
        checked_in=releases.before("0.5.21"),
        where="sglang.srt.layers.dp_attention.initialize_dp_attention",
    ),
)


# -- accessors: the only code that spells the names above ------------------------------------


def prepare_weights(loader: Any, path: str, revision: str | None) -> tuple[str, list[str], bool]:
    """``(folder, files, use_safetensors)`` as ``DefaultModelLoader`` resolves ``path``."""
    return loader._prepare_weights(path, revision, True)


def modelscope_local_copy(loader: Any, path: str, revision: str | None) -> str:
    """``path`` itself, or its ModelScope download under ``SGLANG_USE_MODELSCOPE``."""
    return loader._maybe_download_from_modelscope(path, revision)


def all_weights(loader: Any, model_config: Any, model: Any) -> Any:
    """The ``(name, tensor)`` stream ``DefaultModelLoader.load_model`` feeds ``model``."""
    return loader._get_all_weights(model_config, model)


def weights_iterator(loader: Any, path: str, revision: str | None) -> Any:
    """The stream for one checkpoint path (no ModelConfig needed)."""
    return loader._get_weights_iterator(type(loader).Source(path, revision))


def initialize_model(model_config: Any, load_config: Any, quant_config: Any) -> Any:
    from sglang.srt.model_loader.loader import _initialize_model

    return _initialize_model(model_config, load_config, quant_config)


def quantization_config(model_config: Any, load_config: Any) -> Any:
    from sglang.srt.model_loader.loader import _get_quantization_config

    return _get_quantization_config(model_config, load_config)


def resolve_quant_prefix(quant_config: Any, prefix: str) -> str:
    """The prefix under which ``ModelSlimConfig`` finds ``prefix``'s description entry."""
    resolve = getattr(quant_config, "_resolve_quant_prefix", None)
    return resolve(prefix) if callable(resolve) else prefix


def patched_targets() -> frozenset[str]:
    """The hook targets sglang's ``HookRegistry`` applied in this process."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return frozenset(HookRegistry._patched)


def hooks_around(function: Any) -> list[Any]:
    """The hooks ``HookRegistry`` wrapped around ``function`` as installed, outermost first."""
    hooks = []
    seen: set[int] = set()
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        code = getattr(function, "__code__", None)
        cells = dict(zip(code.co_freevars, function.__closure__ or (), strict=True)) if code else {}
        if "hook" in cells:
            try:
                hooks.append(cells["hook"].cell_contents)
            except ValueError:  # an empty cell: no hook bound
                pass
        function = getattr(function, "__wrapped__", None)
    return hooks


def mtp_file_added(files: list[str], folder: str, index_file: str, hf_config: Any) -> list[str]:
    """``files`` with GLM NextN's ``mtp.safetensors`` added as the loader adds it."""
    from sglang.srt.model_loader.loader import maybe_add_mtp_safetensors

    return maybe_add_mtp_safetensors(files, folder, index_file, hf_config)


def unwrapped(function: Any) -> Any:
    """The function ``HookRegistry`` wrapped (``functools.wraps``), or ``function`` itself."""
    return getattr(function, "__wrapped__", function)


def expert_map(module: Any) -> Any:
    """FusedMoE's global -> local expert mapping of ``module``, or None if it has none."""
    mapping = getattr(module, EXPERT_MAP_METHOD, None)
    return mapping if callable(mapping) else None


def weight_loader_slot(param: Any) -> str:
    """The attribute of ``param`` that holds what ``param.weight_loader`` returns."""
    if isinstance(getattr(type(param), "weight_loader", None), property):
        return V2_LOADER_ATTRIBUTE
    return "weight_loader"


def swap_weight_loader(param: Any, loader: Any) -> Any:
    """Make ``loader`` what ``param.weight_loader`` returns; return the function that undoes
    it (an absent attribute, sglang's ``default_weight_loader``, is deleted again)."""
    slot = weight_loader_slot(param)
    if slot in vars(param):
        saved = vars(param)[slot]
        setattr(param, slot, loader)
        return lambda: setattr(param, slot, saved)
    setattr(param, slot, loader)
    return lambda: delattr(param, slot)


def holds_global_experts(param: Any) -> bool:
    return bool(getattr(param, GLOBAL_EXPERTS_ATTRIBUTE, False))


def published_server_args() -> Any | None:
    """The ServerArgs published in this process (a scheduler, or the CLI), or None."""
    from sglang.srt import runtime_context

    getter: Any = getattr(runtime_context, "get_server_args", None)
    if getter is None:
        from sglang.srt import server_args

        getter = server_args.get_global_server_args
    try:
        return getter()
    except ValueError:
        return None


def draft_server_args() -> tuple[Any, Any]:
    """``(model args, speculative args)`` of the published context; raises outside sglang."""
    from sglang.srt import runtime_context

    if hasattr(runtime_context, "get_spec"):
        return runtime_context.get_model(), runtime_context.get_spec()
    server_args = published_server_args()
    if server_args is None:
        raise ValueError("no sglang server arguments published in this process")
    return server_args, server_args


def publish_server_args(server_args: Any, role: str, world_rank: int) -> None:
    """Publish ``server_args`` the way ``run_scheduler_process`` does (per release: LEDGER)."""
    from sglang.srt import runtime_context

    if hasattr(runtime_context, "SpawnRanks"):
        ranks = runtime_context.SpawnRanks(world_rank=world_rank)
        runtime_context.publish(server_args, role=role, ranks=ranks)
    elif hasattr(runtime_context, "publish"):
        runtime_context.publish(server_args, role=role)
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server_args)


def set_attention_dp_placement(server_args: Any, hidden_size: int, dtype: Any) -> None:
    """Set sglang's attention-DP placement for this process as its model runner does (through
    0.5.20; later it derives from ``SpawnRanks``). Of the model config it reads only what this
    stand-in holds."""
    import inspect
    from types import SimpleNamespace

    from sglang.srt.layers import dp_attention

    if "model_config" not in inspect.signature(dp_attention.initialize_dp_attention).parameters:
        return
    model_config = SimpleNamespace(hf_config=None, hidden_size=hidden_size, dtype=dtype)
    dp_attention.initialize_dp_attention(server_args, model_config)


def excluded_plugin_dists() -> set[str]:
    """The distributions whose general plugins sglang skips under ``SGLANG_PLATFORM``."""
    from sglang.srt.plugins import _get_excluded_dists

    return _get_excluded_dists()


def cpu_rope_builder() -> Any:
    """sglang's CPU rope factory (the ``device == "cpu"`` branch of ``get_rope_wrapper``)."""
    from sglang.srt.layers.rotary_embedding import factory

    return factory.get_rope_cpu


def set_cpu_rope_builder(function: Any) -> None:
    from sglang.srt.layers.rotary_embedding import factory

    factory.get_rope_cpu = function


def generic_rope_builder() -> Any:
    from sglang.srt.layers.rotary_embedding import factory

    return factory.get_rope


#: the draft modules whose quantization rule has an NPU clause (``if is_npu() and ...``)
NPU_RULE_MODULES = tuple(
    f"sglang.srt.models.{m}"
    for m in ("qwen3_5_mtp", "qwen3_next_mtp", "glm4_moe_nextn", "glm4_moe_lite_nextn")
)


def loader_is_npu() -> bool:
    """The ``_is_npu`` sglang's model loader module read at import."""
    import sglang.srt.model_loader.loader as loader

    return bool(loader._is_npu)


def set_loader_is_npu(value: bool) -> None:
    import sglang.srt.model_loader.loader as loader

    loader._is_npu = value


def nextn_module_is_npu() -> bool:
    """The ``_is_npu`` DeepSeek's NextN module read at import."""
    import sglang.srt.models.deepseek_nextn as nextn

    return bool(nextn._is_npu)


def set_nextn_module_is_npu(value: bool) -> None:
    import sglang.srt.models.deepseek_nextn as nextn

    nextn._is_npu = value


def draft_module_is_npu(module: Any) -> Any:
    """The ``is_npu`` a draft module's quantization rule calls."""
    return module.is_npu


def set_draft_module_is_npu(module: Any, function: Any) -> None:
    module.is_npu = function
