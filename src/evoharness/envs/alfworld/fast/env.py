"""`FastAlfredEnv`: the fast engine behind the same interface as `TextWorldAlfredEnv`."""

from __future__ import annotations

from evoharness.envs.alfworld.fast.engine import Episode
from evoharness.envs.alfworld.fast.game import load_game
from evoharness.envs.alfworld.textworld_env import extract_goal
from evoharness.envs.alfworld.wording import game_file_for_wording
from evoharness.envs.base import StepResult, TaskSpec


class FastAlfredEnv:
    """One ALFWorld game on the project's own engine (byte-identical to the stock one).

    Args:
        task: the game (``task.path`` is its ``game.tw-pddl``).
        wording: ``native``, ``put`` or ``move`` (see `wording.py`).
        facts: expose the PDDL state facts through `facts()` (as the stock
            wrapper: without them `facts()` returns ``[]``).

    Raises:
        OSError / ValueError: the game file is missing or cannot be read.
    """

    engine = "fast"

    def __init__(self, task: TaskSpec, wording: str = "native", facts: bool = True) -> None:
        self.task = task
        self.wording = wording
        self._with_facts = facts
        self._path = game_file_for_wording(task.path, wording)
        self._episode = Episode(load_game(self._path))
        self._goal = ""
        self._started = False

    def _result(self, observation: str) -> StepResult:
        ep = self._episode
        return StepResult(
            observation=observation.strip(),
            admissible_commands=list(ep.admissible),
            done=ep.won,
            won=ep.won,
            goal=self._goal,
        )

    def reset(self) -> StepResult:
        intro = self._episode.reset()
        self._started = True
        self._goal = extract_goal(intro)
        return self._result(intro)

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        return self._result(self._episode.step(action))

    def facts(self) -> list[tuple[str, tuple[str, ...]]]:
        """Current PDDL state as (predicate, argument names), as the stock engine
        reports it (including its ``not_`` facts). Privileged."""
        if not self._started or not self._with_facts:
            return []
        return self._episode.facts()

    def close(self) -> None:
        self._started = False
