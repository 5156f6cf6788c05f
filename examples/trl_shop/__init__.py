"""A TRL-style environment class (TRL's `environment_factory` contract), run by the collector.

Load it from a config with::

    [env]
    name = "trl:trl_shop.env:ShopEnv"
    task_file = "examples/trl_shop/tasks.jsonl"
    [env.options]
    reward = ["trl_shop.env:reserved_reward"]

with `examples/` on the Python path (`python_path`). configs/trl_demo.toml runs it on the
simulator. Nothing here imports TRL or the collector: the same class and reward function
go to `GRPOTrainer(environment_factory=ShopEnv, reward_funcs=reserved_reward)` as they are.
"""
