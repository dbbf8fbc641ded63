"""``sglang-mtp-dequant doctor``: what a checkpoint's draft tensors are and what loading does.

Usage::

    report = diagnose("/models/Qwen3.5-27B-w8a8")          # a folder, a snapshot, a hub id
    report = diagnose("acme/Qwen3.5-27B-w8a8", download_dir="/data/hub", revision="main")
    print(render_text(report))              # a table, the verdict last
    print(json.dumps(report.to_json()))     # {"schema_version": SCHEMA_VERSION, "verdict": ...}
    sys.exit(0 if report.verdict == "ok" else 1)

Why it exists: the bug this package fixes is silent (stock sglang serves raw int8 codes and
logs nothing), so an operator needs a way to ask, before starting a server, "will this
checkpoint's draft load correctly?". The doctor answers with the very decisions the plugin
will take at load time, on the files sglang would stream. Split as ``verify/`` is:

- ``model.py``: the result (``Diagnosis``, one ``TensorRow`` per draft tensor, the JSON form);
- ``analysis.py``: ``diagnose``, which fills it (resolution, plan, stock behaviour, dry run);
- ``render.py``: the text table and verdict line.
"""

from .analysis import diagnose
from .model import SCHEMA_VERSION, Diagnosis, TensorRow
from .render import render_text

__all__ = ["SCHEMA_VERSION", "Diagnosis", "TensorRow", "diagnose", "render_text"]
