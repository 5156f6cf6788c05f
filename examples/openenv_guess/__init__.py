"""A number-guessing game served as an OpenEnv environment (`python -m openenv_guess.server PORT`)."""
