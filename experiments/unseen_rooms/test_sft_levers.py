"""The unseen-room SFT levers' rewrites on real teacher traces."""

from __future__ import annotations

import pytest

from benchmarks.search_faults import search_move
from evoharness.envs.alfworld.games import discover_games
from experiments.unseen_rooms.sft_levers import colocated_upsample

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
