"""Counterfactual observations on real teacher traces: minimal pairs, relabelled by the teacher."""

from __future__ import annotations

import random
import re

import pytest

from evoharness.policies.teacher import current_subgoal, location, parse_prompt
from experiments.counterfactual.counterfactual import add_counterfactuals, counterfactual, join_items, split_items

LIST_RE = re.compile(r"you see (.*)\.$")


@pytest.fixture(scope="module")
def examples(teacher_examples):
    return teacher_examples


def user(ex: dict) -> str:
    return ex["messages"][-1]["content"]


def test_object_lists_round_trip_on_every_real_observation(examples):
    lists = [m.group(1) for ex in examples if (m := LIST_RE.search(parse_prompt(user(ex)).observation))]
    assert len(lists) > 20 and "nothing" in lists
    for listing in lists:
        items = split_items(listing)
        assert items is not None and join_items(items) == listing


def test_twins_differ_only_in_what_the_agent_sees_and_flip_the_teachers_label(examples):
    out = add_counterfactuals(examples, 1.0, seed=0)
    assert out[: len(examples)] == examples
    twins = out[len(examples) :]
    # the teacher tracks the goal object while it searches, and a live TRACK RESULT that shows it
    # in view cannot be edited back to "not seen yet": removals are rare, insertions common
    kinds = [t["counterfactual"] for t in twins]
    assert kinds.count("inserted") > 10
    for twin in twins:
        orig = next(e for e in examples if e["episode_id"] == twin["episode_id"] and e["turn"] == twin["turn"])
        assert twin["messages"][0] == orig["messages"][0]
        a, b = parse_prompt(user(orig)), parse_prompt(user(twin))
        goal = a.goal.obj
        seen_a, seen_b = (split_items(LIST_RE.search(v.observation).group(1)) for v in (a, b))
        # objective, plan, hints and every earlier step are the original's
        assert (b.goal, b.plan, b.hints, b.recall) == (a.goal, a.plan, a.hints, a.recall)
        if a.track and a.track[0] == goal:  # live: the inserted goal object is in view in TRACK RESULT too
            assert twin["counterfactual"] == "inserted" and a.track[1].startswith(f"{goal}: not seen yet")
            unsearched = a.track[1].split(". ", 1)[1]  # the belief's rendering (test_track_result_is_live)
            new = [i for i in seen_b if i not in seen_a][0]
            assert b.track == (goal, f"{new}: in/on {location(a)}, in view\n{unsearched}")
        else:
            assert b.track == a.track
        assert [x for x, _ in b.history] == [x for x, _ in a.history] and b.history[:-1] == a.history[:-1]
        assert b.history[-1][1] == b.observation  # the last feedback is the edited observation too
        others = [c for c in a.admissible if not re.search(rf"\b{goal} \d+\b", c)]
        assert [c for c in b.admissible if not re.search(rf"\b{goal} \d+\b", c)] == others
        took = re.search(rf"<action>take ({goal} \d+) from ", twin["completion"])
        if twin["counterfactual"] == "removed":
            assert re.search(rf"<action>take {goal} \d+ from ", orig["completion"])
            assert [i for i in seen_a if not i.startswith(goal + " ")] == seen_b and took is None
        else:
            assert orig["completion"].startswith(f"<think>No {goal} here")
            new = [i for i in seen_b if i not in seen_a]
            assert len(new) == 1 and new[0].startswith(goal + " ") and took and took.group(1) == new[0]
            assert f"take {new[0]} from" in " ".join(b.admissible)
            assert twin["completion"].startswith(f"<think>There is a {new[0]} here")


def test_steps_that_are_not_goal_searches_have_no_twin(examples):
    rng = random.Random(0)
    searches = 0
    for ex in examples:
        view = parse_prompt(user(ex))
        action = re.search(r"<action>(.*)</action>", ex["completion"]).group(1)
        if not current_subgoal(view).startswith("find ") or not action.startswith(("take ", "go to ")):
            assert counterfactual(ex, rng) is None, ex["completion"]
        else:
            searches += 1
    assert searches > 20


def test_rate_draws_a_seeded_subset_and_is_validated(examples):
    assert add_counterfactuals(examples, 0.0) == examples
    half = add_counterfactuals(examples, 0.5, seed=3)
    assert half == add_counterfactuals(examples, 0.5, seed=3)
    assert len(examples) < len(half) < len(add_counterfactuals(examples, 1.0, seed=3))
    with pytest.raises(ValueError, match="rate"):
        add_counterfactuals(examples, 1.5)
