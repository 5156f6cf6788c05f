"""The job tests of the system tier are checked as the default tier's are: `collector check` after
every collection (the fixture of tests/run/conftest.py, imported so it is written once)."""

from tests.run.conftest import _check_every_collected_run  # noqa: F401 - an autouse fixture, by name
