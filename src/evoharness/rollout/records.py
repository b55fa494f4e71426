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
at sampling time: log_softmax of the distribution actually sampled from
(temperature-scaled; under constrained decoding, disallowed ids masked, see
``engines/grammar.py``). ``constraint`` records that mask's source (None: only ids
beyond the tokenizer were masked), so RL recomputes the same distribution for
the PPO ratio.

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
        constraint: the constrained-decoding grammar the completion was sampled
            under, ``{"commands": [...], "meta_verbs": [...], "max_new_tokens": N}``
            (`engines.grammar.ActionGrammar.constraint`); None when unconstrained.
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
    constraint: dict[str, Any] | None = None


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
        stop_reason: ``won``, ``done``, ``max_steps``, ``hopeless`` (a repeated-state
            loop ended early, `run_episodes` stop_repeats) or ``error``.
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
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = set(cls.__dataclass_fields__)
        traj = cls(**{k: v for k, v in d.items() if k in names and k != "turns"})
        turn_names = set(TurnRecord.__dataclass_fields__)
        traj.turns = [TurnRecord(**{k: v for k, v in t.items() if k in turn_names}) for t in d.get("turns", [])]
        return traj


AGENT_ROLES = ("main", "summary", "subagent", "subagent_summary")  # QwenGyre's leaf priority, highest first


@dataclass
class CallAttempt:
    """One try of a model call on one backend (the gateway retries transparently).

    Attributes:
        backend: the backend's name.
        t_start / t_end: wall-clock seconds (``time.time()``).
        error: why this try failed (backend dropped, drained, HTTP error); None for the try that answered.
    """

    backend: str
    t_start: float
    t_end: float
    error: str | None = None


@dataclass
class CallRecord:
    """One model call seen by the gateway: the black-box token-in/token-out record (QwenGyre §TITO).

    An agent knows only a base URL; the gateway ties each call to an execution
    (header ``X-Execution-Id``, fallback the request's ``user`` field) and a role
    (header ``X-Agent-Role``: one of `AGENT_ROLES`, default ``main``). Calls of one
    execution are later prefix-matched into a trajectory tree (``rollout/tree.py``):
    only ``completion_token_ids`` are trainable.

    Attributes:
        execution_id / call_id: the execution and this call's unique id (``chatcmpl-…``).
        role: the caller's role in the execution (`AGENT_ROLES`).
        model: the model name the client asked for.
        prompt_token_ids: the prompt exactly as the engine tokenised it (chat template applied).
        completion_token_ids: the generated ids (a final stop token included).
        logprobs: behaviour log-prob per completion token (natural log, same length).
        policy_version: version of the weights that produced the answer.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        t_start / t_end: wall-clock seconds of the whole call, retries included.
        attempts: every try, in order; the last one answered.
        tool_calls: the raw tool-call payloads returned (OpenAI format), cached by id so a
            harness that re-renders history still matches.
        messages: the request's messages as sent (for audit and replay).
        constraint: the grammar the completion was sampled under, the shared constraint record
            ``{"commands", "meta_verbs", "max_new_tokens"}`` (None: unconstrained): the
            behaviour log-probs are of the masked distribution, so a trainer replays it.
    """

    execution_id: str
    call_id: str
    role: str
    model: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    t_start: float
    t_end: float
    attempts: list[CallAttempt] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    constraint: dict[str, Any] | None = None

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallRecord:
        names = set(cls.__dataclass_fields__)
        rec = cls(**{k: v for k, v in d.items() if k in names and k != "attempts"})
        rec.attempts = [CallAttempt(**a) for a in d.get("attempts", [])]
        return rec
