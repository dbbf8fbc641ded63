"""The Qwen3.5 MTP draft module's platform answer, as on the Ascend host step 01 launches on.

PR 1 (``upstream/series/``) decodes a ModelSlim draft only ``if self.quant_config is None and
is_npu()``, reading ``is_npu`` from ``sglang.srt.models.qwen3_5_mtp``'s namespace. On this CPU
that answer is False, so the feature branch's server would load the raw codes exactly as stock
and step 01's launch could show nothing. With ``E2E_DRAFT_NPU_CHECK=1`` (set by the upstream
plan for its ``stock`` and ``branch`` servers, ``e2e/plan.py``) that module's ``is_npu`` answers
True, as it does on an NPU; every other module keeps the CPU's answer, so sglang's kernels,
attention and loaders stay those of the CPU. Its first call is announced
(``E2E_DRAFT_NPU_CHECK_LINE``), and the harness requires the line in both servers' logs.

What else reads that name in the module (0.5.23): ``_mtp_quant_config`` (returns None when the
draft quantization is unset: what a flagless CPU launch already builds) and ``forward``'s DeepEP
bf16-dispatch switch (environment overrides only, for a DeepEP all-to-all the CPU never runs).
"""

from __future__ import annotations

import os

from e2e_shim_hooks import after_import, say

ENV = "E2E_DRAFT_NPU_CHECK"
DRAFT_MODULE = "sglang.srt.models.qwen3_5_mtp"
#: the line the harness requires (``e2e/checks.py``)
E2E_DRAFT_NPU_CHECK_LINE = f"{DRAFT_MODULE}.is_npu answers True (as on the NPU step 01 runs on)"


def _npu_answer(module) -> None:
    told: list[bool] = []

    def is_npu() -> bool:
        if not told:
            told.append(True)
            say(E2E_DRAFT_NPU_CHECK_LINE)
        return True

    module.is_npu = is_npu


def install() -> None:
    if os.environ.get(ENV) == "1":
        after_import(DRAFT_MODULE, _npu_answer)
