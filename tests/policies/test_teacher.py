"""The scripted BPE teacher on real games: solves them, acts only on the rendered prompt."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from engines import pick_engine

from evoharness.config.harness import HarnessConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import TASK_TYPES
from evoharness.harness.base import META_VERBS
from evoharness.harness.bpe.belief import type_of
from evoharness.harness.factory import make_harness
from evoharness.harness.react import ReActHarness
from evoharness.policies.base import Completion, PolicyRequest, format_action
from evoharness.policies.teacher import TeacherPolicy, parse_prompt, plan_for, teacher_completion
from evoharness.rollout.episode import EpisodeSpec, run_episodes

FORMAT = re.compile(r"^<think>[^<]+</think><action>[^<]+</action>$")


class Blindfolded:
    """Hands the teacher only the messages: no environment, no harness object."""

    name = "teacher"

    def __init__(self) -> None:
        self.teacher = TeacherPolicy()

    def act(self, requests):
        return self.teacher.act(
            [PolicyRequest(r.messages, r.episode_id, r.turn, r.admissible_commands) for r in requests]
        )

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def played(valid_seen):
    """The teacher on the first 2 valid_seen games of each type, cap 50."""
    tasks = [t for tt in TASK_TYPES for t in [g for g in valid_seen if g.task_type == tt][:2]]
    engine = pick_engine(tasks[0])
    specs = [EpisodeSpec(t, f"{t.task_id}#0") for t in tasks]
    return run_episodes(
        specs, lambda t: make_env(t, engine=engine), lambda: make_harness(HarnessConfig()), Blindfolded(), max_steps=50
    )


def test_teacher_solves_two_games_of_each_type_within_50_steps(played):
    failed = [(t.task_id, t.stop_reason, t.error) for t in played if not t.won]
    assert not failed
    assert all(t.steps <= 50 and t.invalid_actions == 0 for t in played)
    assert Counter(t.task_type for t in played) == {tt: 2 for tt in TASK_TYPES}


def test_teacher_uses_every_meta_action_and_commits_its_plan_first(played):
    verbs = Counter()
    for t in played:
        verbs.update(t.meta_calls)
        assert t.turns[0].action.startswith("commit plan: ")
    assert set(verbs) == set(META_VERBS)
    share = sum(verbs.values()) / sum(t.steps for t in played)
    assert 0.1 < share < 0.5


def test_every_completion_is_a_function_of_the_user_message_alone(played):
    for t in played:
        for turn in t.turns:
            assert FORMAT.match(turn.completion), turn.completion
            user = turn.messages[-1]["content"]
            assert teacher_completion(user) == turn.completion
            # the same text handed over in a fresh request, without env or harness
            again = TeacherPolicy().act([PolicyRequest([{"role": "user", "content": user}], "x", 0, [])])[0]
            assert again.text == turn.completion and again.error is None


def test_prompt_parser_reads_the_bpe_views(played):
    t = next(t for t in played if t.task_type == "pick_two_obj_and_place")
    # the turn after the recall that opens "find second X": the live ``track X`` of the first search
    turn = next(i for i, turn in enumerate(t.turns) if turn.action == "recall mistakes: pick two") + 1
    v = parse_prompt(t.turns[turn].messages[-1]["content"])
    assert v.goal.count == 2 and v.plan and [s for s, _ in v.plan] == plan_for(v.goal)
    assert [s for s, status in v.plan if status == "active"] == [f"find second {v.goal.obj}"]
    first = next(
        x.action[len("take ") :].split(" from ")[0] for x in t.turns if x.action.startswith(f"take {v.goal.obj} ")
    )
    assert v.track and v.track[0] == v.goal.obj
    assert v.track[1].startswith(f"{first}: in/on {v.goal.target} ") and "\nUnsearched (" in v.track[1]
    assert v.recall and v.recall[0] == "mistakes: pick two"
    assert v.history[-1][0] == "recall mistakes: pick two"
    assert v.admissible == t.turns[turn].admissible_commands


class Clumsy:
    """The student's commonest failure (runs/main's SFT evaluation): once per episode, while
    searching, it takes an object that is not the goal's and commits the find subgoal done;
    the teacher plays every other turn."""

    name = "clumsy"

    def __init__(self) -> None:
        self.erred: dict[str, str] = {}

    def act(self, requests):
        out = []
        for r in requests:
            user = r.messages[-1]["content"]
            v, text = parse_prompt(user), teacher_completion(user)
            items = [s for s, status in v.plan]
            phase = next((i for i, (_, status) in enumerate(v.plan) if status != "done"), -1)
            stage = self.erred.get(r.episode_id)
            wrong = [
                c for c in v.admissible if c.startswith("take ") and type_of(c[5:].split(" from ")[0]) != v.goal.obj
            ]
            if stage is None and wrong and phase >= 0 and items[phase].startswith("find"):
                text, self.erred[r.episode_id] = format_action(wrong[0], "I take it."), "took"
            elif stage == "took" and 0 <= phase < len(items) - 1:
                text = format_action(f"commit {items[phase]}: done; {items[phase + 1]}: active", "Found it.")
                self.erred[r.episode_id] = "committed"
            out.append(Completion(text=text))
        return out

    def close(self) -> None:
        pass


def test_teacher_labels_recover_from_a_wrong_object_and_a_premature_commit(valid_seen):
    """DAgger labels come from the teacher on the student's states: holding a non-goal object
    with its find subgoal marked done, the teacher puts the object down, reopens the search
    and still wins."""
    tasks = [t for tt in TASK_TYPES for t in [g for g in valid_seen if g.task_type == tt][:2]]
    engine, clumsy = pick_engine(tasks[0]), Clumsy()
    eps = run_episodes(
        [EpisodeSpec(t, f"{t.task_id}#0") for t in tasks],
        lambda t: make_env(t, engine=engine),
        lambda: make_harness(HarnessConfig()),
        clumsy,
        max_steps=50,
    )
    assert sum(s == "committed" for s in clumsy.erred.values()) >= 10  # the mistake was made
    assert [e.task_id for e in eps if not e.won] == []
    for e in eps:
        if clumsy.erred.get(e.episode_id) != "committed":
            continue
        i = next(i for i, t in enumerate(e.turns) if t.action.startswith("take "))
        wrong = e.turns[i].action.split(" from ")[0][len("take ") :]
        after = [t.action for t in e.turns[i + 2 :]]
        assert any(a.startswith(f"put {wrong} in/on ") for a in after), (e.task_id, after[:6])
        assert any(a.startswith("commit find") and a.endswith(": active") for a in after), (e.task_id, after[:6])


def test_teacher_refuses_a_prompt_without_bpe_views(valid_seen):
    h = ReActHarness()
    h.reset(valid_seen[0], _first(valid_seen[0]))
    out = TeacherPolicy().act([PolicyRequest(h.messages(), "e", 0, h.admissible)])[0]
    assert out.error and "BPE" in out.error and out.text == ""


def _first(task):
    env = make_env(task, engine=pick_engine(task))
    try:
        return env.reset()
    finally:
        env.close()


def test_the_teacher_searches_in_the_order_the_harness_lists(played):
    """Every search move goes to the first unsearched receptacle TRACK RESULT lists that is
    not the objective's target type (pick tasks), which the view's last line restates, so a
    student copies one fixed phrase."""
    moves = 0
    for t in played:
        for turn in t.turns:
            if "the next receptacle to search is" not in turn.completion:
                continue
            v = parse_prompt(turn.messages[-1]["content"])
            listed = v.track[1].split("Unsearched (", 1)[1].split("): ", 1)[1].split("\n", 1)[0].rstrip(".").split(", ")
            skip = v.goal.target if v.goal.target and not v.goal.transform else None
            first = next(r for r in listed if type_of(r) != skip)
            assert turn.action.endswith(f" {first}"), (t.task_id, turn.action, listed)
            # the view restates the list's head, which is the move unless it is the target's type
            assert v.track[1].endswith(f"\nNext to search: {listed[0]}."), v.track[1]
            assert first == listed[0] or type_of(listed[0]) == skip
            moves += 1
    assert moves > 20


def test_a_receptacle_at_the_agents_location_is_opened_where_the_agent_stands(valid_seen):
    """SoapBottle-417: cabinet 3 and cabinet 4 share loc 11, so standing at cabinet 3 there is no
    ``go to cabinet 4``: the teacher's search names cabinet 4 and opens it there (the co-located
    fault class of benchmarks/search_faults.py)."""
    game = next(g for g in valid_seen if g.task_id.startswith("pick_and_place_simple-SoapBottle-None-CounterTop-417/"))
    [t] = run_episodes(
        [EpisodeSpec(game, "soap#0")],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(HarnessConfig()),
        Blindfolded(),
        max_steps=50,
    )
    assert t.won
    i = next(i for i, turn in enumerate(t.turns) if turn.action == "open cabinet 4")
    turn = t.turns[i]
    assert "go to cabinet 4" not in turn.admissible_commands and t.turns[i - 1].action == "open cabinet 3"
    listed = (
        parse_prompt(turn.messages[-1]["content"]).track[1].split("): ", 1)[1].split("\n", 1)[0].rstrip(".").split(", ")
    )
    assert listed[0] == "cabinet 4"
    assert "the next receptacle to search is cabinet 4.</think>" in turn.completion


def test_the_teacher_tracks_the_lamp_also_when_it_stands_next_to_it(valid_seen):
    """Bowl and desklamp both on desk 1: after taking the bowl and committing, the teacher still
    does ``track desklamp``, and uses the lamp on the turn whose TRACK RESULT says it is in view,
    the same two turns a student reads in every look game."""
    task = next(g for g in valid_seen if g.task_id.startswith("look_at_obj_in_light-Bowl-None-DeskLamp-316/"))
    [traj] = run_episodes(
        [EpisodeSpec(task, f"{task.task_id}#0")],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(HarnessConfig()),
        Blindfolded(),
        max_steps=50,
    )
    assert traj.won
    actions = [turn.action for turn in traj.turns]
    use = actions.index("use desklamp 1")
    assert actions[use - 1] == "track desklamp" and actions[use - 2].startswith("commit ")
    take = max(i for i, a in enumerate(actions[:use]) if a.startswith("take bowl"))
    assert all(a.split()[0] in META_VERBS for a in actions[take + 1 : use])  # no step away from desk 1
    assert "desklamp 1: in/on desk 1, in view" in parse_prompt(traj.turns[use].messages[-1]["content"]).track[1]
