"""`python -m foodvit ...`: the same command line as `foodvit ...`."""

import sys

from foodvit.cli.main import main

sys.exit(main())
