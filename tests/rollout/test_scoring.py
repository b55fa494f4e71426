"""Partial scoring: scored / placeholder / dropped kept apart, retries bounded."""

from __future__ import annotations

import pytest

from evoharness.envs.repo.scoring import (
    EvaluationError,
    NothingToEvaluate,
    ScoreOutcome,
    outcome_counts,
    score_with_retry,
)


class Flaky:
    """Fails with EvaluationError `fails` times, then returns `reward`."""

    def __init__(self, fails: int, reward: float = 0.5) -> None:
        self.fails, self.reward, self.calls = fails, reward, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls <= self.fails:
            raise EvaluationError(f"collection crashed (attempt {self.calls})")
        return self.reward


def test_scored_first_try_keeps_a_legitimate_zero():
    o = score_with_retry(lambda: 0.0)
    assert (o.status, o.reward, o.attempts, o.detail["errors"]) == ("scored", 0.0, 1, [])


def test_retry_then_scored_records_each_failure():
    ev = Flaky(fails=2, reward=0.75)
    o = score_with_retry(ev, budget=3)
    assert (o.status, o.reward, o.attempts, ev.calls) == ("scored", 0.75, 3, 3)
    assert o.detail["errors"] == ["collection crashed (attempt 1)", "collection crashed (attempt 2)"]


def test_budget_exhausted_is_dropped_not_zero():
    ev = Flaky(fails=10)
    o = score_with_retry(ev, budget=2)
    assert (o.status, o.reward, o.attempts, ev.calls) == ("dropped", None, 2, 2)


def test_nothing_to_evaluate_is_placeholder_zero_without_retry():
    calls = []

    def ev():
        calls.append(1)
        raise NothingToEvaluate("empty workspace")

    o = score_with_retry(ev, budget=5)
    assert (o.status, o.reward, o.attempts, len(calls)) == ("placeholder", 0.0, 1, 1)
    assert o.detail["reason"] == "empty workspace"


def test_non_finite_reward_is_a_failed_evaluation():
    o = score_with_retry(lambda: float("nan"), budget=2)
    assert o.status == "dropped" and o.attempts == 2 and "non-finite" in o.detail["errors"][0]


def test_other_exceptions_are_bugs_and_propagate():
    with pytest.raises(ZeroDivisionError):
        score_with_retry(lambda: 1 / 0)
    with pytest.raises(ValueError):
        score_with_retry(lambda: 1.0, budget=0)


def test_outcome_counts():
    outcomes = [
        score_with_retry(lambda: 1.0),
        score_with_retry(Flaky(fails=1)),
        score_with_retry(Flaky(fails=9), budget=3),
        ScoreOutcome("placeholder", 0.0, 1),
    ]
    assert outcome_counts(outcomes) == {
        "score/scored": 2,
        "score/placeholder": 1,
        "score/dropped": 1,
        "score/retries": 1 + 2,
    }
    assert outcome_counts([]) == {"score/scored": 0, "score/placeholder": 0, "score/dropped": 0, "score/retries": 0}
