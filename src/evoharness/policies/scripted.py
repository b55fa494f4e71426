"""Scripted policies: the privileged planner expert, a noisy expert, a random policy.

All randomness is drawn from ``Random(f"{seed}:{episode_id}:{turn}")``, so an
episode plays the same whatever the batch, worker or order it runs in.
"""

from __future__ import annotations

import random

from evoharness.envs.alfworld.expert import PlannerExpert
from evoharness.envs.alfworld.task_info import load_task_info
from evoharness.models.tokenizer import estimate_tokens
from evoharness.policies.base import Completion, PolicyRequest, format_action


def _rng(seed: int, req: PolicyRequest) -> random.Random:
    return random.Random(f"{seed}:{req.episode_id}:{req.turn}")


def _completion(req: PolicyRequest, action: str, think: str) -> Completion:
    text = format_action(action, think)
    prompt = sum(estimate_tokens(m["content"]) for m in req.messages)
    return Completion(text=text, prompt_tokens=prompt, completion_tokens=estimate_tokens(text))


class ExpertPolicy:
    """Privileged planner expert (reads the PDDL state of ``request.env``).

    Raises:
        ValueError: a request without a live environment exposing ``facts()``.
    """

    name = "expert"
    privileged = True

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, req: PolicyRequest) -> Completion:
        if req.env is None or not hasattr(req.env, "facts"):
            raise ValueError("the expert policy needs the live environment (privileged)")
        expert = PlannerExpert(load_task_info(req.env.task.path))
        cmd, why = expert.next_action(req.env.facts(), req.admissible_commands)
        return _completion(req, cmd, why)

    def close(self) -> None:
        pass


class NoisyExpertPolicy(ExpertPolicy):
    """The expert, except that with probability `epsilon` it takes a random admissible command."""

    def __init__(self, epsilon: float = 0.2, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = epsilon
        self.seed = seed
        self.name = f"noisy_expert(eps={epsilon})"

    def _one(self, req: PolicyRequest) -> Completion:
        rng = _rng(self.seed, req)
        if req.admissible_commands and rng.random() < self.epsilon:
            return _completion(req, rng.choice(req.admissible_commands), "explore")
        return super()._one(req)


class RandomPolicy:
    """Uniformly random admissible command."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        out = []
        for req in requests:
            cmds = req.admissible_commands or ["look"]
            out.append(_completion(req, _rng(self.seed, req).choice(cmds), ""))
        return out

    def close(self) -> None:
        pass
