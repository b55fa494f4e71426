"""Belief B_t on real ALFWorld games (stock TextWorld engine, both wordings)."""

from __future__ import annotations

import pytest

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe.belief import AGENT, Belief

HEAT_GAME = "pick_heat_then_place_in_recep-Apple-None-DiningTable-26/trial_T20190907_060234_011675"
CLEAN_GAME = "pick_clean_then_place_in_recep-SoapBar-None-Toilet-410/trial_T20190906_201106_979461"
LOOK_GAME = "look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790"


@pytest.fixture(scope="module")
def games():
    return {t.task_id: t for t in discover_games("valid_seen")}


class Walk:
    """A real game plus a belief fed with every step; commands must be admissible."""

    def __init__(self, task, wording="native"):
        self.env = make_env(task, wording=wording)
        self.first = self.env.reset()
        self.belief = Belief(focus={"apple", "soapbar", "alarmclock", "desklamp"})
        self.belief.observe_scene(self.first.observation)
        self.last = self.first

    def inreceptacle(self):
        """(object, receptacle) pairs from the privileged PDDL facts (test scripting only)."""
        return [args for p, args in self.env.facts() if p == "inreceptacle"]

    def where(self, obj):
        return dict(self.inreceptacle())[obj]

    def do(self, cmd):
        assert cmd in self.last.admissible_commands, (cmd, self.last.admissible_commands)
        self.last = self.env.step(cmd)
        self.events = self.belief.update(cmd, self.last.observation)
        return self.last.observation


def test_heat_walk_locations_open_states_holding_hot(games):
    w = Walk(games[HEAT_GAME])
    assert "fridge 1" in w.belief.receptacles and "cabinet 10" in w.belief.receptacles
    assert w.belief.receptacles.index("cabinet 2") < w.belief.receptacles.index("cabinet 10")  # natural order
    apple_at = w.where("apple 1")

    w.do("go to fridge 1")  # "You arrive at loc N. The fridge 1 is closed."
    assert w.belief.at == "fridge 1"
    assert w.belief.is_open("fridge 1") is False and w.belief.search_status("fridge 1") == "visited"
    assert "fridge 1" in w.belief.unsearched()
    w.do("open fridge 1")
    inside = [o for o, r in w.inreceptacle() if r == "fridge 1"]
    assert w.belief.is_open("fridge 1") is True and w.belief.search_status("fridge 1") == "searched"
    assert sorted(w.belief.contents("fridge 1")) == sorted(inside)
    assert "fridge 1" not in w.belief.unsearched()
    w.do("close fridge 1")
    assert w.belief.is_open("fridge 1") is False
    assert w.belief.location_of(inside[0]) == "fridge 1"  # closing does not forget contents

    w.do("go to drawer 1")
    w.do("open drawer 1")  # an empty drawer in this game
    assert w.belief.search_status("drawer 1") == "empty"

    w.do(f"go to {apple_at}")
    assert w.belief.location_of("apple 1") == apple_at
    w.do(f"take apple 1 from {apple_at}")
    assert w.events.picked == ("apple 1", apple_at)
    assert w.belief.holding == ["apple 1"] and w.belief.location_of("apple 1") == AGENT
    assert "apple 1" not in w.belief.contents(apple_at)
    w.do("inventory")
    assert w.belief.holding == ["apple 1"]

    w.do("go to microwave 1")
    w.do("heat apple 1 with microwave 1")
    assert w.belief.states("apple 1") == ["hot"]
    w.do("examine apple 1")  # "This is a hot apple 1."
    assert w.belief.states("apple 1") == ["hot"]
    assert "apple 1: held by you; hot" == w.belief.track("apple 1")

    w.do("go to diningtable 1")
    w.do("put apple 1 in/on diningtable 1")
    assert w.last.won
    assert w.belief.holding == [] and w.belief.location_of("apple 1") == "diningtable 1"
    assert w.events.placed == ("apple 1", "diningtable 1")
    w.do("inventory")
    assert w.belief.holding == []
    w.env.close()

    world = w.belief.track("world")
    assert world.startswith("at: diningtable 1; holding: nothing")
    assert "states: apple 1 hot" in world and "empty: drawer 1" in world and "unsearched (" in world
    assert "apple 1: in/on diningtable 1, in view, placed by you; hot" in w.belief.track("apple")  # by type
    assert w.belief.track("the apples").startswith("apple 1:")
    assert "closed" in w.belief.track("fridge 1") and "contains" in w.belief.track("fridge 1")
    assert "not seen yet" in w.belief.track("kettle")
    assert len(w.belief) <= 48


def test_clean_walk_and_failed_commands(games):
    w = Walk(games[CLEAN_GAME])
    soap, rec = next((o, r) for o, r in w.inreceptacle() if o.startswith("soapbar"))
    obs = w.do(f"go to {rec}")
    if w.belief.is_open(rec) is False:
        w.do(f"open {rec}")
    assert w.belief.location_of(soap) == rec
    before = [(e.subject, e.relation, e.value) for e in w.belief.edges]
    w.last = w.env.step("take soapbar 99 from toilet 9")  # not admissible: the engine says "Nothing happens."
    assert w.last.observation.startswith("Nothing happens")
    w.belief.update("take soapbar 99 from toilet 9", w.last.observation)
    assert [(e.subject, e.relation, e.value) for e in w.belief.edges] == before
    w.do(f"take {soap} from {rec}")
    sink = next(c[len("go to ") :] for c in w.last.admissible_commands if c.startswith("go to sinkbasin"))
    w.do(f"go to {sink}")
    w.do(f"clean {soap} with {sink}")
    assert "clean" in w.belief.states(soap)
    w.do(f"examine {soap}")  # "This is a clean soapbar N."
    assert w.belief.states(soap) == ["clean"]
    assert obs  # the arrival observation was non-empty
    w.env.close()


def test_move_wording_look_game_lamp_on(games):
    w = Walk(games[LOOK_GAME], wording="move")
    lamp_at = w.where("desklamp 1")
    clock, clock_at = next((o, r) for o, r in w.inreceptacle() if o.startswith("alarmclock") and r != lamp_at)
    w.do(f"go to {clock_at}")
    w.do(f"take {clock} from {clock_at}")
    assert w.belief.holding == [clock]
    w.do(f"go to {lamp_at}")
    w.do(f"move {clock} to {lamp_at}")  # "You move the alarmclock 3 to the desk 1."
    assert w.events.placed == (clock, lamp_at)
    assert w.belief.holding == [] and w.belief.location_of(clock) == lamp_at
    w.do(f"take {clock} from {lamp_at}")
    w.do("use desklamp 1")  # "You turn on the desklamp 1."
    assert w.belief.states("desklamp 1") == ["on"]
    assert w.last.won
    w.env.close()


def test_describe_marks_objects_at_hand_and_placed_by_the_agent(games):
    """An object on the receptacle the agent stands at is "in view" also after an action whose
    feedback lists nothing (a take), and stops being so when the agent leaves or the receptacle
    is closed: the line a student reads to use the desklamp next to it. An object the agent put
    somewhere says "placed by you" until it is picked up again (pick-two's first object)."""
    w = Walk(games[LOOK_GAME])
    facts = sorted(w.inreceptacle())  # the engine's fact order varies between processes
    lamp_at = w.where("desklamp 1")
    w.do(f"go to {lamp_at}")
    assert w.belief.describe("desklamp 1") == f"desklamp 1: in/on {lamp_at}, in view"
    other = next(o for o, r in facts if r == lamp_at and o != "desklamp 1")
    w.do(f"take {other} from {lamp_at}")  # "You pick up the X from the desk 1.": lists no contents
    assert w.belief.in_view == set() and w.belief.describe("desklamp 1").endswith(", in view")
    assert w.belief.describe(other) == f"{other}: held by you"
    w.do(f"put {other} in/on {lamp_at}")
    assert w.belief.describe(other) == f"{other}: in/on {lamp_at}, in view, placed by you"
    w.do(f"take {other} from {lamp_at}")
    assert w.belief.describe(other) == f"{other}: held by you"  # picked up: no longer "placed"
    w.do(f"put {other} in/on {lamp_at}")
    drawer = next(r for o, r in facts if r.startswith("drawer") and r != lamp_at)
    w.do(f"go to {drawer}")
    assert w.belief.describe("desklamp 1") == f"desklamp 1: in/on {lamp_at}"
    assert w.belief.describe(other) == f"{other}: in/on {lamp_at}, placed by you"
    w.do(f"open {drawer}")
    inside = w.belief.contents(drawer)
    assert inside and all(w.belief.describe(o).endswith(", in view") for o in inside)
    w.do(f"close {drawer}")
    assert all(not w.belief.describe(o).endswith("in view") for o in inside)
    w.env.close()


def test_capacity_48_evicts_distractors_oldest_first():
    b = Belief(focus={"apple"})
    b.observe_scene("Looking quickly around you, you see a shelf 1, a shelf 2, and a fridge 1.\n\nYour task is to: x.")
    b.update("go to shelf 1", "You arrive at loc 3. On the shelf 1, you see a apple 1, and a vase 1.")
    b.update("take apple 1 from shelf 1", "You pick up the apple 1 from the shelf 1.")
    for i in range(2, 30):  # 28 receptacles x (3 objects + search edge) = 112 edges offered
        b.update(
            f"go to shelf {i}", f"You arrive at loc {i}. On the shelf {i}, you see a cd {i}, a pen {i}, and a book {i}."
        )
    assert len(b) == 48
    assert b.holding == ["apple 1"] and b.at == "shelf 29"  # agent edges kept
    assert b.location_of("cd 29") == "shelf 29"  # newest distractors kept
    assert b.location_of("cd 2") is None  # oldest distractors evicted first
    assert b.search_status("shelf 2") == "searched"  # receptacle edges outrank distractor locations
    assert b.location_of("vase 1") is None


def test_contents_contradiction_and_receptacle_object():
    b = Belief()
    b.update("go to countertop 1", "You arrive at loc 1. On the countertop 1, you see a apple 1, and a mug 1.")
    b.update("look", "You are facing the countertop 1. Next to it, you see nothing.")
    b.update("examine countertop 1", "On the countertop 1, you see a mug 1.")
    assert b.location_of("apple 1") is None and b.location_of("mug 1") == "countertop 1"
    b.update("examine mug 1", "This is a normal mug 1. In it, you see a spoon 1.")
    assert b.location_of("spoon 1") == "mug 1"
    b.update("examine apple 2", "This is a hot and clean apple 2.")
    assert b.states("apple 2") == ["clean", "hot"]
    b.update("cool apple 2 with fridge 1", "You cool the apple 2 using the fridge 1.")
    assert b.states("apple 2") == ["clean", "cold"]  # cooling clears hot


def test_go_back_points_to_a_seen_instance_only_when_none_is_held_placed_there_or_at_hand(games):
    """Pick-two, AlarmClock-305: all three alarm clocks lie on desk 1. While the agent stands at
    the desk (in view) or holds one, no receptacle is named; once the first is put in the dresser
    and the agent has left the desk, `go_back` names desk 1 and TRACK RESULT's last line says so
    instead of the next receptacle to search. Alarm clocks in a dresser (where one was placed) do
    not count: the agent is not sent back to take the first one out again."""
    task = next(
        t for t in games.values() if t.task_id.startswith("pick_two_obj_and_place-AlarmClock-None-Dresser-305/")
    )
    w = Walk(task)
    clocks = sorted(o for o, r in w.inreceptacle() if o.startswith("alarmclock"))
    assert {w.where(c) for c in clocks} == {"desk 1"}
    assert w.belief.go_back(w.belief.instances("alarmclock")) is None  # none seen yet
    w.do("go to desk 1")
    assert w.belief.go_back(w.belief.instances("alarmclock")) is None  # in view: take one here
    w.do(f"take {clocks[0]} from desk 1")
    assert w.belief.go_back(w.belief.instances("alarmclock")) is None  # one in hand: carry it
    assert "\nNext to search: " in w.belief.track("alarmclock")
    w.do("go to dresser 1")
    w.do(f"put {clocks[0]} in/on dresser 1")
    assert w.belief.go_back(w.belief.instances("alarmclock")) == (clocks[1], "desk 1")
    w.do("examine dresser 1")  # the placed one listed in view does not keep the agent here
    assert clocks[0] in w.belief.in_view
    assert w.belief.go_back(w.belief.instances("alarmclock")) == (clocks[1], "desk 1")
    text = w.belief.track("alarmclock")
    assert text.endswith(f"\nGo back to: desk 1 ({clocks[1]} is there).") and "Next to search" not in text
    w.do("go to desk 1")
    assert w.belief.go_back(w.belief.instances("alarmclock")) is None  # back at the desk: take it
    w.do(f"take {clocks[1]} from desk 1")
    w.do(f"put {clocks[1]} in/on desk 1")  # put down elsewhere, picked up from there: not "placed" in a dresser
    w.do(f"take {clocks[1]} from desk 1")
    w.do("go to dresser 1")
    w.do(f"put {clocks[1]} in/on dresser 1")  # both placed in the dresser; the third still on the desk
    assert w.belief.go_back(w.belief.instances("alarmclock")) == (clocks[2], "desk 1")
    w.env.close()
