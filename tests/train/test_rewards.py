"""Trajectory reward (EvoHarness-RL Eq. 5-6) against hand-computed values."""

import math

import pytest

from evoharness.config.rl import RewardConfig
from evoharness.rollout.records import Trajectory, TurnRecord
from evoharness.train.rewards import count_spam, distinct_verbs, diversity_weight, token_penalty, trajectory_reward


def make_traj(turns: list[tuple[str, str]], won: bool, tokens_per_turn: int = 10) -> Trajectory:
    """turns: (kind, action) pairs."""
    recs = [
        TurnRecord(
            turn=i,
            messages=[],
            completion=f"<action>{a}</action>",
            kind=k,
            action=a,
            feedback=f"obs {i}",
            completion_token_ids=list(range(tokens_per_turn)),
            logprobs=[-1.0] * tokens_per_turn,
            completion_tokens=tokens_per_turn,
        )
        for i, (k, a) in enumerate(turns)
    ]
    return Trajectory(
        episode_id="t#0",
        task_id="t",
        task_type="pick_cool_then_place_in_recep",
        split="train",
        harness="bpe",
        policy="test",
        turns=recs,
        won=won,
        stop_reason="won" if won else "max_steps",
        max_steps=70,
    )


ENV_WON = [
    "go to cabinet 1",
    "open cabinet 1",
    "close cabinet 1",
    "go to cabinet 2",
    "open cabinet 2",
    "close cabinet 2",
    "go to countertop 1",
    "examine countertop 1",
    "take apple 1 from countertop 1",
    "go to fridge 1",
    "open fridge 1",
    "cool apple 1 with fridge 1",
    "close fridge 1",
    "go to diningtable 1",
    "look",
    "inventory",
    "move apple 1 to diningtable 1",
]


def won_in_20() -> Trajectory:
    turns = [("env", a) for a in ENV_WON]
    turns.insert(1, ("meta", "track apple"))
    turns.insert(5, ("meta", "recall where is apple"))
    turns.insert(14, ("meta", "commit cool apple: done"))
    assert len(turns) == 20
    return make_traj(turns, won=True)


def failed_with_5_invalid() -> Trajectory:
    turns = [
        ("env", "go to desk 1"),
        ("env", "look"),
        ("env", "look"),  # spam 1 (repeat env)
        ("meta", "track world"),
        ("meta", "track world"),  # spam 2 (meta, no env between)
        ("env", "examine desk 1"),
        ("meta", "note desk is empty"),
        ("env", "examine desk 1"),  # spam 3 (env repeat across a meta)
        ("invalid", "jump around"),
        ("invalid", "fly"),
        ("env", "go to shelf 1"),
        ("invalid", "take book 1"),
        ("env", "go to shelf 2"),
    ]
    cycle = [[f"go to drawer {k}", f"open drawer {k}", f"close drawer {k}"] for k in range(1, 6)]
    env_rest = [a for c in cycle for a in c]
    for i in range(13, 30):
        turns.append(("invalid", "???" if i == 20 else "hello") if i in (20, 25) else ("env", env_rest.pop(0)))
    assert len(turns) == 30 and not env_rest
    return make_traj(turns, won=False)


def test_cosine_schedule():
    cfg = RewardConfig()
    assert diversity_weight(0, cfg) == pytest.approx(0.5)
    assert diversity_weight(75, cfg) == pytest.approx(0.25)
    assert diversity_weight(150, cfg) == pytest.approx(0.0, abs=1e-12)
    assert diversity_weight(400, cfg) == pytest.approx(0.0, abs=1e-12)  # clamped at U


def test_won_in_20_steps_with_3_meta_calls():
    traj = won_in_20()
    assert traj.steps == 20 and sum(traj.meta_calls.values()) == 3
    assert distinct_verbs(traj) == {
        "go",
        "open",
        "close",
        "examine",
        "take",
        "cool",
        "look",
        "inventory",
        "put",
        "track",
        "recall",
        "commit",
    }
    cfg = RewardConfig()
    for u, lam in [(0, 0.5), (75, 0.25), (150, 0.0)]:
        r = trajectory_reward(traj, u, cfg)
        assert r.success == 10.0
        assert r.efficiency == pytest.approx(1 - 20 / 70)
        assert r.r_div == pytest.approx(12 / 20)
        assert r.diversity == pytest.approx(lam * 0.6, abs=1e-12)
        assert r.spam == 0.0 and r.invalid == 0.0 and r.token_penalty == 0.0
        assert r.total == pytest.approx(10 + 50 / 70 + lam * 0.6)
    assert trajectory_reward(traj, 0, cfg).total == pytest.approx(11.0142857, abs=1e-6)


def test_failed_with_5_invalid_and_spam():
    traj = failed_with_5_invalid()
    assert traj.invalid_actions == 5
    assert count_spam(traj) == 3
    # "take" appears only in an invalid turn: no credit.
    assert distinct_verbs(traj) == {"go", "look", "examine", "open", "close", "track", "note"}
    r = trajectory_reward(traj, 0)
    assert r.success == 0.0 and r.efficiency == 0.0
    assert r.diversity == pytest.approx(0.5 * 7 / 30)
    assert r.spam == pytest.approx(-0.3)
    assert r.invalid == pytest.approx(-0.5)
    assert r.total == pytest.approx(0.5 * 7 / 30 - 0.3 - 0.5)
    assert r.total == pytest.approx(-0.6833333, abs=1e-6)
    parts = r.success + r.efficiency + r.diversity + r.spam + r.invalid + r.token_penalty
    assert parts == pytest.approx(r.total)


def test_spam_cap_and_efficiency_floor():
    traj = make_traj([("env", "look")] * 15, won=True)
    r = trajectory_reward(traj, 150)
    assert r.n_spam == 14 and r.spam == pytest.approx(-1.0)  # capped at 10
    long = make_traj([("env", f"go to shelf {i % 7}") for i in range(80)], won=True)
    assert trajectory_reward(long, 0).efficiency == 0.0  # |τ| > T_max


def test_token_budget_extension():
    assert RewardConfig().token_penalty == "none"
    lcpo = RewardConfig(token_penalty="lcpo", token_budget=100, token_alpha=2.0)
    assert token_penalty(80, lcpo) == 0.0
    assert token_penalty(150, lcpo) == pytest.approx(-1.0)
    dapo = RewardConfig(token_penalty="dapo", token_budget=100, token_cache_frac=0.2)
    assert token_penalty(80, dapo) == 0.0
    assert token_penalty(90, dapo) == pytest.approx(-0.5)
    assert token_penalty(120, dapo) == -1.0
    traj = won_in_20()  # 20 turns x 10 tokens = 200
    r = trajectory_reward(traj, 150, RewardConfig(token_penalty="lcpo", token_budget=100))
    assert r.completion_tokens == 200 and r.token_penalty == pytest.approx(-1.0)
    assert r.total == pytest.approx(10 + 50 / 70 - 1.0)
    assert math.isclose(trajectory_reward(traj, 150).token_penalty, 0.0)
