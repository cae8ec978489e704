"""`python -m foodvit ...`: the same command line as `foodvit ...`."""

import sys

from .cli import main

sys.exit(main())
