"""An example of a user's own environment, living outside the `collector` package.

Load it from a config with::

    [env]
    name = "my_env:environment"        # an instance
    # name = "my_env:UnitPricesEnv"    # or the class; [env.options] go to its constructor

with the directory holding `my_env/` on the Python path (for example
``PYTHONPATH=examples``; on a Ray cluster, ship it in the job's runtime environment).

What it shows: tasks with metadata, `start(task, context)` with the episode's context, a
tool whose arguments are a pydantic model and one whose JSON Schema is given as data
(`tools.json`; both validated before the tool runs: a wrong type or an unknown key is an
error result for the model, not a crash), an audit log that joins `executed_tool_calls` on
(episode_id, call_id) through `ToolCallContext`, and a grader that reads the episode's own
state. The prompts use the arithmetic phrasing, so the built-in simulated models really
work these tasks.
"""

from my_env.env import UnitPricesEnv

environment = UnitPricesEnv()

__all__ = ["UnitPricesEnv", "environment"]
