"""An example of a user's own environment, living outside the `collector` package.

Load it from a config with::

    [env]
    name = "my_env:environment"        # an instance
    # name = "my_env:UnitPricesEnv"    # or the class; [env.options] go to its constructor

with the directory holding `my_env/` on the Python path (for example
``PYTHONPATH=examples``; on a Ray cluster, ship it in the job's runtime environment).

What it shows: tasks with metadata, a tool whose arguments are a pydantic model (validated
before the tool runs: a wrong type or an unknown key is an error result for the model, not
a crash), a plain typed tool, and a grader that reads the episode's own state. The prompts
use the arithmetic phrasing, so the built-in simulated models really work these tasks.
"""

from my_env.env import UnitPricesEnv

environment = UnitPricesEnv()

__all__ = ["UnitPricesEnv", "environment"]
