"""Branches (`EpisodeSpec.prefix`) on real games: the replayed turns reach the state the original
episode was in, the policy is asked only after them, and GRPO never trains them."""

from __future__ import annotations

import pytest
from engines import pick_engine

from evoharness.config.harness import HarnessConfig
from evoharness.config.rl import GRPOConfig
from evoharness.envs.alfworld import make_env
from evoharness.harness.factory import make_harness
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.rollout.records import Trajectory, TurnRecord
from evoharness.train.step import turn_rows


class Counting:
    """The teacher, recording the (episode, turn) of every request it is asked."""

    name = "teacher"

    def __init__(self) -> None:
        self.teacher, self.asked = TeacherPolicy(), []

    def act(self, requests):
        self.asked += [(r.episode_id, r.turn) for r in requests]
        return self.teacher.act(requests)

    def close(self) -> None:
        pass


def play(specs):
    policy = Counting()
    engine = pick_engine(specs[0].task)
    return run_episodes(
        specs, lambda t: make_env(t, engine=engine), lambda: make_harness(HarnessConfig()), policy, max_steps=50
    ), policy.asked


@pytest.mark.parametrize("k", [1, 5])
def test_a_branch_replays_its_prefix_then_the_policy_continues_from_that_state(one_per_type, k):
    task = one_per_type[3]
    (full,), _ = play([EpisodeSpec(task, "full")])
    assert full.won and full.steps > k
    prefix = tuple(t.completion for t in full.turns[:k])
    (branch, other), asked = play([EpisodeSpec(task, "branch", prefix=prefix), EpisodeSpec(task, "other")])
    # the policy was never asked for a replayed turn, and was asked for the plain episode from turn 0
    assert sorted(t for e, t in asked if e == "branch") == list(range(k, branch.steps))
    assert sorted(t for e, t in asked if e == "other") == list(range(other.steps))
    assert branch.info["replayed_turns"] == k
    assert [t.completion for t in branch.turns[:k]] == list(prefix)
    # the same state after the prefix: the deterministic teacher plays on exactly as it did
    assert [(t.action, t.feedback) for t in branch.turns] == [(t.action, t.feedback) for t in full.turns]
    assert [t.messages for t in branch.turns] == [t.messages for t in full.turns]
    assert branch.won and "replayed_turns" not in other.info


def test_a_prefix_that_ends_the_episode_ends_it_before_the_policy_is_asked(one_per_type):
    task = one_per_type[0]
    (full,), _ = play([EpisodeSpec(task, "full")])
    (branch,), asked = play([EpisodeSpec(task, "branch", prefix=tuple(t.completion for t in full.turns))])
    assert branch.won and branch.steps == full.steps and asked == []


def test_grpo_never_draws_a_replayed_turn():
    turns = [
        TurnRecord(
            turn=i,
            messages=[],
            completion="x",
            kind="env",
            action="look",
            feedback="",
            prompt_token_ids=[1, 2],
            completion_token_ids=[3 + i],
            logprobs=[-0.5],
        )
        for i in range(10)
    ]
    traj = Trajectory(
        episode_id="e#0",
        task_id="t",
        task_type="pick_and_place_simple",
        split="train",
        harness="bpe",
        policy="p",
        turns=turns,
        info={"replayed_turns": 6},
    )
    adv = [1.0] * 10
    assert [s.completion_ids[0] for s in turn_rows(traj, adv, GRPOConfig(), step=0)] == [9, 10, 11, 12]
    for sampled, n in ((GRPOConfig(max_train_turns=3), 3), (GRPOConfig(j_max=2), 2)):  # drawn turns / tree paths
        for step in range(8):
            drawn = [s.completion_ids[0] for s in turn_rows(traj, adv, sampled, step=step)]
            assert len(drawn) == n and min(drawn) >= 9
