"""ALFWorld: game discovery, the stock TextWorld engine, the fast engine, both wordings."""

from __future__ import annotations

from evoharness.envs.base import TaskSpec

ENGINES = ("textworld", "fast")


def make_env(task: TaskSpec, engine: str = "fast", wording: str = "native", facts: bool = True):
    """A fresh, independent ALFWorld environment for `task`.

    Args:
        engine: ``textworld`` (stock TextWorld PDDL engine) or ``fast`` (the
            project's own interpreter of the same game files, byte-identical text).
        wording: ``native``, ``put`` or ``move`` (see `wording.py`).
        facts: expose PDDL state facts (privileged; for the planner expert/tests).
    """
    if engine == "textworld":
        from evoharness.envs.alfworld.textworld_env import TextWorldAlfredEnv

        return TextWorldAlfredEnv(task, wording=wording, facts=facts)
    if engine == "fast":
        from evoharness.envs.alfworld.fast import FastAlfredEnv

        return FastAlfredEnv(task, wording=wording, facts=facts)
    raise ValueError(f"unknown ALFWorld engine {engine!r}; expected one of {ENGINES}")
