"""`python -m collector`: the same command line as the `collector` script."""

import sys

from collector.cli import main

sys.exit(main())
