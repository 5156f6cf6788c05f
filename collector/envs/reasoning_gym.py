"""`reasoning_gym`: reasoning-gym's procedurally generated tasks, graded by its own scorers.

Tests: tests/envs/test_reasoning_gym.py.

Install the extra: ``pip install 'collector[reasoning-gym]'``. Configure it with
`[env.options]`:

- `dataset` (required): a reasoning-gym dataset name (``leg_counting``, ``basic_arithmetic``,
  ...: `reasoning_gym.factory.DATASETS` lists them); a name it does not register is a
  one-line config error before the run, with the closest names;
- `size` (default 100, at most `MAX_GENERATED_TASKS`) and `seed` (default 0): passed to
  ``reasoning_gym.create_dataset``, so the same options give the same tasks on every worker;
- `config`: the dataset's own parameters (``{min_animals = 3, max_animals = 5}``...), passed as keywords
  to its config class; one it does not take is a config error naming it;
- `answer_format`: ``"tag"`` (the default, reasoning-gym's own evaluation convention) sends
  reasoning-gym's default system prompt, which asks for the answer inside
  ``<answer>...</answer>``, and scores the text of the last such tag (none: reward 0);
  ``"raw"`` sends the question alone and scores the whole reply.

It is a text-action environment (`collector.envs.textaction`): the model's reply is the
action, one per episode. A reply cut by the output cap is `length` and never scored, like
a cut tool call. The reward is ``dataset.score_answer(answer, entry)``: reasoning-gym's
scorer for that family (exact match, numeric tolerance or a checker, as the family
defines it). Grading reads only the final text, so episodes can be regraded
(`collector regrade`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from collector.envs.base import Environment, EpisodeContext, Task, generated_task_count
from collector.envs.textaction import StepResult, TextActionWorld
from collector.errors import ConfigError
from collector.turn import Message, SystemMessage, UserMessage

__all__ = ["ReasoningGymEnv", "ReasoningGymWorld"]

_FORMATS = ("tag", "raw")


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "env.name: 'reasoning_gym' needs the reasoning-gym package: "
            "pip install 'collector[reasoning-gym]'"
        ) from None
    return reasoning_gym


class ReasoningGymWorld(TextActionWorld):
    """One episode of one reasoning-gym entry: one answer, scored by the dataset."""

    def __init__(self, dataset: Any, entry: Mapping[str, Any], answer_format: str) -> None:
        self.dataset = dataset
        self.entry = entry
        self.answer_format = answer_format

    def answer(self, text: str | None) -> str | None:
        """The answer as reasoning-gym's scorer expects it (the last ``<answer>`` tag's text)."""
        if text is None or self.answer_format == "raw":
            return text
        from reasoning_gym.utils import extract_answer

        found: str | None = extract_answer(text)
        return found

    def step(self, text: str) -> StepResult:
        return StepResult("", self.grade(text), done=True)

    def grade(self, final_text: str | None) -> float:
        return float(self.dataset.score_answer(self.answer(final_text), dict(self.entry)))


class ReasoningGymEnv(Environment):
    """reasoning-gym datasets as tasks (see the module docstring)."""

    name = "reasoning_gym"
    regradable = True

    def __init__(
        self,
        dataset: str = "",
        size: int = 100,
        seed: int = 0,
        config: Mapping[str, Any] | None = None,
        answer_format: str = "tag",
    ) -> None:
        rg = _reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if not dataset:
            raise ConfigError('env.options.dataset: reasoning_gym needs a dataset name (e.g. "leg_counting")')
        if dataset not in DATASETS:
            close = difflib.get_close_matches(dataset, list(DATASETS), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(DATASETS)} are registered)"
            raise ConfigError(f"env.options.dataset: reasoning_gym has no dataset {dataset!r}{hint}")
        if answer_format not in _FORMATS:
            raise ConfigError(f"env.options.answer_format: must be one of {', '.join(_FORMATS)} "
                              f"(got {answer_format!r:.40})")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"env.options.seed: must be an integer (got {seed!r:.40})")
        try:
            size = generated_task_count(size)
            self.dataset = rg.create_dataset(dataset, size=size, seed=seed, **dict(config or {}))
        except ConfigError:
            raise
        # Broad on purpose: a config class refusing a parameter raises TypeError, a value it
        # checks AssertionError or ValueError; each is this option's one-line refusal.
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"env.options.config: reasoning_gym dataset {dataset!r} refused it: "
                              f"{type(exc).__name__}: {exc}") from None
        self.dataset_name = dataset
        self.answer_format = answer_format
        prefix: list[Message] = []
        if answer_format == "tag":
            from reasoning_gym.utils import SYSTEM_PROMPTS

            prefix = [SystemMessage(SYSTEM_PROMPTS["default"])]
        self._tasks = [
            Task(
                f"{dataset}-{seed}-{i}",
                [*prefix, UserMessage(entry["question"])] if prefix else entry["question"],
                {"dataset": dataset, "index": i, "answer": str(entry["answer"])},
            )
            for i, entry in enumerate(self.dataset)
        ]

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def check_task(self, task: Task) -> str | None:
        index = task.metadata.get("index")
        if task.metadata.get("dataset") != self.dataset_name or not isinstance(index, int):
            return (f"not a task of reasoning_gym dataset {self.dataset_name!r} "
                    "(metadata needs its dataset and index)")
        if not 0 <= index < len(self._tasks):
            return f"index {index} is outside the dataset's {len(self._tasks)} entries"
        return None

    def start(self, task: Task, context: EpisodeContext | None = None) -> ReasoningGymWorld:
        problem = self.check_task(task)
        if problem is not None:
            raise ValueError(problem)
        return ReasoningGymWorld(self.dataset, self.dataset[int(task.metadata["index"])], self.answer_format)
