"""The objective parser on every real valid_seen goal (read from the game files' grammar)."""

from __future__ import annotations

import json
import re
from collections import Counter

from evoharness.envs.alfworld.games import TASK_SHORT, discover_games
from evoharness.harness.bpe.goal import parse_goal


def _goal_of(task) -> str:
    grammar = json.loads(open(task.path).read())["grammar"]
    return re.search(r'"Your task is to: (.*?)"', grammar).group(1)


def test_all_valid_seen_goals_parse():
    tasks = discover_games("valid_seen")
    assert len(tasks) == 140
    types = Counter()
    for t in tasks:
        g = parse_goal(_goal_of(t))
        # folder: <task_type>-<Object>-<MovableRecep>-<Target or Light>-<scene>
        _, obj, _, last, _ = t.task_id.split("/")[0].split("-")
        assert g.task_type == t.task_type, (t.task_id, g)
        assert g.obj == obj.lower()
        if g.task_type == "look_at_obj_in_light":
            assert g.light == last.lower() and g.target == "" and g.transform == ""
        else:
            assert g.target == last.lower() and g.light == ""
        assert g.count == (2 if g.task_type == "pick_two_obj_and_place" else 1)
        types[TASK_SHORT[g.task_type]] += 1
    assert types == {"pick": 35, "look": 13, "clean": 27, "heat": 16, "cool": 25, "pick2": 24}


def test_goal_forms_and_fields():
    g = parse_goal("-= Welcome =-\n\nYou are in the middle of a room.\n\nYour task is to: put a clean apple in fridge.")
    assert (g.text, g.obj, g.target, g.transform, g.appliance) == (
        "put a clean apple in fridge.",
        "apple",
        "fridge",
        "clean",
        "sinkbasin",
    )
    g = parse_goal("heat some egg and put it in countertop.")
    assert (g.task_type, g.obj, g.target, g.appliance) == (
        "pick_heat_then_place_in_recep",
        "egg",
        "countertop",
        "microwave",
    )
    assert parse_goal("put a cool mug in coffeemachine.").appliance == "fridge"
    assert parse_goal("cool some pan and put it in stoveburner").transform == "cool"
    g = parse_goal("look at bowl under the desklamp.")
    assert (g.task_type, g.obj, g.light) == ("look_at_obj_in_light", "bowl", "desklamp")
    assert parse_goal("examine the pillow with the desklamp.").keywords() == {"pillow", "desklamp"}
    g = parse_goal("find two pillow and put them in sofa.")
    assert (g.count, g.obj, g.target) == (2, "pillow", "sofa")
    assert parse_goal("put two cd in drawer.").task_type == "pick_two_obj_and_place"
    assert parse_goal("put some soapbottle on cabinet.").task_type == "pick_and_place_simple"
    bad = parse_goal("dance with the fridge")
    assert not bad.parsed and bad.obj == "" and bad.keywords() == set()
