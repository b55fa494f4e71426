"""BPEHarness: meta-action parsing, the rendered prompt, experience wiring — on a real game."""

from __future__ import annotations

import re

import pytest

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.envs.base import StepResult, TaskSpec
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.harness.bpe.harness import SYSTEM_PROMPT
from evoharness.policies.base import format_action

LOOK_GAME = "look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790"
SECTIONS = [
    "OBJECTIVE",
    "OBSERVATION",
    "ADMISSIBLE COMMANDS",
    "PREVIOUS ACTIONS",
    "PLAN",
    "RECALLED HINTS",
    "TRACK RESULT",
    "RECALL RESULT",
]


def turn(h, env, action):
    """One turn as the episode runner plays it; returns (kind, feedback)."""
    p = h.parse(format_action(action, "thinking"))
    if p.kind == "env":
        r = env.step(p.command)
        h.after_env_step(p, r)
        return p.kind, r
    if p.kind == "meta":
        return p.kind, h.run_meta(p)
    h.after_invalid(p)
    return p.kind, p.error


def headers(user: str) -> list[str]:
    return re.findall(r"^([A-Z][A-Z ]+):", user, re.M)


@pytest.fixture
def fake():
    task = TaskSpec("t", "pick_and_place_simple", "valid_seen", "")
    first = StepResult(
        "You are in the middle of a room. Looking quickly around you, you see a fridge 1, and a countertop 1.\n\n"
        "Your task is to: put some apple on countertop.",
        ["go to fridge 1", "go to countertop 1", "look", "inventory"],
        goal="put some apple on countertop.",
    )
    h = BPEHarness(ExperienceStore())
    h.reset(task, first)
    return h


def test_meta_action_parsing_edge_cases(fake):
    h = fake
    p = h.parse("<think>where am I</think><action>track</action>")
    assert (p.kind, p.command, p.argument) == ("meta", "track", "world")
    assert h.run_meta(p).startswith("at: start; holding: nothing")
    p = h.parse("<action>TRACK [apple]</action>")
    assert (p.kind, p.argument) == ("meta", "apple")
    for verb in ("commit", "recall", "note", "commit []"):
        p = h.parse(f"<action>{verb}</action>")
        assert p.kind == "invalid" and "needs an argument" in p.error, verb
    p = h.parse("<action>commit [find apple]: done</action>")
    assert p.kind == "meta"
    assert h.run_meta(p) == "Added 'find apple' (done)."  # inner brackets stripped too
    assert h.progress.to_list() == [("find apple", "done")]
    assert h.run_meta(h.parse("<action>commit find apple: sideways</action>")).startswith("Error")
    assert h.parse("<action>go to fridge 1</action>").kind == "env"
    assert h.parse("<action>look</action>").kind == "env"  # an admissible command wins over any meta verb
    p = h.parse("<action>jump around</action>")
    assert p.kind == "invalid"
    h.after_invalid(p)
    assert h.history[-1] == ("jump around", f"Invalid action: {p.error}")
    assert h.turn == 4  # every turn (meta, invalid) was counted by the harness's own clock


def test_prompt_layout_and_views(fake):
    h = fake
    msgs = h.messages()
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == SYSTEM_PROMPT
    for word in ("track", "commit", "recall", "note", "<think>", "<action>"):
        assert word in SYSTEM_PROMPT
    user = msgs[1]["content"]
    assert headers(user) == SECTIONS[:6]  # no track/recall result yet
    assert "OBJECTIVE: put some apple on countertop." in user
    assert "ADMISSIBLE COMMANDS: go to fridge 1, go to countertop 1, look, inventory" in user
    assert "PREVIOUS ACTIONS:\n(none)" in user
    assert "- apple: look in countertop (found 2x)" in h.views()["RECALLED HINTS"]
    assert list(h.views()) == ["PLAN", "RECALLED HINTS"]
    h.run_meta(h.parse("<action>track apple</action>"))
    h.run_meta(h.parse("<action>recall how to heat</action>"))
    views = h.views()
    assert list(views) == ["PLAN", "RECALLED HINTS", "TRACK RESULT", "RECALL RESULT"]
    assert views["TRACK RESULT"].startswith("(track apple, live)\napple: not seen yet")
    assert views["RECALL RESULT"].startswith("(recall how to heat, last step)\n[how-to-do]")
    user = h.messages()[1]["content"]
    assert headers(user) == SECTIONS
    for name, text in views.items():
        assert f"{name}:\n{text}" in user


def test_track_result_is_live(fake):
    """TRACK RESULT answers the latest track query from this turn's belief: the tracked object
    turns "in view" the step the agent sees it and stays located (no longer in view) after; the
    receptacles still unsearched follow (where a second one may be), likeliest first: the
    objective's target (countertop) last, since a pick task never starts the apple there. Once the
    agent has walked away from the apple, the last line sends it back there instead of searching on."""
    h = fake
    h.run_meta(h.parse("<action>track apple</action>"))
    assert h.views()["TRACK RESULT"] == (
        "(track apple, live)\napple: not seen yet. Unsearched (2): fridge 1, countertop 1.\nNext to search: fridge 1."
    )
    go = h.parse("<action>go to countertop 1</action>")
    h.after_env_step(
        go,
        StepResult(
            "You arrive at loc 3. On the countertop 1, you see a apple 1, and a mug 2.",
            ["take apple 1 from countertop 1", "take mug 2 from countertop 1", "go to fridge 1"],
        ),
    )
    assert h.views()["TRACK RESULT"] == (
        "(track apple, live)\napple 1: in/on countertop 1, in view\nUnsearched (1): fridge 1.\n"
        "Next to search: fridge 1."
    )
    h.run_meta(h.parse("<action>commit find apple: active</action>"))  # a meta-action changes nothing seen
    assert "\napple 1: in/on countertop 1, in view\n" in h.views()["TRACK RESULT"]
    h.after_env_step(
        h.parse("<action>go to fridge 1</action>"),
        StepResult("You arrive at loc 1. The fridge 1 is closed.", ["open fridge 1", "go to countertop 1"]),
    )
    assert (
        h.views()["TRACK RESULT"] == "(track apple, live)\napple 1: in/on countertop 1\nUnsearched (1): fridge 1.\n"
        "Go back to: countertop 1 (apple 1 is there)."
    )


def test_no_experience_store():
    h = BPEHarness(None)
    h.reset(
        TaskSpec("t", "x", "s", ""),
        StepResult("Your task is to: put a mug in cabinet.", ["look"], goal="put a mug in cabinet."),
    )
    assert h.views()["RECALLED HINTS"] == "(no experience store)"
    assert h.run_meta(h.parse("<action>recall where: mug</action>")) == "No experience store in this run."
    assert "note ignored" in h.run_meta(h.parse("<action>note mugs hide in cabinets</action>"))


def test_real_game_episode_move_wording():
    task = next(t for t in discover_games("valid_seen") if t.task_id == LOOK_GAME)
    env = make_env(task, wording="move")
    store = ExperienceStore()
    store.freeze()
    h = BPEHarness(store, history_window=3)
    first = env.reset()
    h.reset(task, first)
    assert h.goal.obj == "alarmclock" and h.goal.light == "desklamp" and h.goal.text == first.goal
    assert [e.recep for e in h.hints] == ["desk", "shelf"]
    facts = [a for p, a in env.facts() if p == "inreceptacle"]  # privileged: only to script the test
    lamp_at = dict(facts)["desklamp 1"]
    clock, clock_at = next((o, r) for o, r in facts if o.startswith("alarmclock") and r != lamp_at)

    assert turn(h, env, "commit plan: find alarmclock; take it to the desklamp; use the desklamp")[0] == "meta"
    assert turn(h, env, f"go to {clock_at}")[0] == "env"
    arrival = h.messages()[1]["content"]
    assert f"On the {clock_at}, you see" in arrival.split("OBSERVATION: ", 1)[1].split("\n\n", 1)[0]
    assert turn(h, env, f"take {clock} from {clock_at}")[0] == "env"
    assert turn(h, env, "commit 1: done")[1] == "'find alarmclock' -> done."
    kind, text = turn(h, env, "track alarmclock")
    assert kind == "meta" and f"{clock}: held by you" in text
    kind, text = turn(h, env, "recall where: alarmclock")
    assert kind == "meta" and text.startswith("[where-to-find] alarmclock\n- alarmclock: look in desk")
    assert turn(h, env, "note alarmclocks are often on the sidetable")[1].startswith("Noted")
    assert turn(h, env, "fly to the moon")[0] == "invalid"
    # meta and invalid actions leave OBSERVATION at the last environment observation
    user = h.messages()[1]["content"]
    assert f"OBSERVATION: You pick up the {clock} from the {clock_at}." in user
    prev = user.split("PREVIOUS ACTIONS:\n", 1)[1].split("\n\nPLAN:", 1)[0]
    assert prev.splitlines()[0] == "> recall where: alarmclock" and "(see RECALL RESULT)" in prev  # window of 3
    assert prev.splitlines()[-1].startswith("Invalid action: 'fly to the moon' is not an admissible command")
    assert "1. [x] find alarmclock (done)" in user and "2. [ ] take it to the desklamp (pending)" in user
    assert headers(user) == SECTIONS

    assert turn(h, env, f"go to {lamp_at}")[0] == "env"
    _, r = turn(h, env, "use desklamp 1")
    assert r.won and h.belief.states("desklamp 1") == ["on"]
    env.close()
    # frozen store: the pickup and the note are buffered, nothing learnt yet
    kinds = sorted(p.kind for p in store.pending if p.kind != "use")
    assert kinds == ["note", "pickup"]
    pickup = next(p for p in store.pending if p.kind == "pickup")
    assert (pickup.obj, pickup.recep) == ("alarmclock", clock_at.rsplit(" ", 1)[0])
    ops = store.consolidate()
    assert store.find_location("alarmclock", "sidetable") is not None
    assert {o.op for o in ops} >= {"ADD", "UPDATE"}
