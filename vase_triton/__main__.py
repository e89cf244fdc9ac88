"""`python -m vase_triton` runs the `vase-triton` command."""

import sys

from vase_triton.cli import main

sys.exit(main())
