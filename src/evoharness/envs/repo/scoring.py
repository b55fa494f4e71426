"""Partial scoring with a retry budget (QwenGyre §"Partial scoring").

An execution is scored on the work it left behind (e.g. the fraction of hidden
tests that pass on the code written before a timeout), never on elapsed time.
Three outcomes are kept apart, because they mean different things to RL:

- ``scored``: the evaluator ran and returned a reward (a legitimate 0 included:
  the agent's code was evaluated and failed).
- ``placeholder``: there was nothing to evaluate (no artifact at all); the
  reward is 0 and the execution still trains.
- ``dropped``: the *evaluator* failed (a harness/infrastructure fault such as a
  collection crash caused by the harness, or a scorer timeout) on every attempt
  of the budget; the reward is unknown (None) and the execution should be
  excluded from the batch rather than punished with a 0.

An evaluator signals the last two cases by raising `NothingToEvaluate` or
`EvaluationError`; any other exception is a bug in the evaluator and propagates.
Since a dropped execution leaves its batch unpunished, an evaluator must raise
`EvaluationError` only on evidence of its own failure, never for anything the
evaluated code can cause (`envs.repo.scorer` checks an abnormal run against a
control run over an empty workspace).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

ScoreStatus = Literal["scored", "placeholder", "dropped"]


class EvaluationError(Exception):
    """The scorer itself failed (harness or infrastructure fault, not the agent's): retried."""


class NothingToEvaluate(Exception):
    """No evaluable artifact exists: the execution gets the placeholder reward 0."""


@dataclass
class ScoreOutcome:
    """The result of scoring one execution.

    Attributes:
        status: ``scored`` / ``placeholder`` / ``dropped`` (see module docstring).
        reward: the evaluator's reward when scored, 0.0 for a placeholder, None
            when dropped.
        attempts: evaluator calls made (1 .. budget).
        detail: ``errors`` (one message per failed attempt, in order) and, for a
            placeholder, ``reason``.
    """

    status: ScoreStatus
    reward: float | None
    attempts: int
    detail: dict[str, Any] = field(default_factory=dict)


def score_with_retry(evaluate: Callable[[], float], budget: int = 3) -> ScoreOutcome:
    """Call ``evaluate`` until it returns a reward, says there is nothing to
    evaluate, or ``budget`` attempts have raised `EvaluationError`.

    A non-finite reward (NaN, inf) counts as a failed evaluation.

    Args:
        evaluate: returns the reward (a float; for pass-rate scoring in [0, 1]).
        budget: the most attempts (>= 1).

    Returns:
        A `ScoreOutcome`; it never raises for `EvaluationError`/`NothingToEvaluate`.

    Raises:
        ValueError: ``budget`` < 1.
        Exception: whatever else ``evaluate`` raises (a bug, not a scoring fault).
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    errors: list[str] = []
    for attempt in range(1, budget + 1):
        try:
            reward = float(evaluate())
        except NothingToEvaluate as e:
            return ScoreOutcome("placeholder", 0.0, attempt, {"errors": errors, "reason": str(e)})
        except EvaluationError as e:
            errors.append(str(e) or type(e).__name__)
            continue
        if not math.isfinite(reward):
            errors.append(f"non-finite reward {reward}")
            continue
        return ScoreOutcome("scored", reward, attempt, {"errors": errors})
    return ScoreOutcome("dropped", None, budget, {"errors": errors})


def outcome_counts(outcomes: Iterable[ScoreOutcome]) -> dict[str, int]:
    """Metrics for a batch: executions per status and retries spent.

    Returns:
        ``{"score/scored", "score/placeholder", "score/dropped", "score/retries"}``
        where retries = sum of (attempts - 1).
    """
    counts = {"score/scored": 0, "score/placeholder": 0, "score/dropped": 0, "score/retries": 0}
    for o in outcomes:
        counts[f"score/{o.status}"] += 1
        counts["score/retries"] += max(0, o.attempts - 1)
    return counts
