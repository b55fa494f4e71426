"""The student diagnoses under benchmarks/ on real inputs: the pick-two move classifier and the
search-fault counts on real teacher episodes (benchmarks/pick_two_faults.py,
benchmarks/search_faults.py), and the seed-paired comparisons (benchmarks/pair_runs.py,
benchmarks/main_job_seeds.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from engines import pick_engine

from evoharness.config.harness import HarnessConfig
from evoharness.envs.alfworld import make_env
from evoharness.eval.run_report import wasted_steps
from evoharness.harness.base import META_VERBS
from evoharness.harness.factory import make_harness
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from main_job_seeds import summarise  # noqa: E402
from pair_runs import main as pair_runs_main  # noqa: E402
from pick_two_faults import second_search  # noqa: E402
from search_faults import panel_row  # noqa: E402


@pytest.fixture(scope="module")
def pick_two_episodes(valid_seen):
    """The scripted teacher on every valid_seen pick-two game, as ``episodes.jsonl`` records."""
    tasks = [g for g in valid_seen if g.task_type == "pick_two_obj_and_place"]
    played = run_episodes(
        [EpisodeSpec(t, f"{t.task_id}#0") for t in tasks],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(HarnessConfig()),
        TeacherPolicy(),
        max_steps=50,
    )
    return [t.to_dict() for t in played]


def test_the_teacher_agrees_with_itself_after_the_first_put_in_both_cases(pick_two_episodes):
    kinds = []
    for e in pick_two_episodes:
        s = second_search(e)
        assert s is not None and s["student"] == s["teacher"], (e["task_id"], s)
        assert s["student"].split()[0] not in META_VERBS
        kinds.append(s["kind"])
    # half the bundled games list the second object by then ("I saw another X in R"), half search
    assert kinds.count("seen") >= 6 and kinds.count("search") >= 6 and "plan" not in kinds


def test_a_student_move_other_than_the_teachers_is_found_and_a_game_without_a_put_is_none(pick_two_episodes):
    e = next(e for e in pick_two_episodes if second_search(e)["kind"] == "seen")
    s = second_search(e)
    turn = next(
        t
        for t in e["turns"]
        if t["action"] == s["student"]
        and t["turn"] > 0
        and any(p["action"].startswith("put ") for p in e["turns"][: t["turn"]])
    )
    other = next(c for c in turn["admissible_commands"] if c.startswith("go to ") and c != s["teacher"])
    turn["action"] = other  # the student's move; its prompt (and so the teacher's answer) is unchanged
    moved = second_search(e)
    assert moved["student"] == other and moved["teacher"] == s["teacher"] and moved["kind"] == "seen"
    no_put = dict(e, turns=[t for t in e["turns"] if not t["action"].startswith("put ")])
    assert second_search(no_put) is None


def test_search_faults_count_the_teachers_search_turns_and_a_think_that_names_another_receptacle(pick_two_episodes):
    row = panel_row(pick_two_episodes)
    assert row["won"] == row["episodes"] == len(pick_two_episodes)
    assert row["search_turns"] >= len(pick_two_episodes)  # every pick-two game searches at least once
    assert sum(row["fault_turns"].values()) == 0  # the teacher makes its own moves
    e = copy.deepcopy(
        next(
            e
            for e in pick_two_episodes
            if any("the next receptacle to search is" in t["completion"] for t in e["turns"])
        )
    )
    turn = next(t for t in e["turns"] if "the next receptacle to search is" in t["completion"])
    named = turn["completion"].split("the next receptacle to search is ", 1)[1].split(".</think>", 1)[0]
    other = next(c[6:] for c in turn["admissible_commands"] if c.startswith("go to ") and c[6:] != named)
    turn["completion"] = turn["completion"].replace(named, other)  # a copy error from the list
    e["won"] = False
    bad = panel_row([e])
    assert bad["fault_turns"]["think"] == 1 and sum(bad["fault_turns"].values()) == 1
    assert bad["lost_first_fault"] == {e["task_id"].split("/")[0]: f"think (turn {turn['turn']})"}


def test_pair_runs_pools_per_game_wins_and_losses_over_seeds(pick_two_episodes, tmp_path, monkeypatch):
    import json

    def job(name: str, lost: set[int]) -> Path:
        for sub in ("sft", "dev_sft"):
            d = tmp_path / name / "eval" / sub
            d.mkdir(parents=True)
            d.joinpath("episodes.jsonl").write_text(
                "".join(json.dumps(dict(e, won=i not in lost)) + "\n" for i, e in enumerate(pick_two_episodes))
            )
        return tmp_path / name

    pairs = [f"0={job('base0', {0, 1})},{job('new0', {2})}", f"1={job('base1', {3})},{job('new1', set())}"]
    monkeypatch.setattr(sys, "argv", ["pair_runs.py", "--pair", *pairs, "--results", str(tmp_path / "out")])
    pair_runs_main()
    out = json.loads((tmp_path / "out.json").read_text())
    assert [(r["valid_seen"]["wins"], r["valid_seen"]["losses"]) for r in out["seeds"]] == [(2, 1), (1, 0)]
    assert out["pooled"]["dev"] == {"wins": 3, "losses": 1, "p": 0.625}
    monkeypatch.setattr(sys, "argv", ["pair_runs.py", "--pair", pairs[0], "--system", "sft_grpo"])
    with pytest.raises(SystemExit, match="no reported SFT"):
        pair_runs_main()  # these jobs reported no SFT + GRPO model


def test_main_job_seeds_pools_grpo_against_sft_and_lists_every_game_lost_in_some_seed(pick_two_episodes):
    def eps(lost: set[int]) -> list[dict]:
        return [dict(e, won=i not in lost) for i, e in enumerate(pick_two_episodes)]

    jobs = {
        s: {
            "dir": f"seed{s}",
            "minutes": 20.0,
            "episodes": {
                "sft": {"valid_seen": eps(sft), "dev": eps(sft)},
                "sft_grpo": {"valid_seen": eps(rl), "dev": eps(set())},
                "rl_last": {"valid_seen": eps({0, 4, 5}), "dev": eps({5})},
            },
        }
        for s, (sft, rl) in {0: ({0, 1}, {1, 2}), 3: ({4}, set())}.items()
    }
    out = summarise(jobs)
    # the last RL checkpoint, paired before the development games choose: seed 0 +1 / -2, seed 3 +0 / -2
    assert out["rl_last"]["pooled"]["valid_seen"] == {"wins": 1, "losses": 4, "p": 0.375}
    del jobs[3]["episodes"]["rl_last"]
    assert "rl_last" not in summarise(jobs)  # pooled only where every job played it
    assert [(r["valid_seen"]["wins"], r["valid_seen"]["losses"]) for r in out["seeds"]] == [(1, 1), (1, 0)]
    assert out["pooled"]["valid_seen"]["wins"] == 2 and out["pooled"]["dev"]["wins"] == 3
    # the same teacher turns in both systems: equal wasted steps, over the games both won in each seed
    teacher_waste = sum(sum(wasted_steps(e).values()) for e in pick_two_episodes) / len(pick_two_episodes)
    assert out["wasted"][0]["all"] == (teacher_waste, teacher_waste)
    assert [w["both_won_games"] for w in out["wasted"]] == [len(pick_two_episodes) - 3, len(pick_two_episodes) - 1]
    assert out["spread"]["valid_seen"]["sft"] == (len(pick_two_episodes) - 1.5, pytest.approx(0.5**0.5))
    # the cost test: the same episodes in both systems, so no game is cheaper either way
    n = len(pick_two_episodes)
    assert out["cost"]["games"] == {"0": (n - 3) + (n - 2), "3": (n - 1) + (n - 1)}
    assert out["cost"]["pooled"]["steps"]["p"] == 1.0 and out["cost"]["pooled"]["steps"]["fewer"] == 0
    ids = [e["task_id"] for e in pick_two_episodes]
    assert out["lost_games"] == {
        ids[0]: {"0": [False, True]},
        ids[1]: {"0": [False, False]},
        ids[2]: {"0": [True, False]},
        ids[4]: {"3": [False, True]},
    }
