"""The harness seam: how a model sees a task and how its output becomes an action.

A harness turns (task, latest observation, its own state) into chat messages,
and parses a completion into one of three things (EvoHarness-RL §3):

- an environment action: the completion's action matches an admissible command;
- a meta-action (`track`, `commit`, `recall`, `note`): handled by the harness
  itself, costs one step of the episode budget, its result is shown next turn;
- an invalid action: anything else; feedback is shown next turn and it is counted.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from evoharness.envs.base import StepResult, TaskSpec

ActionKind = Literal["env", "meta", "invalid"]
META_VERBS = ("track", "commit", "recall", "note")

# A completion longer than this is not parsed beyond its head: a runaway model
# must cost an invalid step, not a regex over megabytes.
MAX_PARSE_CHARS = 8192
MAX_ACTION_CHARS = 300

_THINK_RE = re.compile(r"<think>(.*?)(?:</think>|$)", re.S | re.I)
_ACTION_RE = re.compile(r"<action>(.*?)(?:</action>|$)", re.S | re.I)


@dataclass
class ParsedAction:
    """A completion, parsed.

    Attributes:
        kind: ``env``, ``meta`` or ``invalid``.
        command: the environment command (kind ``env``), the meta verb (kind
            ``meta``), or the raw action text that failed (kind ``invalid``).
        argument: the meta-action's argument (``track apple`` -> ``apple``).
        think: the reasoning text, if the completion had a ``<think>`` block.
        error: why the action is invalid (shown to the model as feedback).
    """

    kind: ActionKind
    command: str
    argument: str = ""
    think: str = ""
    error: str = ""

    @property
    def text(self) -> str:
        """The action as written: ``command`` or ``verb argument``."""
        return f"{self.command} {self.argument}".strip() if self.kind == "meta" else self.command


def normalize_command(text: str) -> str:
    """Lower-case, strip quotes/punctuation at the ends, collapse whitespace."""
    text = text.strip().strip("`'\"").strip()
    text = re.sub(r"\s+", " ", text)
    return text.rstrip(".!").strip().lower()


def split_completion(completion: str) -> tuple[str, str]:
    """Split a completion into (think, action text).

    Accepts ``<think>…</think><action>…</action>``, an unterminated tag (a
    completion cut at the token limit), ``Action: …`` / ``> …`` lines, and a bare
    action as the completion's last non-empty line.
    """
    head = completion[:MAX_PARSE_CHARS]
    think_m = _THINK_RE.search(head)
    think = think_m.group(1).strip() if think_m else ""
    action_m = _ACTION_RE.search(head)
    if action_m:
        return think, action_m.group(1).strip()
    rest = _THINK_RE.sub("", head) if think_m else head
    lines = [ln.strip() for ln in rest.strip().splitlines() if ln.strip()]
    if not lines:
        return think, ""
    last = lines[-1]
    last = re.sub(r"^(action|act)\s*:\s*", "", last, flags=re.I)
    last = re.sub(r"^>\s*", "", last)
    return think, last


def parse_completion(completion: str, admissible: list[str], meta_verbs: tuple[str, ...] = ()) -> ParsedAction:
    """Parse a completion against the admissible commands and allowed meta verbs.

    Args:
        completion: raw model output (any length; only the head is read).
        admissible: the environment's admissible commands for this turn.
        meta_verbs: meta-actions this harness offers (empty for ReAct).

    Returns:
        A `ParsedAction`; never raises.
    """
    think, action = split_completion(completion)
    norm = normalize_command(action)
    if not norm:
        return ParsedAction("invalid", "", think=think, error="No action found. Reply with <action>COMMAND</action>.")
    if len(norm) > MAX_ACTION_CHARS:
        return ParsedAction("invalid", norm[:80] + "…", think=think, error="The action is too long.")
    by_norm = {normalize_command(c): c for c in admissible}
    if norm in by_norm:
        return ParsedAction("env", by_norm[norm], think=think)
    verb, _, arg = norm.partition(" ")
    if verb in meta_verbs:
        arg = arg.strip().strip("[]").strip()
        if not arg and verb != "track":
            return ParsedAction("invalid", norm, think=think, error=f"'{verb}' needs an argument, e.g. {verb} [...].")
        return ParsedAction("meta", verb, argument=arg or "world", think=think)
    return ParsedAction(
        "invalid", norm, think=think,
        error=f"'{norm}' is not an admissible command" + (" or a meta-action." if meta_verbs else "."),
    )


class Harness(ABC):
    """Turns an episode's state into chat messages and parses completions.

    Life cycle per episode: `reset` once; then each turn `messages`, `parse`,
    and exactly one of `after_env_step`, `run_meta`, `after_invalid`.
    """

    name: str = "base"
    meta_verbs: tuple[str, ...] = ()

    @abstractmethod
    def reset(self, task: TaskSpec, first: StepResult) -> None: ...

    @abstractmethod
    def messages(self) -> list[dict[str, str]]:
        """Chat messages (``role``/``content`` dicts) for the current turn."""

    def parse(self, completion: str) -> ParsedAction:
        return parse_completion(completion, self.admissible, self.meta_verbs)

    @property
    @abstractmethod
    def admissible(self) -> list[str]: ...

    @abstractmethod
    def after_env_step(self, action: ParsedAction, result: StepResult) -> None: ...

    def run_meta(self, action: ParsedAction) -> str:
        """Execute a meta-action on the harness state; returns its result text."""
        raise NotImplementedError(f"{self.name} has no meta-actions")

    @abstractmethod
    def after_invalid(self, action: ParsedAction) -> None: ...

    def views(self) -> dict[str, str]:
        """The harness views shown this turn (for logs and SFT traces)."""
        return {}
