"""What machine a benchmark ran on: the harness's answer (``e2e/machine.py``), for benchmarks run
as ``python benchmarks/x.py`` (``from machine import describe``)."""

import support_on_path  # noqa: F401  (the repository's root on sys.path, for e2e.*)
from e2e.machine import describe, finish

__all__ = ["describe", "finish"]
