"""The schedulers drive real worker processes through the driver (local backend, real time)."""

from __future__ import annotations

import os

import pytest

from evoharness.runtime.driver import Driver
from evoharness.runtime.local_backend import LocalBackend
from evoharness.runtime.sim import build_scheduler, simulate

SCALE = 0.002   # real seconds per simulated second: the long-tail workload's 2 steps take ~1-2 s


def drive(cfg, policy):
    sched = build_scheduler(policy, cfg)
    backend = LocalBackend(cfg, sched.initial_roles(), time_scale=SCALE)
    try:
        stats = Driver(sched, backend, stall_s=30).run()
    finally:
        backend.close()
    return sched, backend, stats


@pytest.mark.parametrize("policy", ["colocate", "async", "elastic", "elastic-async"])
def test_every_schedule_runs_on_processes_exactly_once(make_cfg, policy):
    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched, backend, stats = drive(cfg, policy)
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert len(stats.step_end_s) == cfg.steps and sched.done
    assert sum(stats.staleness.values()) == n            # the driver checked each was trained once
    assert max(stats.staleness) <= (1 if "async" in policy else 0)
    assert stats.aborted_turns == 0 and backend.counts["aborted_turns"] == 0
    pids = set().union(*backend.pids_seen.values())
    assert len(pids) >= 2 and os.getpid() not in pids  # the work ran in the cell processes
    if policy in ("elastic", "elastic-async"):
        assert stats.switches > 0 and backend.counts["reissued_calls"] > 0   # forced switches, calls re-issued
    # the simulator's prediction for the same workload, in real seconds (processes serve calls in
    # parallel, the simulator shares a cell's throughput, so the run is the faster one)
    predicted = simulate(cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"gen_concurrency_exponent": 1.0})}), policy).wall_s * SCALE
    assert stats.wall_s > 0.5 * predicted


def test_switching_without_reissue_aborts_turns_and_is_counted(make_cfg):
    cfg = make_cfg(steps=1, cluster={"cells": 3}, policy={"elastic_reissue": False})
    _, backend, stats = drive(cfg, "elastic")
    assert stats.aborted_turns > 0 and stats.aborted_turns == backend.counts["aborted_turns"]
