"""SFT tail averaging's choice of checkpoints and its same-trajectory check."""

from __future__ import annotations

import json

import pytest

from experiments.unseen_rooms.sft_tail_average import same_trajectory, tail_checkpoints


def test_a_window_takes_the_checkpoints_after_its_start_up_to_the_last(tmp_path):
    for n in (50, 100, 2400, 2450, 2950, 3000):
        (tmp_path / f"step_{n:07d}").mkdir()
    (tmp_path / "latest").mkdir()  # not a step checkpoint
    names = [p.name for p in tail_checkpoints(tmp_path, 3000, 0.2)]
    assert names == ["step_0002450", "step_0002950", "step_0003000"]  # 2400 is the window's start, excluded
    assert len(tail_checkpoints(tmp_path, 3000, 1.0)) == 6
    with pytest.raises(ValueError, match="window"):
        tail_checkpoints(tmp_path, 3000, 0.0)


def test_the_trajectory_check_counts_every_step_whose_loss_differs_or_is_missing(tmp_path):
    base, arm = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = [{"step": s, "loss": 1.0 / s} for s in range(1, 6)]
    base.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"step": 5, "eval_loss": 0.3}]))
    arm.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert same_trajectory(base, arm) == 0
    rows[2]["loss"] += 1e-9
    arm.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    assert same_trajectory(base, arm) == 2  # step 3 differs, step 5 is missing
