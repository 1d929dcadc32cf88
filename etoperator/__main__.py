"""`python -m etoperator run ...` (the same as the `etoperator` command)."""

import sys

from etoperator.cli import main

sys.exit(main())
