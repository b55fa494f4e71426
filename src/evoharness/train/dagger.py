"""DAgger data: the student plays, the scripted teacher labels every state it reaches.

Imitation of teacher traces alone trains on the teacher's state distribution;
the student's first mistake takes it to states it never saw, and its errors
compound over a 50-step episode. DAgger (Ross, Gordon & Bagnell 2011,
"A Reduction of Imitation Learning ... to No-Regret Online Learning", Alg. 3.1)
rolls out the current policy, asks the expert what it would do in each visited
state, and aggregates those labels with the previous data.

The BPE teacher (`policies.teacher.teacher_completion`) decides from the
rendered user message alone, so it can label any state the student reaches.
An example's completion is the teacher's WHOLE completion for that prompt
(``<think>…</think><action>…</action>``, meta-actions included); the action the
episode executes is the student's, or, with probability ``beta`` (the DAgger
mixture pi_i = beta * pi* + (1 - beta) * pi_hat), the teacher's.

Rollouts use the same harness, experience store (frozen: DAgger never writes
to it), prompt budget, constraint and step cap as evaluation, and end loops
early (`run_episodes` stop_repeats). A state visited again within a round is
labelled once.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evoharness.envs.base import Env, TaskSpec
from evoharness.harness.base import Harness, split_completion
from evoharness.policies.base import Completion, Policy, PolicyRequest
from evoharness.policies.teacher import teacher_completion
from evoharness.rollout.episode import EpisodeSpec, run_episodes


def teacher_label(messages: list[dict[str, str]]) -> str:
    """The scripted teacher's whole completion for the state a prompt renders (its last user message).

    Raises:
        ValueError: a prompt without the BPE harness's PLAN view (the teacher reads only those).
    """
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    if "\n\nPLAN:" not in user:
        raise ValueError("the scripted teacher labels BPE-harness prompts only (no PLAN view in the prompt)")
    return teacher_completion(user)


def state_key(messages: list[dict[str, str]]) -> str:
    """A labelled state's identity (one label per distinct prompt): a digest of its messages."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


class DAggerPolicy:
    """Wraps the student: records ``(messages -> teacher completion)`` for every
    request it answers and executes the student's completion (the teacher's
    with probability `beta`, drawn per (episode, turn) from `seed`).

    Attributes:
        examples: the labelled states, in the order they were reached, one per
            distinct prompt (SFT example dicts, `train/sft.py` format, plus
            ``episode_id``, ``turn`` and ``student`` (its completion)).
    """

    def __init__(self, student: Policy, beta: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.student, self.beta, self.seed = student, beta, seed
        self.name = f"dagger({getattr(student, 'name', 'student')})"
        self.examples: list[dict] = []
        self._seen: set[str] = set()
        self.agree = 0  # turns where the student's action equals the teacher's

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        comps = self.student.act(requests)
        out = []
        for req, comp in zip(requests, comps):
            label = teacher_label(req.messages)
            self.agree += split_completion(comp.text)[1].strip() == split_completion(label)[1].strip()
            key = state_key(req.messages)
            if key not in self._seen:
                self._seen.add(key)
                self.examples.append(
                    {
                        "messages": req.messages,
                        "completion": label,
                        "episode_id": req.episode_id,
                        "turn": req.turn,
                        "student": comp.text,
                    }
                )
            if self.beta > 0 and random.Random(f"dagger:{self.seed}:{req.episode_id}:{req.turn}").random() < self.beta:
                comp = Completion(text=label, finish_reason="stop")
            out.append(comp)
        return out

    def close(self) -> None:
        self.student.close()


@dataclass
class DAggerStats:
    """One round: episodes played and won, turns, new labelled states, agreement."""

    played: int = 0
    won: int = 0
    turns: int = 0
    examples: int = 0
    agree: int = 0

    @property
    def agreement(self) -> float:
        """Fraction of turns where the student already did what the teacher says."""
        return self.agree / self.turns if self.turns else 0.0


def dagger_round(
    tasks: list[TaskSpec],
    student: Policy,
    make_harness: Callable[[], Harness],
    make_env: Callable[[TaskSpec], Env],
    out_path: str | Path,
    *,
    beta: float = 0.0,
    seed: int = 0,
    max_steps: int = 50,
    batch_size: int = 32,
    stop_repeats: int = 3,
    episode_prefix: str = "dagger",
) -> DAggerStats:
    """Play `tasks` once each with `student` and write the teacher-labelled states.

    Args:
        tasks: training games (never the development or evaluation games).
        student: the current policy (its greedy/low-temperature decoding, constrained
            as at evaluation).
        make_harness: a fresh harness per episode (sharing a frozen experience store).
        make_env: a fresh environment per episode.
        out_path: SFT examples JSONL, written atomically at the end.
        beta: probability of executing the teacher's action instead of the student's.
        seed: keys the beta draws.
        max_steps: step cap (meta-actions and invalid turns count).
        batch_size: episodes played in lock-step (one decoding batch).
        stop_repeats: end an episode when a (prompt, completion) pair repeats this
            many times (its later states are copies of labelled ones).

    Returns:
        `DAggerStats` of the round.
    """
    from evoharness.rollout.collect import write_jsonl_atomic

    pol = DAggerPolicy(student, beta=beta, seed=seed)
    stats = DAggerStats()
    specs = [EpisodeSpec(t, f"{episode_prefix}:{t.task_id}", seed) for t in tasks]
    for i in range(0, len(specs), batch_size):
        for t in run_episodes(
            specs[i : i + batch_size], make_env, make_harness, pol, max_steps=max_steps, stop_repeats=stop_repeats
        ):
            stats.played += 1
            stats.won += t.won
            stats.turns += len(t.turns)
    stats.examples, stats.agree = len(pol.examples), pol.agree
    write_jsonl_atomic(out_path, pol.examples)
    return stats
