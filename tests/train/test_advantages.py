"""GRPO group advantages and GiGPO step-level advantages."""

import math

import pytest
import torch

from evoharness.config.rl import AdvantageConfig
from evoharness.rollout.records import Trajectory, TurnRecord
from evoharness.train.advantages import (
    anchor_key,
    discounted_returns,
    grpo_advantages,
    step_advantages,
    turn_advantages,
)


def test_grpo_hand_checked():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    a = grpo_advantages(r, normalize_std=True, eps=0.0)
    s = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert a[0].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    s2 = math.sqrt(2 / 3)  # unbiased std of [3, 1, 2, 2]
    assert a[1].tolist() == pytest.approx([1 / s2, -1 / s2, 0.0, 0.0])
    b = grpo_advantages(r, normalize_std=False)
    assert torch.allclose(b, torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]))
    assert a.sum(dim=1).abs().max() < 1e-6


def test_zero_variance_group_gives_zeros():
    r = torch.tensor([[0.1, 0.1, 0.1], [10.5, 10.5, 10.5], [1.0, 2.0, 3.0]])
    for norm in (True, False):
        a = grpo_advantages(r, normalize_std=norm)
        assert torch.equal(a[:2], torch.zeros(2, 3))
        assert a[2, 0] < 0 < a[2, 2]
    assert torch.equal(grpo_advantages(torch.tensor([[5.0]])), torch.zeros(1, 1))  # G = 1


def test_discounted_returns():
    assert discounted_returns([0, 0, 10], 0.5) == pytest.approx([2.5, 5.0, 10.0])
    assert discounted_returns([], 0.9) == []


def test_step_advantages_singletons_zero():
    adv = step_advantages([[1.0, 2.0], [3.0]], [["a", "b"], ["a"]], normalize_std=False)
    assert adv == [[-1.0, 0.0], [1.0]]


ROOM = "You are in the middle of a room."
ADM0 = ["go to fridge 1", "go to desk 1", "look", "inventory"]
AT_FRIDGE = "You arrive at fridge 1. The fridge 1 is closed."
ADM_FRIDGE = ["open fridge 1", "go to desk 1", "look", "inventory"]


def traj(name: str, steps: list[tuple[str, str, list[str]]], won: bool) -> Trajectory:
    """steps: (action, feedback, admissible commands shown at that turn)."""
    turns = [
        TurnRecord(turn=i, messages=[], completion="", kind="env", action=a, feedback=f, admissible_commands=adm)
        for i, (a, f, adm) in enumerate(steps)
    ]
    return Trajectory(
        episode_id=f"task#{name}",
        task_id="task",
        task_type="pick_cool",
        split="train",
        harness="react",
        policy="test",
        initial_observation=ROOM,
        turns=turns,
        won=won,
    )


def test_gigpo_favours_action_with_higher_return_from_shared_anchor():
    a = traj(
        "A",
        [
            ("go to fridge 1", AT_FRIDGE, ADM0),
            ("open fridge 1", "You open the fridge 1.", ADM_FRIDGE),
            ("take apple 1 from fridge 1", "You pick up the apple 1.", ["take apple 1 from fridge 1"]),
        ],
        True,
    )
    c = traj(
        "C",
        [
            ("go to fridge 1", AT_FRIDGE, ADM0),
            ("look", "You are facing the fridge 1.", ADM_FRIDGE),
            ("open fridge 1", "You open the fridge 1.", ADM_FRIDGE),
            ("take apple 1 from fridge 1", "You pick up the apple 1.", ["take apple 1 from fridge 1"]),
        ],
        True,
    )
    b = traj(
        "B",
        [
            ("go to desk 1", "You arrive at desk 1.", ADM0),
            ("look", "You are facing desk 1.", ["look"]),
            ("inventory", "You are not carrying anything.", ["look"]),
        ],
        False,
    )
    # anchors: turn 0 of all three (same room, same admissible set); turn 1 of A and C (same fridge state).
    assert anchor_key(a, 0) == anchor_key(b, 0) == anchor_key(c, 0)
    assert anchor_key(a, 1) == anchor_key(c, 1) != anchor_key(b, 1)
    rewards = torch.tensor([[10.0 + (1 - 3 / 70), 10.0 + (1 - 4 / 70), 0.0]])
    g = 0.95
    cfg = AdvantageConfig(estimator="gigpo", normalize_std=False, gigpo_gamma=g, gigpo_omega=1.0)
    adv = turn_advantages([[a, c, b]], rewards, cfg)[0]
    ep = grpo_advantages(rewards, normalize_std=False)[0].tolist()

    ra, rc = rewards[0, 0].item(), rewards[0, 1].item()
    ret0 = [g**2 * ra, g**3 * rc, 0.0]  # returns from the room, per trajectory
    m0 = sum(ret0) / 3
    assert adv[0][0] == pytest.approx(ep[0] + ret0[0] - m0, rel=1e-5)
    assert adv[1][0] == pytest.approx(ep[1] + ret0[1] - m0, rel=1e-5)
    assert adv[2][0] == pytest.approx(ep[2] + ret0[2] - m0, rel=1e-5)
    # at the fridge: "open" (A, return γ·R_A) beats "look" (C, return γ²·R_C).
    m1 = (g * ra + g**2 * rc) / 2
    assert adv[0][1] == pytest.approx(ep[0] + g * ra - m1, rel=1e-5)
    assert adv[1][1] == pytest.approx(ep[1] + g**2 * rc - m1, rel=1e-5)
    assert adv[0][1] - ep[0] > 0 > adv[1][1] - ep[1]
    assert adv[0][0] - ep[0] > 0 > adv[2][0] - ep[2]
    # the opened fridge is reached by A at turn 2 and by C at turn 3: an anchor across times.
    assert adv[0][2] == pytest.approx(ep[0] + (ra - rc) / 2, rel=1e-5)
    assert adv[1][3] == pytest.approx(ep[1] + (rc - ra) / 2, rel=1e-5)
    # singleton anchors (C's "look" result, B after the desk): episode advantage only.
    assert adv[1][2] == pytest.approx(ep[1]) and adv[2][1] == pytest.approx(ep[2])

    grpo = turn_advantages([[a, c, b]], rewards, AdvantageConfig(normalize_std=False))[0]
    assert grpo == [[ep[0]] * 3, [ep[1]] * 4, [ep[2]] * 3]
    no_step = turn_advantages([[a, c, b]], rewards, cfg.model_copy(update={"gigpo_omega": 0.0}))[0]
    assert no_step == grpo


def _play(task, policy, n, max_steps=20):
    from evoharness.envs.alfworld import make_env
    from evoharness.harness.bpe import BPEHarness, ExperienceStore
    from evoharness.rollout.episode import EpisodeSpec, run_episodes

    return run_episodes(
        [EpisodeSpec(task, f"{task.task_id}#{policy.name}{k}", k) for k in range(n)],
        make_env=lambda t: make_env(t, engine="fast"),
        make_harness=lambda: BPEHarness(ExperienceStore()),
        policy=policy,
        max_steps=max_steps,
    )


def test_std_floor_keeps_shaping_noise_small_on_real_rollouts():
    """Issue 10 fault 9: real ALFWorld groups scored by the paper's reward. An all-failure group
    (random policy) differs only by shaping terms; the paper's rule blows those up to the size of
    success vs failure, the floor keeps them small; a group with a success is unchanged."""
    from evoharness.config.rl import RewardConfig
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.policies.scripted import ExpertPolicy, RandomPolicy
    from evoharness.train.advantages import std_floor_active
    from evoharness.train.rewards import trajectory_reward

    task = discover_games("valid_seen")[0]
    fails = _play(task, RandomPolicy(seed=1), 4)
    wins = _play(task, ExpertPolicy(), 1)
    assert not any(t.won for t in fails) and wins[0].won
    rc = RewardConfig(t_max=20)
    all_fail = [trajectory_reward(t, 0, rc).total for t in fails]
    mixed = [trajectory_reward(t, 0, rc).total for t in wins + fails[:3]]
    r = torch.tensor([all_fail, mixed])
    assert 0 < float(r[0].std()) < 0.5 and float(r[1].std()) > 4

    paper = grpo_advantages(r, std_floor=0.0)
    floored = grpo_advantages(r, std_floor=AdvantageConfig().std_floor)
    assert AdvantageConfig().std_floor == 1.0
    # paper's rule: shaping noise scaled to unit std, as large as the win's advantage in the mixed group
    assert float(paper[0].abs().max()) > 0.5 * float(paper[1].abs().max())
    # floor: raw differences (std < 1 so divided by 1), an order smaller than the success signal
    assert torch.allclose(floored[0], r[0] - r[0].mean(), atol=1e-5)
    assert float(floored[0].abs().max()) < 0.1 * float(floored[1].abs().max())
    assert torch.allclose(floored[1], paper[1])
    assert std_floor_active(r, AdvantageConfig()).tolist() == [True, False]
    assert std_floor_active(r, AdvantageConfig(std_floor=0.0)).tolist() == [False, False]


def test_gigpo_step_floor_is_scaled_like_the_discounted_returns():
    """Issue 10 fault 9 with GiGPO (review): step returns are γ^k R(τ), so a success late in a
    long episode has a small absolute return at the shared first state. The floor is in reward
    units and scales by γ^k: that step group keeps the paper's normalisation (an unscaled floor
    of 1.0 shrank it), while an all-failure group is still floored to small advantages."""
    from evoharness.config.rl import RewardConfig
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.policies.scripted import NoisyExpertPolicy, RandomPolicy
    from evoharness.train.rewards import trajectory_reward

    task = discover_games("valid_seen")[0]
    late_win = _play(task, NoisyExpertPolicy(epsilon=0.8, seed=2), 1, max_steps=50)
    fails = _play(task, RandomPolicy(seed=1), 6, max_steps=50)
    assert late_win[0].won and late_win[0].steps >= 25 and not any(t.won for t in fails)
    rc = RewardConfig(t_max=50)
    mixed, all_fail = late_win + fails[:5], fails  # groups of 6
    r = torch.tensor([[trajectory_reward(t, 0, rc).total for t in grp] for grp in (mixed, all_fail)])

    paper_cfg = AdvantageConfig(estimator="gigpo", std_floor=0.0)
    cfg = AdvantageConfig(estimator="gigpo")  # default floor 1.0
    stats: dict[str, int] = {}
    paper = turn_advantages([mixed, all_fail], r, paper_cfg)
    floored = turn_advantages([mixed, all_fail], r, cfg, stats=stats)
    # the first state is one anchor for all 6 trajectories; its step group holds the success
    assert len({anchor_key(t, 0) for t in mixed}) == 1
    ret0 = torch.tensor([[0.95 ** (t.steps - 1) * float(r[0, i]) for i, t in enumerate(mixed)]])
    assert float(ret0.std()) < cfg.std_floor  # an unscaled floor would act here
    for i in range(len(mixed)):
        assert floored[0][i][0] == pytest.approx(paper[0][i][0], rel=1e-5)
    assert paper[0][0][0] - paper[0][1][0] > 2.0  # the late success still stands out from the first state
    # all-failure group: the paper's rule blows shaping noise up, the floor keeps it small
    big = max(abs(a) for tr in paper[1] for a in tr)
    small = max(abs(a) for tr in floored[1] for a in tr)
    assert big > 1.0 and small < 0.2  # raw shaping differences: episode part + step part, each < 0.1
    assert 0 < stats["step_floor_groups"] < stats["step_groups"]


class _HangsAtStep:
    """A real ALFWorld env whose `n`-th step raises (an environment fault, not the agent's)."""

    def __init__(self, env, n: int) -> None:
        self._env, self._n, self.task = env, n, env.task

    def reset(self):
        return self._env.reset()

    def step(self, action):
        self._n -= 1
        if self._n == 0:
            raise TimeoutError("environment step hung")
        return self._env.step(action)

    def facts(self):
        return self._env.facts()

    def close(self) -> None:
        self._env.close()


def test_episodes_ended_by_an_environment_error_take_no_part_in_the_baseline():
    """Review of fault 8's kind: a game that fails to load, or a step that hangs, ends its episode
    with stop_reason "error". Its reward (about 0) measures the infrastructure; counted as a
    failure it pushed every valid member of the group up. It is left out of the group's mean and
    std, gets advantage 0, and none of its turns is trained."""
    from evoharness.config.rl import GRPOConfig, RewardConfig
    from evoharness.envs.alfworld import make_env
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.harness.bpe import BPEHarness, ExperienceStore
    from evoharness.policies.scripted import ExpertPolicy, RandomPolicy
    from evoharness.rollout.episode import EpisodeSpec, run_episodes
    from evoharness.train.advantages import std_floor_active, valid_members
    from evoharness.train.rewards import trajectory_reward
    from evoharness.train.step import turn_rows

    task = discover_games("valid_seen")[0]
    win = _play(task, ExpertPolicy(), 1)[0]
    fail = _play(task, RandomPolicy(seed=1), 1)[0]

    def broken(t):
        raise FileNotFoundError("game file vanished")

    unloaded = run_episodes(
        [EpisodeSpec(task, f"{task.task_id}#load", 0)],
        broken,
        lambda: BPEHarness(ExperienceStore()),
        ExpertPolicy(),
        max_steps=20,
    )[0]
    hung = run_episodes(
        [EpisodeSpec(task, f"{task.task_id}#hung", 0)],
        lambda t: _HangsAtStep(make_env(t, engine="fast"), 2),
        lambda: BPEHarness(ExperienceStore()),
        ExpertPolicy(),
        max_steps=20,
    )[0]
    assert win.won and not fail.won and unloaded.stop_reason == hung.stop_reason == "error" and hung.turns
    groups = [[win, unloaded, fail, hung]]
    assert valid_members(groups).tolist() == [[True, False, True, False]]
    rc = RewardConfig(t_max=20)
    r = torch.tensor([[trajectory_reward(t, 0, rc).total for t in groups[0]]])
    valid_only = grpo_advantages(r[:, [0, 2]], std_floor=1.0)[0].tolist()
    for cfg in (AdvantageConfig(), AdvantageConfig(estimator="gigpo")):
        adv = turn_advantages(groups, r, cfg)[0]
        assert adv[1] == [] and adv[3] == [0.0] * hung.steps
        if cfg.estimator == "grpo":
            assert adv[0] == pytest.approx([valid_only[0]] * win.steps) and adv[2] == pytest.approx(
                [valid_only[1]] * fail.steps
            )
    # the old baseline counted both errors as failures: the win's advantage was inflated
    old = grpo_advantages(r, std_floor=1.0)[0].tolist()
    assert old[0] > valid_only[0] + 0.5 and old[2] > valid_only[1] + 0.1
    assert std_floor_active(r, AdvantageConfig(), valid_members(groups)).tolist() == [False]
    flat = [a for tr in turn_advantages(groups, r)[0] for a in tr]
    for t in groups[0]:
        for turn in t.turns:  # scripted policies record no token ids: give the turns some to train
            turn.prompt_token_ids, turn.completion_token_ids, turn.logprobs = [1, 2], [3], [-0.5]
    sizes = [t.steps for t in groups[0]]
    per_traj = [flat[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(4)]
    samples = [s for t, a in zip(groups[0], per_traj) for s in turn_rows(t, a, GRPOConfig(), step=0, group=0)]
    assert {s.episode_id for s in samples} == {win.episode_id, fail.episode_id}
    # the step's scoring of the group (`train.step.score_group`) is the same: errors invalid, left out
    from evoharness.train.step import group_metrics, score_group

    cfg = GRPOConfig(reward=rc)
    score = score_group(groups[0], 0, cfg)
    assert score.valid == [True, False, True, False] and score.has_signal
    assert score.rewards == pytest.approx(r[0].tolist())
    assert score.advantages == turn_advantages(groups, r, cfg.advantage)[0]
    assert group_metrics([score], cfg)["rollout/env_errors"] == 2
