"""The harness seam: how a model sees a task and how its output becomes an action.

A harness turns (task, latest observation, its own state) into chat messages,
and parses a completion into one of three things (EvoHarness-RL §3):

- an environment action: the completion's action matches an admissible command;
- a meta-action (`track`, `commit`, `recall`, `note`): handled by the harness
  itself, costs one step of the episode budget, its result is shown next turn;
- an invalid action: anything else; feedback is shown next turn and it is counted.

The action is the model's *final answer*: reasoning never counts, text after
the answer is ignored, and two answers are invalid (`split_completion` states
the rule; both harnesses parse with it).
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

# tags in any case, with stray spaces inside the brackets (``<Action >``, ``< /think>``)
_THINK_OPEN, _THINK_CLOSE = r"<\s*think\s*>", r"<\s*/\s*think\s*>"
_THINK_BLOCK_RE = re.compile(rf"{_THINK_OPEN}(.*?){_THINK_CLOSE}", re.S | re.I)
_ACTION_OPEN_RE = re.compile(r"<\s*action\s*>", re.I)
_ACTION_RE = re.compile(r"<\s*action\s*>(.*?)(<\s*/\s*action\s*>|$)", re.S | re.I)
# ``Action: x``, markdown ``**Action:** x``, or ``> x``
_BARE_PREFIX_RE = re.compile(r"^[*_]*\s*(?:action|act)\s*[*_]*\s*:\s*[*_]*\s*|^>\s*", re.I)
_FENCE_RE = re.compile(r"^\s*```[\w+-]*\s*$")
MULTIPLE_ACTIONS = "More than one action in the answer. Reply with exactly one <action>COMMAND</action>."


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
    lines = [ln for ln in text.strip().splitlines() if not _FENCE_RE.match(ln)]  # a markdown code block
    text = "\n".join(lines).strip().strip("`'\"*_").strip()
    text = re.sub(r"\s+", " ", text)
    return text.rstrip(".!").strip().lower()


def split_reasoning(completion: str) -> tuple[str, str]:
    """Split a completion into (reasoning, answer text); the answer is what may hold the action.

    Reasoning is: every closed ``<think>…</think>`` block; text before a
    ``</think>`` that has no opening tag (Qwen3's chat template may open the
    block itself); and everything after an unclosed ``<think>`` (a completion
    cut while still thinking). The answer is the rest, in order. Only the
    first `MAX_PARSE_CHARS` characters are read.
    """
    head = completion[:MAX_PARSE_CHARS]
    thinks: list[str] = []
    close = re.search(_THINK_CLOSE, head, re.I)
    opening = re.search(_THINK_OPEN, head, re.I)
    if close and (opening is None or close.start() < opening.start()):
        thinks.append(head[: close.start()])
        head = head[close.end() :]
    parts, pos = [], 0
    for m in _THINK_BLOCK_RE.finditer(head):
        parts.append(head[pos : m.start()])
        thinks.append(m.group(1))
        pos = m.end()
    rest = head[pos:]
    if (m := re.search(_THINK_OPEN, rest, re.I)) is not None:
        thinks.append(rest[m.end() :])
        rest = rest[: m.start()]
    parts.append(rest)
    think = "\n".join(t.strip() for t in thinks if t.strip())
    return think, "".join(parts)


def split_completion(completion: str) -> tuple[str, str]:
    """Split a completion into (think, action text) by the final-answer rule.

    The rule (both harnesses, every output shape; EvoHarness-RL's format is
    ``<think>…</think><action>…</action>``):

    1. Reasoning never counts (`split_reasoning`): an action quoted inside
       ``<think>`` is not the answer.
    2. Outside the reasoning, the answer is the one ``<action>…</action>``
       block. Text before or after it is ignored (a hallucinated
       ``Observation: …`` after the answer included). An unclosed final block
       counts (servers strip a ``</action>`` stop string) up to its first
       line break: what follows is a continuation, not the action. Tags
       match in any case and with spaces inside the brackets; a markdown
       code fence or emphasis around the action is not part of it.
    3. Two or more ``<action>`` blocks outside the reasoning: no action
       (invalid, `MULTIPLE_ACTIONS`): the model gave more than one answer.
    4. No ``<action>`` tag at all (models prompted without the tag format): an
       ``Action: …`` (also ``**Action:** …``, or the line after a bare
       ``Action:``) or ``> …`` line is the answer
       (two or more such lines: invalid as in 3; later lines are a
       hallucinated continuation), else the last non-empty line that is not
       a code fence.

    Returns:
        ``(think, action)``; ``action`` is ``""`` when there is none (rule 3 included).
    """
    think, action, n = _final_answer(completion)
    return think, action if n == 1 else ""


def _final_answer(completion: str) -> tuple[str, str, int]:
    """(think, action, number of answers found) by `split_completion`'s rule."""
    think, answer = split_reasoning(completion)
    opens = len(_ACTION_OPEN_RE.findall(answer))
    if opens:
        m = _ACTION_RE.search(answer)
        action = m.group(1).strip()
        if not m.group(2):  # unclosed: the action is one line; the rest is a continuation
            action = next((ln for ln in action.splitlines() if ln.strip() and not _FENCE_RE.match(ln)), "")
        return think, action.strip(), opens
    lines = [ln.strip() for ln in answer.strip().splitlines() if ln.strip() and not _FENCE_RE.match(ln)]
    marked = [i for i, ln in enumerate(lines) if _BARE_PREFIX_RE.match(ln)]
    if marked:
        i = marked[0]
        action = _BARE_PREFIX_RE.sub("", lines[i], count=1)
        if not action.strip() and i + 1 < len(lines) and i + 1 not in marked:  # "Action:" alone, the command below
            action = lines[i + 1]
        return think, action, len(marked)
    return think, lines[-1] if lines else "", 1 if lines else 0


def parse_completion(completion: str, admissible: list[str], meta_verbs: tuple[str, ...] = ()) -> ParsedAction:
    """Parse a completion against the admissible commands and allowed meta verbs.

    Args:
        completion: raw model output (any length; only the head is read).
        admissible: the environment's admissible commands for this turn.
        meta_verbs: meta-actions this harness offers (empty for ReAct).

    Returns:
        A `ParsedAction`; never raises.
    """
    think, action, n = _final_answer(completion)
    if n > 1:
        return ParsedAction("invalid", "", think=think, error=MULTIPLE_ACTIONS)
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
        "invalid",
        norm,
        think=think,
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
