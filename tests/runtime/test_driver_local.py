"""The schedulers drive real worker processes through the driver: the timed replay of a simulator
workload (`runtime.synthetic`) on a process per cell (`runtime.transport.ProcessTransport`), real time."""

from __future__ import annotations

import os
import signal
import time

import pytest
from synthetic_agents import DIE, DiesMidReply, KillOnCommand

from evoharness.runtime.driver import Driver
from evoharness.runtime.events import Bind, RunMicroBatch
from evoharness.runtime.sim import build_scheduler, simulate
from evoharness.runtime.synthetic import replay_backend

SCALE = 0.002  # real seconds per simulated second: the long-tail workload's 2 steps take ~1-2 s


def drive(cfg, policy, work_dir=None):
    sched = build_scheduler(policy, cfg)
    backend = replay_backend(cfg, sched.initial_roles(), time_scale=SCALE, work_dir=work_dir)
    try:
        stats = Driver(sched, backend, stall_s=30).run()
    finally:
        backend.close()
    return sched, backend, stats


@pytest.mark.parametrize("policy", ["colocate", "async", "elastic", "elastic-async"])
def test_every_schedule_runs_on_processes_exactly_once(make_cfg, policy, tmp_path):
    cfg = make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1})
    sched, backend, stats = drive(cfg, policy, tmp_path)
    idle = backend.idle()
    assert 0.0 <= idle["idle_rollout"] < 1.0 and 0.0 < idle["idle_train"] <= 1.0  # trainers wait for groups
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert len(stats.step_end_s) == cfg.steps and sched.done
    assert sum(stats.staleness.values()) == n  # the driver checked each was trained once
    assert max(stats.staleness) <= (1 if "async" in policy else 0)
    assert stats.aborted_turns == 0 and backend.counts["aborted_turns"] == 0
    pids = set().union(*backend.pids_seen.values())
    assert len(pids) >= 2 and os.getpid() not in pids  # the work ran in the cell processes
    if policy in ("elastic", "elastic-async"):
        assert stats.switches > 0 and backend.counts["migrations"] > 0  # forced switches moved executions
    # the simulator's prediction for the same workload, in real seconds (processes serve calls in
    # parallel, the simulator shares a cell's throughput, so the run is the faster one)
    predicted = (
        simulate(
            cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gen_concurrency_exponent": 1.0})}), policy
        ).wall_s
        * SCALE
    )
    assert stats.wall_s > 0.5 * predicted
    # the run's call trace (`trace.jsonl`) is the workload it replayed: the simulator reads it back
    from evoharness.runtime.workload import Workload, load_trace, trace_grouping

    played = load_trace(tmp_path / "trace.jsonl")
    assert trace_grouping(played) == (cfg.steps * cfg.workload.groups_per_step, cfg.workload.group_size)
    drawn = [Workload(cfg.workload, cfg.seed).sample_step(u) for u in range(cfg.steps)]
    turns = lambda p, c: (tuple(p.round().tolist()), tuple(c.round().tolist()))  # noqa: E731
    assert sorted(turns(t.prompt, t.completion) for t in played) == sorted(
        turns(b.prompt[b.offsets[i] : b.offsets[i + 1]], b.completion[b.offsets[i] : b.offsets[i + 1]])
        for b in drawn
        for i in range(len(b.n_turns))
    )


def _group_bound_to(be, cell: int) -> list[int]:
    """Dispatch GRPO group 0 and bind all its executions to `cell`; returns their ids."""
    from evoharness.runtime.events import Dispatch

    be.apply(Dispatch(0, 0))
    members = [ev.execution for ev in be.poll(1.0)]
    for e in members:
        be.apply(Bind(e, cell))
    return members


def test_a_blunt_switch_aborts_the_calls_in_flight_and_counts_them(make_cfg):
    """Without `Migrate` a cell leaving rollout orphans its executions and the
    calls in flight are aborted (what elastic's re-issue avoids): bind a group
    to cell 1 and switch it at once, while every call still runs there."""
    from evoharness.runtime.cells import Role
    from evoharness.runtime.events import ExecutionOrphaned, SwitchRole

    cfg = make_cfg(cluster={"cells": 2})
    be = replay_backend(cfg, [Role.ROLLOUT, Role.ROLLOUT], time_scale=SCALE)
    try:
        members = _group_bound_to(be, 1)
        be.apply(SwitchRole(1, Role.TRAIN))
        orphans = [ev for ev in be.poll(1.0) if isinstance(ev, ExecutionOrphaned)]
    finally:
        be.close()
    assert sorted(o.execution for o in orphans) == members and all(o.aborted for o in orphans)
    assert be.counts["aborted_turns"] == len(members) == cfg.workload.group_size


@pytest.mark.parametrize("what", ["rollout", "train"])
def test_a_killed_cell_is_replaced_and_nothing_is_lost_or_repeated(make_cfg, what):
    """elastic-async on 3 processes; SIGKILL a satellite while it serves calls
    (its executions are re-issued elsewhere) or while it trains a micro-batch
    (the micro-batch is claimed again). The run completes, every execution
    finishes and trains exactly once, no agent turn is aborted, and the loss is
    counted."""
    cfg = make_cfg(steps=3, cluster={"cells": 3}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    if what == "rollout":
        binds = iter(range(100))
        kill_on = lambda c: isinstance(c, Bind) and c.cell == 2 and next(binds) == 2  # noqa: E731
    else:
        kill_on = lambda c: isinstance(c, RunMicroBatch) and c.cell != 0  # noqa: E731
    backend = KillOnCommand(replay_backend(cfg, sched.initial_roles(), time_scale=SCALE), kill_on)
    try:
        stats = Driver(sched, backend, stall_s=30).run()
    finally:
        backend.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert backend.killed and stats.cells_lost == 1 == backend.counts["cells_lost"] == sched.cells_lost
    assert sum(stats.staleness.values()) == n and max(stats.staleness) <= 1
    assert stats.aborted_turns == 0 and len(stats.step_end_s) == cfg.steps
    if what == "rollout":
        assert backend.counts["reissued_calls"] > 0
    else:
        assert stats.micro_batches_reclaimed == 1


def test_a_cell_killed_mid_reply_does_not_silence_the_others(make_cfg, tmp_path):
    """Regression: the cells shared one reply queue, whose writers share a lock;
    a cell killed while its reply was being written held it for good and no
    other cell was heard again (the killed-cell test stalled now and then). Each
    cell now replies on a pipe of its own (`runtime.transport.ProcessTransport`): after
    cell 1 died mid-reply, cells 0 and 2 still answer, and cell 1 is reported lost and its
    replacement answers."""
    from evoharness.runtime.cell_backend import CellBackend
    from evoharness.runtime.cells import Role
    from evoharness.runtime.events import CellLost, RoleSwitchDone, SwitchRole
    from evoharness.runtime.synthetic import ReplayWorkload, TimedTraining
    from evoharness.runtime.transport import ProcessTransport

    cfg = make_cfg(cluster={"cells": 3})
    be = CellBackend(
        cfg,
        [Role.ROLLOUT] * 3,
        ProcessTransport(),
        DiesMidReply,
        ReplayWorkload(cfg, SCALE),
        TimedTraining(cfg, SCALE),
        tmp_path,
    )
    try:
        be.transport.post(1, ("call", 10**6, DIE, 0.0))  # a job of no execution: its reply is dropped
        proc = be.transport.procs[1]
        proc.join(timeout=60)
        assert proc.exitcode == -signal.SIGKILL  # died with its reply half in the pipe
        be.apply(SwitchRole(0, Role.TRAIN))
        be.apply(SwitchRole(2, Role.TRAIN))
        want = {
            CellLost(1),
            RoleSwitchDone(0, Role.TRAIN),
            RoleSwitchDone(2, Role.TRAIN),
            RoleSwitchDone(1, Role.ROLLOUT),
        }
        seen: list = []
        deadline = time.monotonic() + 30
        while not want <= set(seen) and time.monotonic() < deadline:
            seen += be.poll(0.5)
    finally:
        be.close()
    assert want <= set(seen), f"heard only {seen}"
    assert seen.count(CellLost(1)) == 1


def test_a_migrate_or_bind_of_an_execution_that_just_finished_is_ignored(make_cfg):
    """Regression: a scheduler decides on the events it has handled, so it may
    migrate (or bind) an execution whose ExecutionFinished is still pending;
    the backend re-bound it, and when that cell left rollout the finished
    execution came back orphaned and was bound again (elastic then saw more
    executions on its cells than outstanding work and failed its room check)."""
    from evoharness.runtime.cells import Role
    from evoharness.runtime.events import ExecutionFinished, ExecutionOrphaned, Migrate, SwitchRole

    cfg = make_cfg(cluster={"cells": 2})
    be = replay_backend(cfg, [Role.ROLLOUT, Role.ROLLOUT], time_scale=SCALE)
    try:
        _group_bound_to(be, 0)
        done = None
        deadline = time.monotonic() + 60
        while done is None and time.monotonic() < deadline:
            done = next((ev for ev in be.poll(0.5) if isinstance(ev, ExecutionFinished)), None)
        assert done is not None and done.cell == 0
        # decided before the scheduler saw `done`: the finished execution is moved to cell 1
        be.apply(Migrate(done.execution, 1))
        be.apply(Bind(done.execution, 1))
        be.apply(SwitchRole(1, Role.TRAIN))  # cell 1 leaves rollout: it must hold nothing
        orphans = [ev for ev in be.poll(1.0) if isinstance(ev, ExecutionOrphaned)]
    finally:
        be.close()
    assert orphans == [] and done.execution not in be.x_cell and be.x_state[done.execution] == "done"


JOB = """
import json, sys
from evoharness.config.sim import SimConfig
from evoharness.runtime.driver import Driver
from evoharness.runtime.sim import build_scheduler
from evoharness.runtime.synthetic import replay_backend

if __name__ == "__main__":
    cfg = SimConfig.model_validate(json.loads(sys.argv[1]))
    sched = build_scheduler("elastic-async", cfg)
    backend = replay_backend(cfg, sched.initial_roles(), time_scale=float(sys.argv[3]), work_dir=sys.argv[4])
    Driver(sched, backend, checkpoint=sys.argv[2]).run()
    backend.close()
"""


def test_sigkill_of_the_job_resumes_from_its_checkpoint(make_cfg, tmp_path):
    """Run elastic-async as its own process with job checkpoints, SIGKILL it
    after its first weight sync, resume in this process: every step runs,
    every execution finishes and trains exactly once across the two runs."""
    import subprocess
    import sys
    import time

    cfg = make_cfg(steps=4, cluster={"cells": 3}, policy={"staleness": 1})
    ckpt = tmp_path / "job.ckpt"
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.Popen(
        [sys.executable, str(script), cfg.model_dump_json(), str(ckpt), "0.01", str(tmp_path / "job")]
    )
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.exists() and proc.poll() is None, "the job ended before its first checkpoint"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    d = Driver.resume(
        ckpt,
        lambda sched, st: replay_backend(
            cfg, [c.role for c in sched.pool.cells], time_scale=SCALE, work_dir=tmp_path / "job", state=st
        ),
    )
    steps_before = d.sched.steps_done
    try:
        stats = d.run()
    finally:
        d.backend.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert 0 <= steps_before < cfg.steps and len(stats.step_end_s) == cfg.steps and d.sched.done
    assert sum(stats.staleness.values()) == n and max(stats.staleness) <= 1
    assert len(d._finished) == n and stats.aborted_turns == 0


def test_the_replay_through_the_gateway_drains_switching_cells(make_cfg):
    """elastic on 3 cell processes with the calls routed by the gateway (`runtime.gateway_cells`):
    cells leaving rollout are drained (their calls re-issued where their executions go next), no
    turn is aborted, every execution trains once."""
    from evoharness.runtime.gateway_cells import CellGateway

    cfg = make_cfg(steps=2, cluster={"cells": 3})
    sched = build_scheduler("elastic", cfg)
    be = replay_backend(cfg, sched.initial_roles(), time_scale=SCALE, gateway=CellGateway(3))
    try:
        stats = Driver(sched, be, stall_s=30).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert sum(stats.staleness.values()) == n and len(stats.step_end_s) == cfg.steps
    assert stats.switches > 0 and be.counts["drains"] > 0
    assert stats.aborted_turns == 0 == be.counts["aborted_turns"]


def test_the_replay_on_one_in_process_cell(make_cfg):
    """colocate on one cell that is the driver process itself (`runtime.transport.InProcessTransport`)."""
    cfg = make_cfg(steps=2, cluster={"cells": 1})
    sched = build_scheduler("colocate", cfg)
    be = replay_backend(cfg, sched.initial_roles(), time_scale=SCALE, backend="inprocess")
    try:
        stats = Driver(sched, be, stall_s=30).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert sum(stats.staleness.values()) == n and len(stats.step_end_s) == cfg.steps
    assert be.pids_seen == {0: {os.getpid()}} and be.counts["calls"] > n
