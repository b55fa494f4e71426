"""RL groups that branch from a recorded state (`config.rl.Branch`): the schedule alternates games and
branches, the policy is first asked at the branch's state, and bad branches are refused."""

from __future__ import annotations

import pytest
from engines import pick_engine
from rl_cells import rl_config

from evoharness.config.rl import Branch
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import ExperienceStore
from evoharness.harness.factory import make_harness
from evoharness.policies.teacher import TeacherPolicy
from evoharness.recipes import alfworld
from evoharness.recipes.alfworld import AlfworldWorkload, branch_starts
from evoharness.recipes.rl import train_rl
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.runtime.record_store import RecordStore


def test_every_other_group_starts_from_the_next_branch(model_dir, tmp_path):
    cfg = rl_config(model_dir, tmp_path)  # 2 games x 2 samples per step
    a, b, c = discover_games("train")[:3]
    branches = [(a, ("x",)), (b, ("y", "z"))]
    be = AlfworldWorkload(cfg, [a, b, c], [2, 0, 1], ExperienceStore(), branches=branches)
    specs = [be.spec(e) for e in range(12)]  # 3 steps x 2 groups x 2 samples
    got = [(s.task.task_id, s.prefix) for s in specs[::2]]  # one per group
    assert got == [
        (c.task_id, ()),
        (a.task_id, ("x",)),
        (a.task_id, ()),
        (b.task_id, ("y", "z")),
        (b.task_id, ()),
        (a.task_id, ("x",)),
    ]
    assert specs[3].episode_id == f"{a.task_id}@1#u0g1"  # a group's samples share the state, not the id
    plain = AlfworldWorkload(cfg, [a, b, c], [2, 0, 1], ExperienceStore())
    assert [plain.spec(e).task.task_id for e in range(0, 12, 2)] == [c.task_id, a.task_id, b.task_id] * 2


@pytest.mark.parametrize("cells", [1, 2])
def test_rl_asks_the_policy_first_at_the_branch_state_for_its_own_turns_only(model_dir, tmp_path, cells):
    """In process and on 2 local cells, through the gateway (whose records show what the policy saw)."""
    cfg = rl_config(model_dir, tmp_path / "rl", steps=1, cells=cells, via_gateway=True)
    cfg.branch_turns = 1
    task = discover_games("train")[0]
    (teacher,) = run_episodes(
        [EpisodeSpec(task, "t")],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(cfg.harness),
        TeacherPolicy(),
        max_steps=8,
    )
    prefix = [t.completion for t in teacher.turns[:2]]
    cfg.games, cfg.branches = [discover_games("train")[1].task_id], [Branch(task_id=task.task_id, prefix=prefix)]
    train_rl(cfg, progress=False)
    records = RecordStore(tmp_path / "rl" / "gateway")
    branch_runs = [e for e in records.executions() if "@2#" in e]
    assert len(branch_runs) == 2  # the branch group's 2 samples
    assert teacher.steps > 3  # no win in the branch's one turn
    for e in branch_runs:
        calls = records.read(e)
        # the first call of a branch sees the state after the replayed turns (rendered as the teacher saw it)
        assert calls[0].messages == teacher.turns[2].messages
        assert len(calls) == 1  # branch_turns: the replayed turns are not the policy's
    games = [e for e in records.executions() if "@" not in e]
    assert len(games) == 2 and all(len(records.read(e)) == cfg.max_steps for e in games)  # the games play on


def test_branches_are_refused_off_the_training_games(model_dir, tmp_path):
    cfg = rl_config(model_dir, tmp_path)
    dev = discover_games("train")[0].task_id
    cfg.exclude_games = [dev]
    cfg.branches = [Branch(task_id=dev, prefix=["<action>look</action>"])]
    with pytest.raises(ValueError, match="not trainable games"):
        branch_starts(cfg)
    cfg.branches = [Branch(task_id="no/such-game", prefix=["<action>look</action>"])]
    with pytest.raises(ValueError, match="no/such-game"):
        branch_starts(cfg)
    with pytest.raises(ValueError):
        Branch(task_id=dev, prefix=[])  # a branch without a prefix is a plain game


@pytest.mark.parametrize("mode", ["both", "positive"])
def test_positive_branch_advantage_zeroes_only_branch_groups_negatives(model_dir, tmp_path, monkeypatch, mode):
    import evoharness.train.step as step

    cfg = rl_config(model_dir, tmp_path / mode, steps=1)  # 1 game group, then 1 branch group, 2 samples each
    cfg.branch_turns, cfg.branch_advantage, cfg.grpo.packing = 1, mode, False
    task, game = discover_games("train")[:2]
    (teacher,) = run_episodes(
        [EpisodeSpec(task, "t")],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(cfg.harness),
        TeacherPolicy(),
        max_steps=4,
    )
    cfg.games = [game.task_id]
    cfg.branches = [Branch(task_id=task.task_id, prefix=[t.completion for t in teacher.turns[:2]])]
    # the estimator's output fixed to -1 / +1 per group, so the test sees what the branch rule does to it
    monkeypatch.setattr(
        step,
        "turn_advantages",
        lambda groups, *a, **k: [[[-1.0 if i == 0 else 1.0] * t.steps for i, t in enumerate(grp)] for grp in groups],
    )
    seen = {}

    def capture(traj, advantages, *a, **kw):
        seen[traj.episode_id] = (traj, list(advantages))
        return []

    monkeypatch.setattr(alfworld, "turn_rows", capture)
    train_rl(cfg, progress=False)
    trajs, adv = zip(*(seen[k] for k in sorted(seen, key=lambda k: ("@" in k, k))))  # the game group first
    assert [t.task_id for t in trajs] == [game.task_id] * 2 + [task.task_id] * 2
    assert adv[0][0] == -1.0 and adv[1][0] == 1.0  # a game group's advantages are the estimator's
    assert adv[2] == [-1.0 if mode == "both" else 0.0] * trajs[2].steps  # the branch sample set below 0
    assert adv[3] == [1.0] * trajs[3].steps
