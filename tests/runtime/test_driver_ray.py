"""The schedulers drive Ray actors (`runtime.ray_transport.RayTransport`): a local Ray head on
127.0.0.1, the timed replay of two RL steps (`runtime.synthetic`; runs when Ray is installed)."""

from __future__ import annotations

import pytest
from rl_cells import RAY_STALL_S
from synthetic_agents import KillOnCommand

from evoharness.runtime.driver import Driver
from evoharness.runtime.events import Bind
from evoharness.runtime.sim import build_scheduler
from evoharness.runtime.synthetic import replay_backend

pytest.importorskip("ray")


@pytest.mark.parametrize("policy", ["colocate", "elastic-async"])
def test_two_steps_on_ray_actors_exactly_once(make_cfg, ray_head, policy):
    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched = build_scheduler(policy, cfg)
    be = replay_backend(cfg, sched.initial_roles(), time_scale=0.002, backend="ray")
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
        idle = be.idle()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert len(stats.step_end_s) == 2 and sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    assert len(set().union(*be.pids_seen.values())) == cfg.cluster.cells  # three actor processes
    assert 0.0 <= idle["idle_rollout"] < 1.0 and 0.0 < idle["idle_train"] <= 1.0
    if policy == "elastic-async":
        assert stats.switches > 0 and be.counts["migrations"] > 0


def test_a_killed_actor_is_replaced(make_cfg, ray_head):
    """elastic-async on 3 actors; cell 2's actor killed right after its second execution is bound
    to it (its call in flight): the call is re-issued, a new actor takes cell 2's place, and every
    execution trains exactly once."""
    binds = iter(range(1, 1000))
    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = KillOnCommand(
        replay_backend(cfg, sched.initial_roles(), time_scale=0.002, backend="ray"),
        lambda c: isinstance(c, Bind) and c.cell == 2 and next(binds) == 2,
    )
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert be.killed == [2] and stats.cells_lost == 1 and sum(stats.staleness.values()) == n
    assert stats.aborted_turns == 0 and be.counts["reissued_calls"] > 0
    assert len(be.pids_seen[2]) == 2 and be.transport.pid(2) in be.pids_seen[2]  # the replacement answered
