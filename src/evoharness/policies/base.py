"""The policy seam: who answers a harness's messages.

A policy answers a batch of requests at once so that a local model can decode
many episodes together and an HTTP policy can keep many calls in flight.
Every completion carries its text and, where the policy has them, the
token-in/token-out record RL needs (prompt ids, completion ids, behaviour
log-probs, policy version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class PolicyRequest:
    """One turn of one episode, as seen by a policy.

    Attributes:
        messages: chat messages from the harness (``role``/``content`` dicts).
        episode_id: stable id of the episode (seeds per-episode randomness).
        turn: 0-based turn index within the episode.
        admissible_commands: the environment's admissible commands now.
        env: the live environment. Only *privileged* scripted policies (the
            PDDL-fact expert) read it; model policies must not.
        harness: the live harness (scripted teachers read its belief/plan).
    """

    messages: list[dict[str, str]]
    episode_id: str
    turn: int
    admissible_commands: list[str]
    env: Any = None
    harness: Any = None


@dataclass
class Completion:
    """A policy's answer to one request.

    Attributes:
        text: the completion text (``<think>…</think><action>…</action>``).
        prompt_token_ids: token ids the model read (None for text-only policies).
        completion_token_ids: token ids the model generated.
        logprobs: behaviour log-prob of each completion token as sampled
            (natural log; len == len(completion_token_ids)).
        policy_version: version of the weights that produced it.
        prompt_tokens / completion_tokens: usage counts (from the endpoint, the
            tokenizer, or an estimate for scripted policies).
        finish_reason: ``stop``, ``length`` or ``error`` (``replayed``: a branch's prefix turn,
            `rollout.episode.replayed`).
        error: set when the call failed; the text is then empty and the turn
            counts as an invalid action.
    """

    text: str
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    name: str

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        """Answer each request; same length and order. Must not raise for a
        single bad request: return a `Completion` with ``error`` set instead."""
        ...

    def close(self) -> None: ...


def format_action(action: str, think: str = "") -> str:
    """The harness output format: ``<think>…</think><action>…</action>``."""
    return f"<think>{think}</think><action>{action}</action>"
