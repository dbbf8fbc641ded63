"""Process set-up that must happen before torch, transformers or sglang is imported.

Why each step:
- ``OMP_WAIT_POLICY=PASSIVE``: torch's OpenMP threads spin while they wait for each other.
  On a shared 2-core machine a spinning thread steals the core its partner needs, and a
  training step measured 7-28 s instead of 2.3-3.7 s (same work: 1.7 CPU-seconds). Passive
  waiting costs nothing measurable when the machine is idle. Only a default: an explicit
  setting in the environment wins.
- PyPI's torchvision wheel is a CUDA build and fails to import beside CPU torch, and
  transformers imports torchvision. ``sglang_mtp_dequant.tools.cpu_sglang`` holds the one shim the
  project uses for that (it only acts when the import really fails); calling it here keeps
  the benchmark on the same, documented work-around instead of a second copy.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings


def prepare() -> None:
    """Set the thread wait policy, apply the torchvision shim, quieten start-up chatter."""
    if "torch" in sys.modules:
        raise RuntimeError("accept.env.prepare() must run before torch is imported")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    from sglang_mtp_dequant.tools.cpu_sglang import ensure_torchvision_importable

    ensure_torchvision_importable()
    for name in ("transformers", "sglang", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
