"""``sglang-mtp-dequant doctor``: what a checkpoint's draft tensors are and what loading does.

Usage::

    report = diagnose("/models/Qwen3.5-27B-w8a8")          # a folder, a snapshot, a hub id
    report = diagnose("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision="main")
    print(render_text(report))              # a table, the verdict last
    print(json.dumps(report.to_json()))     # {"schema_version": SCHEMA_VERSION, "verdict": ...}
    sys.exit(0 if report.verdict == "ok" else 1)

Why: the misload is silent, so an operator asks before starting a server "will this draft load
correctly, and in which launch form?"; the doctor answers with the plugin's own decisions.
"""

from .analysis import diagnose
from .model import SCHEMA_VERSION, Diagnosis, TensorRow
from .render import render_text

__all__ = ["SCHEMA_VERSION", "Diagnosis", "TensorRow", "diagnose", "render_text"]
