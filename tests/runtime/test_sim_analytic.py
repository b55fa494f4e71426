"""Closed-form checks: identical executions make the schedule times computable by hand."""

from __future__ import annotations

import pytest

from evoharness.runtime.sim import simulate

TURNS, COMP, PROMPT, INIT, TOOL = 9, 250.0, 400.0, 1000.0, 2.5


def identical(make_cfg, **cluster):
    return make_cfg(
        workload={
            "turns": TURNS,
            "completion_tokens": COMP,
            "prompt_tokens": PROMPT,
            "initial_prompt_tokens": INIT,
            "tool_latency_s": TOOL,
            "timeout_s": None,
        },
        cluster=cluster,
    )


def colocate_formula(cfg) -> float:
    """K*C identical executions: every cell decodes C sequences in lockstep."""
    cl = cfg.cluster
    r = cl.per_seq_tps(cl.capacity)
    rollout = (INIT / cl.prefill_speedup) / r + TURNS * ((COMP + PROMPT / cl.prefill_speedup) / r + TOOL)
    tokens = INIT + TURNS * (PROMPT + COMP)
    per_cell = cfg.workload.groups_per_step * cfg.workload.group_size / cl.cells
    train = per_cell * tokens / cl.train_tps
    step = rollout + cl.switch_to_train_s + train + cl.weight_sync_s
    return cfg.steps * step + (cfg.steps - 1) * cl.switch_to_rollout_s


def test_zero_switch_cost_elastic_equals_colocate_equals_formula(make_cfg):
    cfg = identical(make_cfg, switch_to_train_s=0.0, switch_to_rollout_s=0.0)
    n = cfg.workload.groups_per_step * cfg.workload.group_size
    assert n == cfg.cluster.cells * cfg.cluster.capacity  # the batch fills the cluster
    col, ela = simulate(cfg, "colocate"), simulate(cfg, "elastic")
    assert col.wall_s == pytest.approx(colocate_formula(cfg), rel=1e-9)
    assert ela.wall_s == pytest.approx(col.wall_s, rel=1e-9)
    assert ela.metrics["aborted_turns"] == 0


def test_colocate_formula_with_switch_costs_and_elastic_cannot_win_without_variance(make_cfg):
    cfg = identical(make_cfg)  # QwenGyre's 8.52 s / 3.46 s
    col, ela = simulate(cfg, "colocate"), simulate(cfg, "elastic")
    assert col.wall_s == pytest.approx(colocate_formula(cfg), rel=1e-9)
    # no tail to overlap and serial transfers: elastic pays at least as much
    assert ela.wall_s >= col.wall_s - 1e-6


def test_long_tail_elastic_beats_colocate(make_cfg):
    cfg = make_cfg(policy={"train_unit": "execution"}, cluster={"train_tps": 500.0})
    col, ela = simulate(cfg, "colocate"), simulate(cfg, "elastic")
    assert ela.wall_s < col.wall_s
    assert ela.metrics["idle_rollout"] < col.metrics["idle_rollout"]
