"""The paired cost test: exact sign-flip p-values, and per-game costs of real evaluations."""

import itertools
import random

import pytest

from evoharness.config.eval import EvalConfig
from evoharness.eval.cost import paired_cost, sign_flip_test
from evoharness.eval.evaluate import evaluate
from evoharness.files import read_jsonl


def brute_force(diffs):
    obs = abs(sum(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    return sum(abs(sum(s * abs(d) for s, d in zip(f, diffs, strict=True))) >= obs for f in flips) / len(flips)


def test_sign_flip_test_is_exact():
    rng = random.Random(0)
    for _ in range(40):
        diffs = [rng.randint(-4, 3) for _ in range(rng.randint(1, 11))]
        nz = [d for d in diffs if d]
        assert sign_flip_test(diffs) == pytest.approx(brute_force(nz) if nz else 1.0)
    assert sign_flip_test([-1] * 10) == pytest.approx(2 / 1024)
    assert sign_flip_test([0, 0]) == 1.0 and sign_flip_test([3, -3]) == 1.0


def test_planner_wins_the_teachers_games_in_fewer_steps(tmp_path):
    """On real games the privileged planner (expert) walks straight to its objects; the scripted
    teacher searches and writes notes. Paired on the games both won, the planner is cheaper."""
    runs = {}
    for kind in ("teacher", "expert"):
        cfg = EvalConfig(
            split="valid_seen", limit=12, out_dir=str(tmp_path / kind), policy={"kind": kind}, harness={"kind": "bpe"}
        )
        evaluate(cfg, progress=False)
        runs[kind] = read_jsonl(tmp_path / kind / "episodes.jsonl")
    cost = paired_cost(runs["teacher"], runs["expert"])
    assert cost["both_won"] == 12
    steps = cost["steps"]
    assert steps["b"] < steps["a"] and steps["fewer"] > steps["more"] and steps["p"] < 0.05
    assert cost["harness_calls"]["b"] < cost["harness_calls"]["a"]
