"""ALFWorld on the stock engine: TextWorld's PDDL backend with ALFWorld's demangler.

Each `TextWorldAlfredEnv` owns its own TextWorld environment and its own
wrapper instances. (Sharing one wrapper list across a batch, as
``textworld.gym`` batch mode does, silently plays the same game in every slot.)
"""

from __future__ import annotations

import re
from typing import Any

from evoharness.envs.alfworld.wording import game_file_for_wording
from evoharness.envs.base import StepResult, TaskSpec

_GOAL_RE = re.compile(r"Your task is to:\s*(.+?)\s*$", re.S)


def extract_goal(intro: str) -> str:
    """The objective sentence of an ALFWorld intro (``Your task is to: …``)."""
    m = _GOAL_RE.search(intro)
    return m.group(1).strip() if m else ""


class TextWorldAlfredEnv:
    """One ALFWorld game on the stock TextWorld PDDL engine.

    Args:
        task: the game (``task.path`` is its ``game.tw-pddl``).
        wording: ``native`` (as in the file), ``put`` or ``move`` (rewrite the
            game's put command to ``put X in/on Y`` / alfworld>=0.4's ``move X to Y``).
        facts: also request the PDDL state facts (privileged; used by the
            planner expert and the differential tests).

    Raises:
        GameDataError: the game file is missing or cannot be loaded.
    """

    engine = "textworld"

    def __init__(self, task: TaskSpec, wording: str = "native", facts: bool = True) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        self.task = task
        self.wording = wording
        self._path = game_file_for_wording(task.path, wording)
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts, feedback=True)
        self._env = textworld.start(
            self._path, request_infos=infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]
        )
        self._state: Any = None
        self._goal = ""

    def _result(self, state: Any, done: bool) -> StepResult:
        self._state = state
        won = bool(state["won"])
        return StepResult(
            observation=state["feedback"].strip() if state["feedback"] else "",
            admissible_commands=list(state["admissible_commands"] or []),
            done=bool(done or won),
            won=won,
            goal=self._goal,
        )

    def reset(self) -> StepResult:
        state = self._env.reset()
        self._goal = extract_goal(state["feedback"] or "")
        return self._result(state, False)

    def step(self, action: str) -> StepResult:
        state, _score, done = self._env.step(action)
        return self._result(state, done)

    def facts(self) -> list[tuple[str, tuple[str, ...]]]:
        """Current PDDL state as (predicate, argument names) with demangled names,
        e.g. ``("inreceptacle", ("apple 1", "fridge 1"))``. Privileged."""
        if self._state is None or self._state["facts"] is None:
            return []
        return [(p.name, tuple(v.name.strip() for v in p.arguments)) for p in self._state["facts"]]

    def close(self) -> None:
        self._env.close()
