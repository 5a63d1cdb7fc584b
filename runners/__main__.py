"""``python -m runners``: the runner agent's commands (``runners.cli``)."""

import sys

from runners.cli import main

sys.exit(main())
