"""CPU shims for sglang's registered tests run on this machine (``upstream/run_tests.py``).

``upstream/run_tests.py`` puts this folder on ``PYTHONPATH`` for the processes sglang's
harness starts (``python3 file.py``), so the test files themselves carry no environment code,
as in sglang's CI. Two stand-ins, each only where the real thing cannot run here
(``sglang_mtp_dequant.tools.cpu_env`` says why):

- torchvision's CUDA wheel beside CPU torch gets its two missing operator schemas, so that
  transformers (imported by sglang) can import it;
- off CUDA, ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding`` (used
  only in ``forward``): a placeholder that raises if called, installed only when vllm is absent
  and ``UPSTREAM_SITE_NO_ROTARY`` is not ``1`` (``run_tests.py`` sets it for sglang's harness:
  the registered tests build their drafts without it, as sglang's CPU runner must).
"""

import importlib.util
import os
import sys

from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable, vllm_placeholder

ensure_torchvision_importable()
if importlib.util.find_spec("vllm") is None and os.environ.get("UPSTREAM_SITE_NO_ROTARY") != "1":
    sys.modules.update(vllm_placeholder())
