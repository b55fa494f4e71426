"""The first-divergence classes (experiments/rl_levers/first_divergence.py) on the scripted teacher's
real look games, edited the way an RL arm departs from its SFT model."""

from __future__ import annotations

import copy
import json

import pytest
from panels import teacher_episodes

from experiments.rl_levers.first_divergence import divergence_class, lost_games
from experiments.rl_levers.first_divergence import main as first_divergence_main


@pytest.fixture(scope="module")
def look_episodes(valid_seen):
    """The scripted teacher on the valid_seen look games (an empty experience store: it notes every find)."""
    return teacher_episodes([g for g in valid_seen if g.task_type == "look_at_obj_in_light"][:4])


def _lost(e: dict, turns: list[dict]) -> dict:
    out = copy.deepcopy(e)
    out["turns"], out["won"] = turns, False
    return out


def test_a_skipped_note_a_swapped_move_and_an_added_meta_action_are_told_apart(look_episodes):
    assert all(e["won"] for e in look_episodes)
    e = next(e for e in look_episodes if any(t["action"].startswith("note ") for t in e["turns"]))
    k = next(i for i, t in enumerate(e["turns"]) if t["action"].startswith("note "))
    skipped = _lost(e, e["turns"][:k] + e["turns"][k + 1 :])  # the arm went straight to SFT's next action
    [row] = lost_games([e], [skipped])
    assert (row["turn"], row["class"], row["sft_action"]) == (k, "skips note", e["turns"][k]["action"])

    w = next(i for i, t in enumerate(e["turns"]) if t["action"].startswith("go to "))
    swapped = copy.deepcopy(e["turns"])
    swapped[w]["action"] = "go to nowhere 9"  # another receptacle, not SFT's next action
    assert lost_games([e], [_lost(e, swapped)])[0]["class"] == "world"
    assert divergence_class("go to desk 1", "track cd", "take cd 1 from desk 1") == "adds track"
    assert divergence_class("track cd", "recall where: cd", "go to desk 1") == "other meta"

    # a game the arm won, or one SFT lost, is not the arm's loss
    assert lost_games([e], [e]) == []
    assert lost_games([_lost(e, e["turns"])], [skipped]) == []


def test_the_script_counts_classes_per_seed_from_run_and_arm_directories(look_episodes, tmp_path, monkeypatch):
    e = next(e for e in look_episodes if any(t["action"].startswith("note ") for t in e["turns"]))
    k = next(i for i, t in enumerate(e["turns"]) if t["action"].startswith("note "))
    for seed in (0, 1):
        run, arm = tmp_path / f"run{seed}", tmp_path / f"arm{seed}"
        (run / "eval" / "sft").mkdir(parents=True)
        (arm / "eval" / "valid_seen_final").mkdir(parents=True)
        (run / "eval" / "sft" / "episodes.jsonl").write_text(json.dumps(e) + "\n")
        arm_ep = _lost(e, e["turns"][:k] + e["turns"][k + 1 :]) if seed else e
        (arm / "eval" / "valid_seen_final" / "episodes.jsonl").write_text(json.dumps(arm_ep) + "\n")
    out = tmp_path / "res"
    pairs = [f"{s}={tmp_path / f'run{s}'},{tmp_path / f'arm{s}'}" for s in (0, 1)]
    monkeypatch.setattr("sys.argv", ["first_divergence", "--pair", *pairs, "--results", str(out)])
    first_divergence_main()
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [(r["seed"], r["panel"], r["class"]) for r in rows] == [("1", "valid_seen", "skips note")]
    md = out.with_suffix(".md").read_text()
    assert "| 0 | 0 | 0 |" in md and "| 1 | 1 | 1 |" in md and "| **all** | 1 | 1 |" in md
