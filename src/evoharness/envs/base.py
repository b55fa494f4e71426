"""The environment seam: what every text environment gives an agent.

An `Env` plays one task at a time. `reset()` starts its task and returns the
first `StepResult`; `step(action)` takes a command string (any string: the
engine answers unknown commands with its own feedback, e.g. "Nothing happens.")
and returns the next one. Nothing here knows about models, prompts or harnesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskSpec:
    """One playable task.

    Attributes:
        task_id: stable identifier, unique within a split (for ALFWorld the
            relative game path ``<task-folder>/<trial>``).
        task_type: family of the task (ALFWorld: one of the 6 task types).
        split: split it was drawn from (``train``, ``valid_seen``, ...).
        path: where the task's files live (ALFWorld: the ``game.tw-pddl`` file).
    """

    task_id: str
    task_type: str
    split: str
    path: str


@dataclass
class StepResult:
    """What the agent sees after a reset or a step.

    Attributes:
        observation: the engine's text feedback (after reset: the scene
            description and the goal).
        admissible_commands: commands the engine accepts now, in engine order.
        done: the episode is over (won, or the engine ended it).
        won: the task's goal holds (ALFWorld: the engine's ``won`` flag).
        goal: the natural-language objective (set on reset; kept afterwards).
        info: engine extras, e.g. ``goal_condition_success`` in [0, 1] where the
            engine can compute it.
    """

    observation: str
    admissible_commands: list[str]
    done: bool = False
    won: bool = False
    goal: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """A text environment holding one live episode."""

    task: TaskSpec

    def reset(self) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
