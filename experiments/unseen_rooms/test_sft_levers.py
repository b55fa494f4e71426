"""The unseen-room SFT levers' rewrites on real teacher traces."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.search_faults import search_move
from evoharness.envs.alfworld.games import discover_games
from evoharness.eval.run_report import sign_test
from experiments.unseen_rooms.sft_levers import colocated_upsample, write_pooled

# bundled train games where the teacher searches receptacles at the desk lamp's location (shelves 6 and 7, drawer 3)
_GAMES = ("look_at_obj_in_light-AlarmClock-None-DeskLamp-324", "look_at_obj_in_light-CD-None-DeskLamp-307")


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """The teacher's SFT rows on `_GAMES` (BPE harness)."""
    from evoharness.envs.alfworld import make_env
    from evoharness.policies.teacher import TeacherPolicy
    from evoharness.rollout.collect import bpe_harness_factory, collect_traces, traces_to_sft

    tasks = [t for t in discover_games("train") if t.task_id.split("/")[0] in _GAMES]
    out = tmp_path_factory.mktemp("colocated") / "traces.jsonl"
    collect_traces(tasks, TeacherPolicy(), bpe_harness_factory(), make_env, out, batch_size=2, progress=False)
    return traces_to_sft(out)


def test_colocated_upsampling_repeats_exactly_the_open_or_examine_search_moves(examples):
    out, added = colocated_upsample(examples, 10)
    there = [ex for ex in examples if (m := search_move(ex["completion"])) and m[1].split()[0] != "go"]
    assert len(there) >= 2
    assert added == 9 * len(there) and len(out) == len(examples) + added
    for ex in there:
        target, action = search_move(ex["completion"])
        assert action in (f"open {target}", f"examine {target}")  # only admissible where the agent stands
        assert sum(o is ex for o in out) == 10
    others = [ex for ex in examples if not any(ex is t for t in there)]
    assert all(sum(o is ex for o in out) == 1 for ex in others)
    assert colocated_upsample(examples, 1) == (examples, 0)
    with pytest.raises(ValueError, match="factor"):
        colocated_upsample(examples, 0)


def test_pooling_sums_each_arms_pairs_over_runs_and_tests_the_sums(tmp_path):
    committed = Path(__file__).parents[2] / "benchmarks/results/student/unseen_levers/sft_levers.json"
    one = json.loads(committed.read_text())
    other = copy.deepcopy(one)
    other["run"], other["rows"] = "runs/seeds/seed1", other["rows"][2:]  # a second run with renumber025 only
    (tmp_path / "a.json").write_text(json.dumps(one))
    (tmp_path / "b.json").write_text(json.dumps(other))
    md = write_pooled([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "out")
    rows = {r["arm"]: r for r in json.loads((tmp_path / "out" / "pooled.json").read_text())["rows"]}
    r025 = one["rows"][2]["unseen rooms"]
    assert rows["renumber025"]["runs"] == [one["run"], "runs/seeds/seed1"]
    assert rows["renumber025"]["unseen rooms"] == {
        **{k: 2 * r025[k] for k in ("base", "won", "n", "b_only", "a_only")},
        "p": sign_test(2 * r025["b_only"], 2 * r025["a_only"]),
    }
    assert rows["renumber025"]["unseen rooms"]["p"] < r025["p"]  # the same split over twice the games
    assert rows["colocated_x10"]["runs"] == [one["run"]] and rows["colocated_x10"]["dev"] == {
        k: v for k, v in one["rows"][0]["dev"].items() if k not in ("both", "neither")
    }
    assert "| renumber025 | 2 | 242/280 -> 258/280 | +24 / -8 |" in md
