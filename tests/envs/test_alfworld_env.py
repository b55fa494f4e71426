"""The stock-engine environment on real games: wordings, independence, expert."""

from functools import partial

import pytest

from evoharness.envs.alfworld import make_env as _make_env
from evoharness.envs.alfworld.expert import PlannerExpert
from evoharness.envs.alfworld.task_info import load_task_info
from evoharness.envs.alfworld.wording import parse_place

make_env = partial(_make_env, engine="textworld")


def _play_expert(env, max_steps=50):
    result = env.reset()
    expert = PlannerExpert(load_task_info(env.task.path))
    actions = []
    while not result.done and len(actions) < max_steps:
        cmd, _ = expert.next_action(env.facts(), result.admissible_commands)
        assert cmd in result.admissible_commands or cmd == "look"
        actions.append(cmd)
        result = env.step(cmd)
    return result, actions


@pytest.mark.parametrize("wording", ["put", "move"])
def test_both_wordings_solve_the_same_game(one_per_type, wording):
    task = one_per_type[0]  # pick_and_place_simple
    env = make_env(task, wording=wording)
    result, actions = _play_expert(env)
    env.close()
    assert result.won
    place = [a for a in actions if parse_place(a)]
    assert place, actions
    assert all(a.startswith("put " if wording == "put" else "move ") for a in place)
    if wording == "move":
        assert " to " in place[-1] and "in/on" not in place[-1]


def test_reset_exposes_goal_and_commands(one_per_type):
    env = make_env(one_per_type[3])  # heat
    first = env.reset()
    assert first.goal.startswith("heat some ") and first.goal in first.observation
    assert "look" in first.admissible_commands and "inventory" in first.admissible_commands
    assert any(c.startswith("go to ") for c in first.admissible_commands)
    assert not first.won and not first.done
    nothing = env.step("jump around")
    assert nothing.observation == "Nothing happens." and not nothing.won
    env.close()


def test_environments_are_independent(one_per_type):
    """Two live games in one process: stepping one never changes the other
    (the textworld batch-mode trap plays the same game in every slot)."""
    a, b = make_env(one_per_type[0]), make_env(one_per_type[5])
    ra, rb = a.reset(), b.reset()
    assert ra.goal != rb.goal
    go = next(c for c in rb.admissible_commands if c.startswith("go to "))
    before = a.step("look").observation
    b.step(go)
    assert a.step("look").observation == before
    assert a.task.task_id != b.task.task_id
    a.close()
    b.close()
