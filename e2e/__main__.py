"""``python -m e2e`` from the repository root: the server run of ``e2e/run.py``."""

import sys

from e2e.run import main

sys.exit(main())
