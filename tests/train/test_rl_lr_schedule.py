"""GRPO's learning-rate schedule (`train.step.lr_at`): one lr per RL step, the same on the
in-process loop and on a cell's optimizer, acting on the update (real games, a real micro model)."""

from __future__ import annotations

import pytest
from rl_cells import EXACT, assert_same_update, metrics, rl_config
from safetensors.torch import load_file

from evoharness.config.rl import GRPOConfig
from evoharness.recipes.rl import train_rl
from evoharness.train.step import lr_at


def test_lr_at_warms_up_decays_to_the_floor_and_stays_there():
    const = GRPOConfig(lr=1e-4)
    assert [lr_at(const, s, 8) for s in (0, 7, 20)] == [1e-4] * 3
    cos = GRPOConfig(lr=1e-4, lr_schedule="cosine", lr_warmup_steps=2, min_lr_ratio=0.1)
    got = [lr_at(cos, s, 10) for s in range(12)]
    assert got[:3] == pytest.approx([1e-4 / 3, 2e-4 / 3, 1e-4])  # warm-up, then the peak
    assert all(a > b for a, b in zip(got[2:10], got[3:10]))  # strictly decaying to the horizon
    assert got[10] == got[11] == pytest.approx(1e-5)  # the floor: min_lr_ratio x lr
    # an explicit horizon wins over the run's length (extending a run keeps its schedule)
    fixed = cos.model_copy(update={"lr_decay_steps": 10})
    assert [lr_at(fixed, s, 40) for s in range(12)] == got


def _cosine(cfg):
    cfg.grpo.lr_schedule, cfg.grpo.min_lr_ratio = "cosine", 0.1
    return cfg


def test_cosine_schedule_sets_each_steps_update_in_process_and_on_a_cell(model_dir, tmp_path, rl_reference):
    out = tmp_path / "inprocess"
    final = train_rl(_cosine(rl_config(model_dir, out)), progress=False)
    got = metrics(out)
    # 2 steps: the peak, then halfway down the cosine to 0.1 x lr
    assert [m["train/lr"] for m in got] == pytest.approx([1e-3, 1e-3 * (0.1 + 0.9 * 0.5)])
    # step 1 is the constant-lr run's step (same lr); step 2's smaller lr moves the weights less far
    ref = rl_reference.metrics
    assert {k: got[0][k] for k in EXACT} == {k: ref[0][k] for k in EXACT}
    w0 = load_file(str(model_dir / "model.safetensors"))
    w = load_file(str(final / "model.safetensors"))
    moved = sum(float((w[k] - w0[k]).abs().sum()) for k in w0)
    moved_ref = sum(float((rl_reference.weights[k] - w0[k]).abs().sum()) for k in w0)
    assert 0 < moved < moved_ref
    # a cell process's optimizer takes the same lr per version (`recipes.alfworld.train_grpo` fixes the
    # horizon to the run's steps)
    cell_out = tmp_path / "colocate"
    cell_final = train_rl(
        _cosine(rl_config(model_dir, cell_out, schedule="colocate", cells=1, backend="local")), progress=False
    )
    assert [m["train/lr"] for m in metrics(cell_out)] == pytest.approx([m["train/lr"] for m in got])
    assert_same_update(cell_final, w, model_dir)
