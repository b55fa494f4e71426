"""The student diagnoses under benchmarks/ on real inputs: the pick-two move classifier and the
search-fault counts on real teacher episodes (benchmarks/pick_two_faults.py,
benchmarks/search_faults.py), and the seed-paired comparisons (benchmarks/pair_runs.py,
benchmarks/main_job_seeds.py: per seed, pooled, the unseen-room panel's headroom test and gaps, and
the seeds' declaration)."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
from panels import teacher_episodes

from evoharness.eval.run_report import gap_interval, sign_test, wasted_steps
from evoharness.harness.base import META_VERBS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import main_job_seeds  # noqa: E402
from go_back_faults import episode_faults, go_back_receptacles  # noqa: E402
from main_job_seeds import summarise  # noqa: E402
from pair_runs import main as pair_runs_main  # noqa: E402
from pick_two_faults import second_search  # noqa: E402
from search_faults import _UNSEARCHED, panel_row, think_slip  # noqa: E402


@pytest.fixture(scope="module")
def pick_two_episodes(valid_seen):
    """The scripted teacher on every valid_seen pick-two game, as ``episodes.jsonl`` records."""
    return teacher_episodes([g for g in valid_seen if g.task_type == "pick_two_obj_and_place"])


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
    e = copy.deepcopy(next(e for e in pick_two_episodes if second_search(e)["kind"] == "seen"))
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


def test_go_back_faults_find_none_in_the_teachers_games_and_one_where_a_move_walks_past_a_seen_object(
    pick_two_episodes,
):
    """The teacher follows every rendered "Go back to" line (the text rule agrees with the line, and
    every go-back state's world move goes there); a game whose move in such a state is swapped for
    another receptacle has a fault, and the rule reads nothing while the object is held or in view."""
    states = 0
    for e in pick_two_episodes:
        n, right, mismatched, fault = episode_faults(e)
        assert (right, mismatched, fault) == (n, 0, False), e["task_id"]
        states += n
    assert states >= 6  # half the bundled games see the second object before the first is placed
    e = copy.deepcopy(next(e for e in pick_two_episodes if episode_faults(e)[0]))
    turn = next(t for t in e["turns"] if t["kind"] == "env" and go_back_receptacles(t["views"]["TRACK RESULT"]))
    back = go_back_receptacles(turn["views"]["TRACK RESULT"])[0]
    turn["action"] = next(c for c in turn["admissible_commands"] if c.startswith("go to ") and not c.endswith(back))
    assert episode_faults(e)[3] is True
    held = turn["views"]["TRACK RESULT"].replace(f"in/on {back}", "held by you", 1)
    assert go_back_receptacles(held) == []


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
    assert sum(bad["think_slips"].values()) == 1
    assert sum(c["turns"] for c in bad["by_instance"].values()) == bad["search_turns"]
    assert bad["by_instance"]["4+" if int(named.rsplit(" ", 1)[1]) >= 4 else "1-3"]["think"] == 1


def test_a_think_fault_is_filed_by_where_the_named_receptacle_stands_in_the_unsearched_list(pick_two_episodes):
    turns = [t for e in pick_two_episodes for t in e["turns"] if "the next receptacle to search is" in t["completion"]]
    # a search turn whose TRACK RESULT lists at least two unsearched receptacles
    turn, listed = next(
        (t, names)
        for t in turns
        if (m := _UNSEARCHED.search(t["messages"][-1]["content"])) and len(names := m.group(1).split(", ")) > 1
    )
    first, kind = listed[0], listed[0].rsplit(" ", 1)[0]
    assert think_slip(turn, listed[-1], first) == "later"
    assert think_slip(turn, f"{kind} 99", first) == "same type"
    assert think_slip(turn, "cart 42" if kind != "cart" else "safe 42", first) == "unlisted"


def test_pair_runs_pools_per_game_wins_and_losses_over_seeds(pick_two_episodes, tmp_path, monkeypatch):
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


def test_pair_runs_pairs_two_seed_studies_kept_jobs_on_the_seeds_both_hold_with_the_unseen_room_panel(
    pick_two_episodes, tmp_path, monkeypatch
):
    unseen = [dict(e, task_id=f"unseen/{i}") for i, e in enumerate(pick_two_episodes[:10])]  # other games

    def keep(study: str, seed: int, lost: set[int], lost_unseen: set[int]) -> None:
        eps = {
            "valid_seen": [dict(e, won=i not in lost) for i, e in enumerate(pick_two_episodes)],
            "dev": [dict(e, won=True) for e in pick_two_episodes],
            "unseen": [dict(e, won=i not in lost_unseen) for i, e in enumerate(unseen)],
        }
        job = {"dir": "gone", "seed": seed, "episodes": {"sft": eps}, "minutes": 1.0, "cpu": "x"}
        main_job_seeds.keep_job(job, tmp_path / f"{study}.jobs" / f"seed{seed}.json.gz")

    keep("base", 0, {0}, {0})  # seed 0 only in the base study: not paired
    keep("base", 1, {0, 1}, {0, 1, 2})
    keep("new", 1, {2}, {0})
    keep("new", 2, set(), set())
    studies = [str(tmp_path / "base"), str(tmp_path / "new")]
    monkeypatch.setattr(sys, "argv", ["pair_runs.py", "--studies", *studies, "--results", str(tmp_path / "out")])
    pair_runs_main()
    out = json.loads((tmp_path / "out.json").read_text())
    assert [r["seed"] for r in out["seeds"]] == [1] and out["panels"] == ["valid_seen", "dev", "unseen"]
    assert out["pooled"]["valid_seen"] == {"wins": 2, "losses": 1, "p": sign_test(2, 1)}
    assert out["pooled"]["unseen"] == {"wins": 2, "losses": 0, "p": sign_test(2, 0)}
    n = len(pick_two_episodes)
    assert out["rooms"]["new"]["unseen"] == pytest.approx(90.0)
    assert out["rooms"]["base"]["gap"] == pytest.approx(100 * (n - 2) / n - 70.0)
    md = (tmp_path / "out.md").read_text()
    assert "| base unseen | new unseen |" in md and "unseen rooms 90.00%" in md
    # a kept job mixed with a job directory that never played the unseen-room panel: two panels
    old = tmp_path / "old"
    for sub in ("sft", "dev_sft"):
        (old / "eval" / sub).mkdir(parents=True)
        (old / "eval" / sub / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in pick_two_episodes))
    pair = f"1={old},{tmp_path / 'new.jobs' / 'seed1.json.gz'}"
    monkeypatch.setattr(sys, "argv", ["pair_runs.py", "--pair", pair, "--results", str(tmp_path / "mixed")])
    pair_runs_main()
    mixed = json.loads((tmp_path / "mixed.json").read_text())
    assert mixed["panels"] == ["valid_seen", "dev"] and "rooms" not in mixed
    assert mixed["pooled"]["valid_seen"] == {"wins": 0, "losses": 1, "p": 1.0}
    monkeypatch.setattr(sys, "argv", ["pair_runs.py", "--studies", studies[0], str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="no seed kept in both"):
        pair_runs_main()


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
    # jobs without the unseen-room panel: the two-panel summary
    assert out["panels"] == ["valid_seen", "dev"] and list(out["pooled"]) == ["valid_seen", "dev"]
    assert "unseen" not in out["seeds"][0] and "headroom" not in out and "rooms" not in out
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


def _main_job(root: Path, seed: int, lost: dict[str, set[int]], seen: list[dict], unseen: list[dict] = ()) -> Path:
    """A finished main job's files as `main_job_seeds.read_job` reads them; `lost`: the indices of the
    episodes each evaluation directory lost (``sft``, ``dev_sft``, ``unseen_sft``, ...; SFT + GRPO is
    reported from ``rl_step4``, as `systems.json` says), of `unseen` in ``unseen_*``, else of `seen`."""
    out = root / f"seed{seed}"
    for sub, gone in lost.items():
        eps = unseen if sub.startswith("unseen_") else seen
        (out / "eval" / sub).mkdir(parents=True)
        (out / "eval" / sub / "episodes.jsonl").write_text(
            "".join(json.dumps(dict(e, won=i not in gone)) + "\n" for i, e in enumerate(eps))
        )
    (out / "systems.json").write_text(json.dumps({"sft": "sft", "sft_grpo": "rl_step4"}))
    (out / "run_config.json").write_text(json.dumps({"seed": seed}))
    (out / ".sft.done").write_text("90")
    return out


def _run_main_job_seeds(monkeypatch, *args: str) -> None:
    def no_job(*a):  # a test never runs a real main job
        raise AssertionError(f"main_job_seeds ran a job: {a}")

    monkeypatch.setattr(main_job_seeds, "run_seed", no_job)
    monkeypatch.setattr(sys, "argv", ["main_job_seeds.py", *args])
    main_job_seeds.main()


def test_main_job_seeds_reads_the_unseen_room_panel_pools_the_headroom_test_and_reports_the_gaps(
    pick_two_episodes, tmp_path, monkeypatch
):
    n = len(pick_two_episodes)
    unseen = [dict(e, task_id=f"unseen/{i}") for i, e in enumerate(pick_two_episodes[:10])]  # other games
    lost = {  # seed: (valid_seen and dev: SFT, SFT + GRPO), (unseen rooms: SFT, SFT + GRPO)
        0: (({0, 1}, {1, 2}), ({0, 1, 2}, {0})),
        3: (({4}, set()), ({5, 6, 7}, set())),
    }
    runs = [
        f"{seed}="
        + str(
            _main_job(
                tmp_path,
                seed,
                {
                    "sft": sft,
                    "dev_sft": sft,
                    "rl_step4": rl,
                    "dev_rl_step4": rl,
                    "unseen_sft": us,
                    "unseen_rl_step4": ur,
                },
                pick_two_episodes,
                unseen,
            )
        )
        for seed, ((sft, rl), (us, ur)) in lost.items()
    ]
    _run_main_job_seeds(monkeypatch, "--run", *runs, "--results", str(tmp_path / "out"))  # --run seeds: declared
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["panels"] == ["valid_seen", "dev", "unseen"]
    per_seed = [{k: r["unseen"][k] for k in ("games", "sft", "sft_grpo", "wins", "losses")} for r in out["seeds"]]
    assert per_seed == [
        {"games": 10, "sft": 7, "sft_grpo": 9, "wins": 2, "losses": 0},
        {"games": 10, "sft": 7, "sft_grpo": 10, "wins": 3, "losses": 0},
    ]
    assert out["pooled"]["unseen"] == {"wins": 5, "losses": 0, "p": sign_test(5, 0)}
    # valid_seen +1 / -1 and +1 / -0, unseen rooms +2 / -0 and +3 / -0: one sign test on the sums (dev left out)
    assert out["headroom"] == {"panels": ["valid_seen", "unseen"], "wins": 7, "losses": 1, "p": sign_test(7, 1)}
    assert out["spread"]["unseen"]["sft_grpo"] == [9.5, pytest.approx(0.5**0.5)]
    # the gap: valid_seen success minus unseen-room success in points, with Newcombe's interval
    rooms = out["rooms"]
    seed0 = rooms["seeds"][0]["sft"]
    assert seed0["valid_seen"] == pytest.approx(100 * (n - 2) / n) and seed0["unseen"] == pytest.approx(70.0)
    assert seed0["gap"] == pytest.approx(100 * (n - 2) / n - 70.0)
    assert (seed0["gap"], seed0["low"], seed0["high"]) == pytest.approx(gap_interval(n - 2, n, 7, 10))
    assert seed0["low"] < seed0["gap"] < seed0["high"]
    grpo_gap = (100 * (n - 2) / n - 90.0 + 0.0) / 2  # seed 3: every game won on both panels
    assert rooms["mean"]["sft_grpo"]["unseen"][0] == pytest.approx(95.0)
    assert rooms["mean"]["sft_grpo"]["gap"][0] == pytest.approx(grpo_gap)
    assert rooms["goal"]["met"] == {"sft": False, "sft_grpo": grpo_gap <= 3.0}
    declared = json.loads((tmp_path / "out.declared.json").read_text())
    assert declared["seeds"] == [0, 3] and declared["sets"] == [] and out["declared"] == declared
    md = (tmp_path / "out.md").read_text()
    assert f"Seeds 0, 3 (--set overrides: none) were declared {declared['utc']}" in md
    assert "### Seen vs unseen rooms" in md and "| **headroom: valid_seen + unseen** | | | 7 | 1 |" in md
    assert f"SFT 70.00% and {rooms['mean']['sft']['gap'][0]:+.2f} points: not met" in md
    table = [line for line in md.splitlines() if line.startswith("| seed | SFT valid_seen")][0]
    # under the header: the separator, 2 seeds, the spread, the pooled and the headroom rows, 16 columns each
    rows = md.split(table + "\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(rows) == 6 and {line.count("|") for line in [table, *rows]} == {17}


def test_main_job_seeds_without_the_unseen_room_panel_in_every_job_gives_the_two_panel_summary(
    pick_two_episodes, tmp_path, monkeypatch
):
    both = {"sft": {0}, "dev_sft": {0}, "rl_step4": set(), "dev_rl_step4": set()}
    old = _main_job(tmp_path, 0, both, pick_two_episodes)  # run before the unseen-room panel existed
    new = _main_job(
        tmp_path, 1, {**both, "unseen_sft": {1}, "unseen_rl_step4": set()}, pick_two_episodes, pick_two_episodes
    )
    args = ["--seeds", "0", "1", "--run", f"0={old}", f"1={new}", "--results", str(tmp_path / "o")]
    _run_main_job_seeds(monkeypatch, *args)
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["panels"] == ["valid_seen", "dev"] and list(out["pooled"]) == ["valid_seen", "dev"]
    assert "headroom" not in out and "rooms" not in out and all("unseen" not in r for r in out["seeds"])
    assert out["pooled"]["valid_seen"] == {"wins": 2, "losses": 0, "p": 0.5}
    md = (tmp_path / "o.md").read_text()
    header = "| seed | SFT valid_seen | SFT + GRPO valid_seen | wins | losses | p | SFT dev | SFT + GRPO dev | wins | "
    assert header + "losses | minutes |" in md and "unseen" not in md


def test_main_job_seeds_declares_its_seeds_before_any_job_runs_and_refuses_other_seeds_later(tmp_path, monkeypatch):
    results = str(tmp_path / "res")
    unfinished = tmp_path / "job"  # no systems.json: reading it fails, after the declaration
    unfinished.mkdir()
    runs = ["--run", f"2={unfinished}", f"4={unfinished}"]
    with pytest.raises(SystemExit, match="no systems.json"):
        _run_main_job_seeds(monkeypatch, *runs, "--set", "rl_steps=3", "--results", results)
    declared = json.loads((tmp_path / "res.declared.json").read_text())
    assert declared["seeds"] == [2, 4] and declared["sets"] == ["rl_steps=3"]
    assert declared["utc"].endswith("+00:00") and "commit" in declared
    other_seeds = r"declares seeds \[2, 4\] with --set \['rl_steps=3'\].*asks for seeds \[2, 5\]"
    with pytest.raises(SystemExit, match=other_seeds):
        _run_main_job_seeds(monkeypatch, "--seeds", "2", "5", "--set", "rl_steps=3", "--results", results)
    with pytest.raises(SystemExit, match=r"asks for seeds \[4, 2\] with --set \[\]"):
        _run_main_job_seeds(monkeypatch, "--seeds", "4", "2", "--results", results)  # other overrides
    # the declared seeds and overrides in another order: the call goes on (to the unfinished job)
    with pytest.raises(SystemExit, match="no systems.json"):
        _run_main_job_seeds(monkeypatch, "--seeds", "4", *runs, "--set", "rl_steps=3", "--results", results)
    assert json.loads((tmp_path / "res.declared.json").read_text()) == declared  # kept with its time


def test_main_job_seeds_keeps_each_job_slimmed_and_a_later_call_reads_the_kept_seeds_without_their_runs(
    pick_two_episodes, tmp_path, monkeypatch
):
    lost = {0: ({0, 1}, {1}), 3: ({4}, set())}
    runs = []
    for seed, (sft, rl) in lost.items():
        eval_lost = {"sft": sft, "dev_sft": sft, "rl_step4": rl, "dev_rl_step4": rl}
        runs.append(f"{seed}={_main_job(tmp_path / 'jobs', seed, eval_lost, pick_two_episodes)}")
    results = tmp_path / "res" / "seeds"
    _run_main_job_seeds(monkeypatch, "--run", *runs, "--results", str(results))
    first = json.loads(results.with_suffix(".json").read_text())
    kept = sorted(p.name for p in (tmp_path / "res" / "seeds.jobs").iterdir())
    assert kept == ["seed0.json.gz", "seed3.json.gz"]
    raw = sum(p.stat().st_size for p in (tmp_path / "jobs" / "seed0" / "eval").rglob("episodes.jsonl"))
    assert (tmp_path / "res" / "seeds.jobs" / "seed0.json.gz").stat().st_size < raw / 5
    shutil.rmtree(tmp_path / "jobs")  # another machine: no run directory, only the committed kept jobs
    root = ["--root", str(tmp_path / "jobs")]
    _run_main_job_seeds(monkeypatch, "--seeds", "0", "3", *root, "--results", str(results))  # no job runs
    second = json.loads(results.with_suffix(".json").read_text())
    # the same tables, wasted steps (turns compared by digest) and cost test included
    for key in ("seeds", "spread", "pooled", "wasted", "cost", "lost_games"):
        assert second[key] == first[key], key
    assert first["wasted"] and any(r["cpu"] not in ("", "unknown") for r in second["seeds"])
    assert "CPU of each seed's job" in results.with_suffix(".md").read_text()
