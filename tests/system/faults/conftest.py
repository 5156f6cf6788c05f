"""The fault tests of the system tier use the default tier's fault fixtures (tests/faults/conftest.py),
imported so they are written once: the run checker, and `collector check` after every collection."""

from tests.faults.conftest import _check_every_collected_run, run_checker  # noqa: F401 - fixtures, by name
