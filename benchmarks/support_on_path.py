"""Importing this puts the repository's ``test/`` and its root on ``sys.path``: a benchmark run
as ``python benchmarks/x.py`` then imports ``support.*`` (``test/support/``) and the server
harness (``e2e.*``) as the tests do, where pytest's ``pythonpath`` setting does the same.

Usage, before the first ``support`` or ``e2e`` import::

    import support_on_path  # noqa: F401
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for folder in (os.path.join(REPO, "test"), REPO):
    if folder not in sys.path:
        sys.path.insert(0, folder)
