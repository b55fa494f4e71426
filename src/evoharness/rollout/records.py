"""Trajectory records: the one format every later stage reads.

This is the token-in/token-out (TITO) contract (QwenGyre §"TITO records";
EvoHarness-RL §4 rollouts). One `Trajectory` is one episode; each `TurnRecord`
is one model call and what the harness did with it.

Trainable tokens: only ``completion_token_ids`` of a turn are ever trained on.
Prompt tokens (system text, observations, admissible commands, harness views,
earlier turns re-rendered into the prompt) are never trainable. Each turn's
prompt is rendered fresh by the harness, so turns are independent
(prompt, completion) pairs; prefix sharing between them is found later by the
trajectory tree (``rollout/tree.py``), not assumed here.

Behaviour log-probs: ``logprobs[i]`` is the natural-log probability the
sampling policy (version ``policy_version``) gave ``completion_token_ids[i]``
at sampling time, after temperature scaling. RL uses it for the PPO ratio.

Serialisation: `Trajectory.to_dict()` is plain JSON; one trajectory per JSONL
line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TurnRecord:
    """One model call within an episode.

    Attributes:
        turn: 0-based index; every turn costs one step of the budget.
        messages: the chat messages the policy read.
        completion: the raw completion text.
        kind: ``env`` / ``meta`` / ``invalid`` (see `harness.base.ParsedAction`).
        action: the executed command, ``verb argument`` for meta, or the
            offending text for invalid.
        feedback: what came back: the environment's observation, the
            meta-action's result, or the invalid-action message.
        views: the harness views shown in this turn's prompt (name -> text).
        admissible_commands: the environment's admissible commands at this turn.
        won / done: environment flags after this turn.
        prompt_token_ids / completion_token_ids / logprobs / policy_version:
            the TITO record (None for text-only policies).
        prompt_tokens / completion_tokens: usage counts.
        error: the policy's error for this call, if any.
    """

    turn: int
    messages: list[dict[str, str]]
    completion: str
    kind: str
    action: str
    feedback: str
    views: dict[str, str] = field(default_factory=dict)
    admissible_commands: list[str] = field(default_factory=list)
    won: bool = False
    done: bool = False
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class Trajectory:
    """One episode: task, outcome, turns.

    Attributes:
        episode_id: unique id (``<task_id>#<sample>``).
        task_id / task_type / split: the task (see `envs.base.TaskSpec`).
        harness / policy: names of what played it.
        goal: the objective text.
        initial_observation: the observation after reset.
        turns: the model calls, in order.
        won: the environment's success flag at the end.
        stop_reason: ``won``, ``done``, ``max_steps`` or ``error``.
        error: the exception text when ``stop_reason == "error"`` (a crashed
            or hung environment); the episode then counts as failed.
        max_steps: the step cap it ran under.
        seed: the episode's seed.
        wall_s: wall-clock seconds.
        info: free-form extras (goal-condition success, reward components…).
    """

    episode_id: str
    task_id: str
    task_type: str
    split: str
    harness: str
    policy: str
    goal: str = ""
    initial_observation: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    won: bool = False
    stop_reason: str = ""
    error: str | None = None
    max_steps: int = 50
    seed: int = 0
    wall_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Steps used: every turn (environment, meta or invalid) costs one."""
        return len(self.turns)

    @property
    def env_steps(self) -> int:
        return sum(t.kind == "env" for t in self.turns)

    @property
    def invalid_actions(self) -> int:
        return sum(t.kind == "invalid" for t in self.turns)

    @property
    def meta_calls(self) -> Counter[str]:
        """Meta-action calls by verb (``track``/``commit``/``recall``/``note``)."""
        return Counter(t.action.split(" ", 1)[0] for t in self.turns if t.kind == "meta")

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            steps=self.steps,
            env_steps=self.env_steps,
            invalid_actions=self.invalid_actions,
            meta_calls=dict(self.meta_calls),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        names = set(cls.__dataclass_fields__)
        traj = cls(**{k: v for k, v in d.items() if k in names and k != "turns"})
        turn_names = set(TurnRecord.__dataclass_fields__)
        traj.turns = [TurnRecord(**{k: v for k, v in t.items() if k in turn_names}) for t in d.get("turns", [])]
        return traj
