"""`python -m collector`: the same command line as the `collector` script.

Tests: tests/system/run/test_cli_process.py (`python -m collector` in a subprocess).
"""

import sys

from collector.cli import main

sys.exit(main())
