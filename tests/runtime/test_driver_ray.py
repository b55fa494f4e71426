"""The schedulers drive Ray actors: a local Ray head on 127.0.0.1, two RL steps (runs when Ray is installed)."""

from __future__ import annotations

import pytest
from rl_cells import RAY_STALL_S

from evoharness.runtime.driver import Driver
from evoharness.runtime.events import Bind
from evoharness.runtime.sim import build_scheduler

pytest.importorskip("ray")


@pytest.mark.parametrize("policy", ["colocate", "elastic-async"])
def test_two_steps_on_ray_actors_exactly_once(make_cfg, ray_head, policy):
    from evoharness.runtime.ray_backend import RayBackend

    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched = build_scheduler(policy, cfg)
    be = RayBackend(cfg, sched.initial_roles(), time_scale=0.002)
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert len(stats.step_end_s) == 2 and sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    assert len(set().union(*be.pids_seen.values())) == cfg.cluster.cells   # three actor processes


def test_a_killed_actor_is_replaced(make_cfg, ray_head):
    from evoharness.runtime.ray_backend import RayBackend

    class Killer(RayBackend):
        binds = 0

        def apply(self, c):
            super().apply(c)
            if isinstance(c, Bind) and c.cell == 2:
                self.binds += 1
                if self.binds == 2:
                    self.kill_cell(2)

    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = Killer(cfg, sched.initial_roles(), time_scale=0.002)
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert stats.cells_lost == 1 and sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    assert be.counts["reissued_calls"] > 0
