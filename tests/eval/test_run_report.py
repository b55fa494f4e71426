"""The main job's report on real evaluations: the paired comparison of a GRPO checkpoint
chosen on the curve's dev games also excludes those games."""

import pytest
from panels import play_panel

from evoharness.envs.alfworld.games import discover_games
from evoharness.eval.run_report import paired, write_run_report
from evoharness.files import read_jsonl


def test_grpo_vs_sft_is_also_paired_on_the_dev_games_that_did_not_choose_it(tmp_path):
    tasks = [t.task_id for t in discover_games("train")[:8]]
    games, vs_games = tasks[:4], tasks[4:]  # dev and a disjoint stand-in for valid_seen
    # two real systems that differ per game: an 8-step cap makes the noisy expert lose some
    noisy, expert = {"kind": "noisy_expert", "epsilon": 0.6, "seed": 1}, {"kind": "expert"}
    sft, grpo = play_panel(tmp_path, "sft", games, noisy), play_panel(tmp_path, "grpo", games, expert)
    systems = {"SFT": sft, "SFT + GRPO": grpo}
    vs = {
        "SFT": play_panel(tmp_path, "vs_sft", vs_games, noisy),
        "SFT + GRPO": play_panel(tmp_path, "vs_grpo", vs_games, expert),
    }
    chose = games[-2:]  # not the first two in panel order: the rows must drop by id
    curve = {"games": 2, "game_ids": chose, "points": [], "rl_selected": {"stage": "rl", "step": 4}}
    md = write_run_report(tmp_path / "run", vs, systems, [], None, [], curve=curve).read_text()

    a, b = read_jsonl(sft / "episodes.jsonl"), read_jsonl(grpo / "episodes.jsonl")
    rest = paired([e for e in a if e["task_id"] not in chose], [e for e in b if e["task_id"] not in chose])
    assert rest["n"] == 2
    row = (
        f"| SFT + GRPO vs SFT | dev without the 2 that chose it | 2 | {rest['b_only']} | {rest['a_only']} | "
        f"{rest['both']} |"
    )
    assert row in md
    assert "| SFT + GRPO vs SFT | dev | 4 |" in md
    # valid_seen and the dev games that did not choose it, pooled: one paired test on 6 games
    v = paired(read_jsonl(vs["SFT"] / "episodes.jsonl"), read_jsonl(vs["SFT + GRPO"] / "episodes.jsonl"))
    assert (
        f"| SFT + GRPO vs SFT | valid_seen + dev without those | 6 | {v['b_only'] + rest['b_only']} | "
        f"{v['a_only'] + rest['a_only']} | {v['both'] + rest['both']} |"
    ) in md
    # when the job kept the SFT model, no GRPO checkpoint was chosen: no such row
    curve["rl_selected"] = {"stage": "sft_final", "step": 0}
    md = write_run_report(tmp_path / "run2", vs, systems, [], None, [], curve=curve).read_text()
    assert "that chose it" not in md and "| valid_seen + dev | 8 |" in md
    # chosen on the whole development set: that row says so, and no dev game joins a pooled test
    curve.update(chosen_on=games, rl_selected={"stage": "rl", "step": 8})
    md = write_run_report(tmp_path / "run3", vs, systems, [], None, [], curve=curve).read_text()
    assert "| SFT + GRPO vs SFT | dev (chose the checkpoint) | 4 |" in md
    success_tests = md.split("### Cost of won episodes")[0]
    assert "that chose it" not in success_tests and "valid_seen + dev" not in success_tests
    # the cost section pairs the two systems on the games both won, per panel and pooled
    cost = md.split("### Cost of won episodes")[1]
    assert "| SFT + GRPO vs SFT | valid_seen |" in cost and "| SFT + GRPO vs SFT | valid_seen + dev |" in cost


def test_wilson_interval_known_values():
    from evoharness.eval.report import wilson_interval

    lo, hi = wilson_interval(133, 140)  # the main job's SFT on valid_seen
    assert 90.0 < lo < 95.0 < hi < 98.5
    assert wilson_interval(0, 10)[0] == 0.0 and 0 < wilson_interval(0, 10)[1] < 35
    assert wilson_interval(10, 10)[1] == 100.0 and wilson_interval(10, 10)[0] > 65
    lo, hi = wilson_interval(50, 100)
    assert abs((lo + hi) / 2 - 50) < 1e-9 and abs(hi - lo - 2 * 9.61) < 0.1  # ±1.96·sqrt(.25/100) shrunk
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_success_plot_with_perfect_and_empty_rows(tmp_path):
    from evoharness.envs.alfworld.games import TASK_TYPES
    from evoharness.eval.report import plot_success

    rows = {t: {"n": 0, "won": 0, "success": 0.0} for t in TASK_TYPES}
    rows[TASK_TYPES[0]] = {"n": 6, "won": 6, "success": 100.0}  # 6 of 6: Wilson's upper end rounds below 1
    rows[TASK_TYPES[1]] = {"n": 11, "won": 0, "success": 0.0}  # 0 of 11: its lower end rounds above 0
    summary = {"by_type": rows, "overall": {"n": 17, "won": 6, "success": 35.3}}
    plot_success({"all won": summary}, tmp_path / "s.png", "t")
    assert (tmp_path / "s.png").stat().st_size > 0


def test_rl_report_names_the_decoding_each_workload_had(tmp_path):
    """ALFWorld runs record `constrained`; repository runs (tool calls) have no action grammar and
    must not be described as constrained to admissible commands."""
    from evoharness.eval.run_report import rl_section

    base = {"step": 0, "reward": 0.1, "success": 0.5, "invalid_per_episode": 0.0, "steps_per_episode": 9.0}
    base |= {"completion_tokens_per_episode": 90.0, "timing_s/gen": 3.0, "timing_s/env": 1.0, "timing_s/train": 2.0}
    text = {}
    for name, extra in (("alf", {"constrained": True}), ("free", {"constrained": False}), ("repo", {})):
        text[name] = "\n".join(rl_section(tmp_path, [dict(base, **extra), dict(base, step=1, **extra)], f"{name}.png"))
    assert "admissible commands" in text["alf"] and "unconstrained" in text["free"]
    assert "admissible" not in text["repo"] and "no action grammar" in text["repo"]
