"""ReAct harness: task, a window of recent history, the observation, admissible commands.

The baseline harness of EvoHarness-RL's tables ("ReAct, Qwen3-8B frozen"):
no state beyond the history window and no meta-actions. Output format
``<think>…</think><action>…</action>``; a bare action line is accepted too.
"""

from __future__ import annotations

from evoharness.envs.base import StepResult, TaskSpec
from evoharness.harness.base import Harness, ParsedAction
from evoharness.harness.prompt import HISTORY_HEADER, history_entry, render_history

SYSTEM_PROMPT = (
    "You are an agent in a text-based household environment. Each turn you see the objective, "
    "the latest observation, the admissible commands and your recent actions. Think briefly, then "
    "act with exactly one admissible command.\n"
    "Reply as: <think>your reasoning</think><action>one admissible command</action>"
)


def format_history(history: list[tuple[str, str]], window: int) -> str:
    """Last `window` (action, feedback) pairs as ``> action\\nfeedback`` entries (`prompt.history_entry`)."""
    return render_history([history_entry(a, f) for a, f in history[-window:]] if window > 0 else [])


class ReActHarness(Harness):
    """ReAct-style prompting with a bounded history window.

    Args:
        history_window: number of previous (action, feedback) pairs shown.
    """

    name = "react"

    def __init__(self, history_window: int = 8) -> None:
        self.history_window = history_window
        self._history: list[tuple[str, str]] = []
        self._obs = ""
        self._admissible: list[str] = []
        self._goal = ""
        self._intro = ""

    def reset(self, task: TaskSpec, first: StepResult) -> None:
        self._history = []
        self._goal = first.goal
        self._intro = first.observation
        self._obs = first.observation
        self._admissible = list(first.admissible_commands)

    @property
    def admissible(self) -> list[str]:
        return self._admissible

    def messages(self) -> list[dict[str, str]]:
        user = (
            f"OBJECTIVE: {self._goal}\n\n"
            f"OBSERVATION: {self._obs}\n\n"
            f"ADMISSIBLE COMMANDS: {', '.join(self._admissible)}\n\n"
            f"{HISTORY_HEADER}\n{format_history(self._history, self.history_window)}"
        )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def after_env_step(self, action: ParsedAction, result: StepResult) -> None:
        self._history.append((action.command, result.observation))
        self._obs = result.observation
        self._admissible = list(result.admissible_commands)

    def after_invalid(self, action: ParsedAction) -> None:
        feedback = f"Invalid action: {action.error}"
        self._history.append((action.command or "(empty)", feedback))
        self._obs = feedback
