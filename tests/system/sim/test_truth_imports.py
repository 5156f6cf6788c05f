"""The simulator package, imported in a fresh interpreter, exports its API and imports nothing of the
collector (the simulator is never imported by the loop, nor the loop by it).
"""

from __future__ import annotations


def test_package_exports_and_imports_nothing_of_the_collector() -> None:
    """The package's __all__ names exist, and importing it loads no envs, loop or providers module."""
    import subprocess
    import sys

    import collector.sim as sim

    assert all(hasattr(sim, name) for name in sim.__all__)
    code = ("import sys, collector.sim, collector.sim.app, collector.sim.truth; "
            "print(sorted(m for m in sys.modules if m.startswith(('collector.envs', "
            "'collector.episode.loop', "
            "'collector.providers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
