"""Importing this puts the repository's ``test/`` on ``sys.path``: a benchmark run as
``python benchmarks/x.py`` then imports ``support.*`` (``test/support/``) as the tests do,
where pytest's ``pythonpath`` setting does the same.

Usage, before the first ``support`` import::

    import support_on_path  # noqa: F401
"""

import os
import sys

TEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test")
if TEST not in sys.path:
    sys.path.insert(0, TEST)
