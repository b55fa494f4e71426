"""A lost cell under colocate, async and elastic: SIGKILL of a real cell process mid-run.

A satellite killed while it serves calls: its executions are re-issued on the
other cells and the step completes; killed while it trains a micro-batch: the
micro-batch is claimed again. Either way every execution finishes and trains
exactly once, no agent turn is aborted, the loss is counted, and the
replacement process serves the schedule. The core (cell 0, the only optimizer
state) failing fails the job with a message that names the resume, and the job
resumes from its last checkpoint. The cells replay a simulator workload (`runtime.synthetic`:
timed jobs on cell processes); the slow tests play ALFWorld with a real model (`recipes.rl.RLJob`).
"""

from __future__ import annotations

import pytest
from rl_cells import RAY_STALL_S
from synthetic_agents import KillOnCommand

from evoharness.runtime.cells import Role
from evoharness.runtime.driver import Driver
from evoharness.runtime.events import (
    Bind,
    CellLost,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    MicroBatchDone,
    RoleSwitchDone,
    RunMicroBatch,
    SwitchRole,
    SyncWeights,
    WeightSyncDone,
)
from evoharness.runtime.sim import build_scheduler
from evoharness.runtime.synthetic import replay_backend

SCALE = 0.002  # real seconds per simulated second (the long-tail workload's 2 steps: ~1-3 s)


class Killer(KillOnCommand):
    """Kills the cell of the first command `kill_on` picks (``killed_pid``: its
    process); ``after``: the commands to that cell since."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.after, self.killed_pid = [], None

    def apply(self, c):
        cell = getattr(c, "cell", None)
        if self.killed and cell == self.killed[0]:
            self.after.append(c)
        pid = self.transport.pid(cell) if cell is not None else None
        super().apply(c)
        if self.killed and self.killed_pid is None:
            self.killed_pid = pid


def _nth(kind, cell, n):
    """A `kill_on`: the n-th command of `kind` to `cell` (n from 1)."""
    seen = iter(range(1, 1000))
    return lambda c: isinstance(c, kind) and c.cell == cell and next(seen) == n


def _cfg(make_cfg, policy):
    # async: a train split of 2 (the core and a satellite) beside one rollout cell
    return make_cfg(steps=2, cluster={"cells": 3}, policy={"staleness": 1, "async_train_cells": 2})


def _run(cfg, sched, kill_on, checkpoint=None):
    be = Killer(replay_backend(cfg, sched.initial_roles(), time_scale=SCALE), kill_on)
    try:
        stats = Driver(sched, be, stall_s=30, checkpoint=checkpoint).run()
    finally:
        be.close()
    return be, stats


def _exactly_once(cfg, sched, be, stats):
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert sched.done and len(stats.step_end_s) == cfg.steps
    assert sum(stats.staleness.values()) == n  # the driver checked: each finished and trained once
    assert max(stats.staleness) <= (1 if sched.name == "async" else 0)
    assert stats.aborted_turns == 0 and be.counts["aborted_turns"] == 0
    assert be.killed and stats.cells_lost == 1 == be.counts["cells_lost"] == sched.cells_lost
    lost = be.killed[0]  # a new process, and it answered
    assert be.transport.pid(lost) != be.killed_pid and be.transport.pid(lost) in be.pids_seen[lost]
    assert not sched.replacing and not sched.rejoining and not sched.sync_held


@pytest.mark.parametrize("policy", ["colocate", "async", "elastic"])
def test_a_rollout_cell_killed_mid_step_has_its_executions_reissued(make_cfg, policy):
    """SIGKILL cell 2 (a rollout cell in every schedule) right after its second
    execution was bound to it: the calls in flight there are re-issued elsewhere,
    the step completes, and the replacement serves rollout again."""
    cfg = _cfg(make_cfg, policy)
    sched = build_scheduler(policy, cfg)
    be, stats = _run(cfg, sched, _nth(Bind, 2, 2))
    _exactly_once(cfg, sched, be, stats)
    assert be.counts["reissued_calls"] >= 1 and stats.micro_batches_reclaimed == 0
    assert any(isinstance(c, Bind) for c in be.after)  # the replacement serves the later steps' calls


@pytest.mark.parametrize("policy", ["colocate", "async", "elastic"])
def test_a_train_cell_killed_while_it_holds_a_micro_batch_has_it_reclaimed(make_cfg, policy):
    """SIGKILL the first satellite handed a micro-batch while it trains it: the
    micro-batch goes back to the shared queue and another train cell trains it;
    the replacement joins the role the schedule wants (async: back to its train
    split; colocate, elastic: rollout, from where it trains again later)."""
    cfg = _cfg(make_cfg, policy)
    sched = build_scheduler(policy, cfg)
    be, stats = _run(cfg, sched, lambda c: isinstance(c, RunMicroBatch) and c.cell != 0)
    _exactly_once(cfg, sched, be, stats)
    assert stats.micro_batches_reclaimed == 1
    lost = be.killed[0]
    if policy == "async":  # its replacement switched back to train and trained later micro-batches
        assert sched.pool.cells[lost].role == Role.TRAIN
        assert [type(c) for c in be.after[:1]] == [SwitchRole] and be.after[0].role == Role.TRAIN
    assert any(isinstance(c, RunMicroBatch) for c in be.after)


@pytest.mark.parametrize("policy", ["colocate", "async", "elastic"])
def test_losing_the_core_fails_the_job_and_it_resumes_from_its_checkpoint(make_cfg, policy, tmp_path):
    """SIGKILL the core (cell 0) as it trains step 2, after the first job checkpoint: the
    run fails naming the resume; `Driver.resume` on fresh cells plays the rest,
    and across both runs every execution finishes and trains exactly once."""
    cfg = _cfg(make_cfg, policy)
    sched = build_scheduler(policy, cfg)
    ckpt = tmp_path / "job.ckpt"
    kill_on = lambda c: isinstance(c, RunMicroBatch) and c.cell == 0 and c.version == 1  # noqa: E731
    with pytest.raises(RuntimeError, match="core cell 0 failed.*resume the job from its last checkpoint"):
        _run(cfg, sched, kill_on, checkpoint=ckpt)
    d = _resume(cfg, ckpt)
    assert d._pending[0] == WeightSyncDone(1)  # taken at step 1's weight sync
    _finish_exactly_once(cfg, d)


def _resume(cfg, ckpt) -> Driver:
    """The job resumed from `ckpt` on fresh local cells, in the roles the checkpoint holds."""
    return Driver.resume(
        ckpt, lambda s, st: replay_backend(cfg, [c.role for c in s.pool.cells], time_scale=SCALE, state=st), stall_s=30
    )


def _finish_exactly_once(cfg, d: Driver):
    """Run the resumed job to the end; every execution finished and trained once, no aborted turn."""
    try:
        stats = d.run()
    finally:
        d.backend.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert d.sched.done and len(stats.step_end_s) == cfg.steps and len(d._finished) == n
    assert sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    return stats


class SyncKiller(KillOnCommand):
    """Kills cell `victim` as the first weight sync is commanded."""

    def __init__(self, be, victim):
        super().__init__(be, lambda c: isinstance(c, SyncWeights))
        self.victim = victim

    def apply(self, c):
        self.backend.apply(c)
        if not self.killed and self.kill_on(c):
            self.backend.transport.kill(self.victim)
            self.killed.append(self.victim)


@pytest.mark.parametrize("policy", ["async", "elastic"])
def test_a_checkpoint_taken_while_a_replacement_is_on_its_way_resumes(make_cfg, policy, tmp_path):
    """A satellite dies during the first weight sync (async: train cell 1; elastic: cell 2),
    so the job checkpoint at that sync is taken while its replacement is still starting.
    The job stops there and resumes on fresh cells: the replacement's place goes to a fresh
    cell in the role the schedule wants (async: switched back to train), nothing waits for
    the lost one, and across both runs every execution finishes and trains exactly once."""
    cfg = _cfg(make_cfg, policy)
    sched = build_scheduler(policy, cfg)
    victim = 1 if policy == "async" else 2
    be = SyncKiller(replay_backend(cfg, sched.initial_roles(), time_scale=SCALE), victim)
    d, ckpt = Driver(sched, be, stall_s=30), tmp_path / "job.ckpt"
    try:
        for version in d.steps():
            assert version == 1 and sched.replacing == {victim}  # the replacement is still starting
            d.save(ckpt)
            break  # the job is killed here
    finally:
        be.close()
    d = _resume(cfg, ckpt)
    want = Role.TRAIN if policy == "async" else Role.ROLLOUT
    assert d.sched.pool.cells[victim].role == (Role.TO_TRAIN if want == Role.TRAIN else Role.ROLLOUT)
    stats = _finish_exactly_once(cfg, d)
    assert stats.cells_lost == 1
    assert not d.sched.rejoining and not d.sched.sync_held
    if policy == "async":
        assert d.sched.pool.cells[victim].role == Role.TRAIN


def test_a_weight_sync_waits_for_a_replacement_on_its_way(make_cfg):
    """Colocate, 2 cells, one group: cell 1 is lost while it trains; the core
    trains the rest, but the step's weight sync is held until the replacement
    reports (it then gets the newest weights, and a job checkpoint at the sync
    finds no switch in flight), and goes to both cells."""
    cfg = make_cfg(cluster={"cells": 2}, workload={"groups_per_step": 1})
    sched = build_scheduler("colocate", cfg)
    sched.start()
    for e in range(sched.N):
        sched.handle(ExecutionDispatched(e, 0))
    for e in range(sched.N):
        sched.handle(ExecutionStarted(e, sched.pool.cell_of[e]))
        out = sched.handle(ExecutionFinished(e, sched.pool.cell_of[e], 10 + e))
    assert out == [SwitchRole(0, Role.TRAIN), SwitchRole(1, Role.TRAIN)]
    mb0 = sched.handle(RoleSwitchDone(0, Role.TRAIN))[0]
    mb1 = sched.handle(RoleSwitchDone(1, Role.TRAIN))[0]
    assert (mb0.cell, mb1.cell) == (0, 1)
    assert sched.handle(CellLost(1)) == [] and sched.mb_queue[0] == mb1.executions[0]  # back, first in line
    out, mb = [], mb0
    while sched.mb_pending:  # the core trains everything else
        out = sched.handle(MicroBatchDone(0, mb.executions))
        mb = next((c for c in out if isinstance(c, RunMicroBatch)), None)
    assert out == [] and sched.sync_held  # trained, the sync waits
    assert sched.handle(RoleSwitchDone(1, Role.ROLLOUT)) == [SyncWeights(1, (0, 1))]
    assert not sched.sync_held and sched.pool.cells[1].role == Role.ROLLOUT


def test_scheduler_refuses_the_core_clearly(make_cfg):
    for policy in ("colocate", "async", "elastic", "elastic-async"):
        sched = build_scheduler(policy, _cfg(make_cfg, policy))
        sched.start()
        with pytest.raises(RuntimeError, match=f"{policy}: the core cell 0 failed"):
            sched.handle(CellLost(0))


def _run_job_with_killer(job, killer):
    """Run an `RLJob`'s driver to the end with `killer` on a thread of its own; stop the cells."""
    import threading

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        return job.driver.run()
    finally:
        job.backend.close()
        t.join(timeout=1)


@pytest.mark.slow
def test_elastic_real_model_rollout_cell_killed_plays_the_inprocess_run(model_dir, tmp_path, rl_reference):
    """Elastic on 3 cell processes with the micro model and real ALFWorld games (`recipes.rl.RLJob`):
    SIGKILL a satellite while a policy call runs on it. Its calls are re-issued elsewhere (the same
    per-(episode, turn) sampling seed gives the same completion), and the run reproduces the
    in-process loop's per-step metrics (30 s on the shared 2-core machine under load: 3 processes
    load torch and the model)."""
    import os
    import signal
    import time

    from rl_cells import assert_same_steps, rl_config

    from evoharness.recipes.rl import RLJob

    job = RLJob(rl_config(model_dir, tmp_path, schedule="elastic", cells=3, backend="local"))
    be, sched = job.backend, job.driver.sched
    killed = []

    def killer():
        cells: set[int] = set()
        while not (cells and be.counts["calls"] >= 3):
            time.sleep(0.002)
            try:
                cells = {j[1] for j in list(be._jobs.values()) if j[0] == "call"} - {0}
            except RuntimeError:  # the driver thread changed the dict meanwhile
                cells = set()
        os.kill(be.transport.pid(min(cells)), signal.SIGKILL)
        killed.append(min(cells))

    stats = _run_job_with_killer(job, killer)
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"] == sched.cells_lost
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0
    assert max(stats.staleness) == 0 and sum(stats.staleness.values()) == 8
    assert_same_steps(be.records, rl_reference.metrics)


@pytest.mark.slow
def test_a_lost_all_reduce_member_fails_the_job_naming_the_resume(model_dir, tmp_path):
    """Colocate on 2 real-model cells that all-reduce their gradients (``runtime.trainer =
    allreduce``, `runtime.cell_backend.ModelTraining`): SIGKILL cell 1 in step 2 while it serves
    calls, once the group has formed and stepped. The group cannot continue, so the run fails at
    once (no collective left hanging) with a message that names the resume."""
    import os
    import signal
    import time

    from rl_cells import rl_config

    from evoharness.recipes.rl import RLJob

    job = RLJob(rl_config(model_dir, tmp_path, schedule="colocate", cells=2, backend="local"))
    be = job.backend
    assert be.training.mode == "allreduce" and be.training.members == [0, 1]

    def killer():
        while not be.records:  # step 1's all-reduce done: the group exists
            time.sleep(0.002)
        calls = be.counts["calls"]
        while be.counts["calls"] < calls + 2:
            time.sleep(0.002)
        os.kill(be.transport.pid(1), signal.SIGKILL)

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"cell 1 of the all-reduce group \[0, 1\] failed.*resume the job"):
        _run_job_with_killer(job, killer)
    assert time.monotonic() - t0 < 90 and len(be.records) == 1  # failed in step 2, not after a stall


def test_a_restored_scheduler_switches_a_replacement_that_was_going_to_train(make_cfg):
    """Async: train cell 1 is lost during a weight sync and its replacement, back in rollout,
    is on its way to train when the checkpoint is taken. Restored (as `Driver.resume` does),
    the schedule sends the fresh cell to train with the first event and counts on it again."""
    import pickle

    sched = build_scheduler("async", _cfg(make_cfg, "async"))
    sched.start()
    sched.handle(CellLost(1))
    assert sched.handle(RoleSwitchDone(1, Role.ROLLOUT)) == [SwitchRole(1, Role.TRAIN)]
    restored = pickle.loads(pickle.dumps(sched))
    assert restored.pool.cells[1].role == Role.TO_TRAIN and restored.rejoining == {1}
    first = restored.handle(ExecutionDispatched(0, 0))
    assert first[0] == SwitchRole(1, Role.TRAIN) and SwitchRole(1, Role.TRAIN) not in first[1:]
    assert restored.handle(ExecutionDispatched(1, 0))[:1] != [SwitchRole(1, Role.TRAIN)]  # once
    restored.handle(RoleSwitchDone(1, Role.TRAIN))
    assert 1 in restored.idle_train and not restored.rejoining


def test_colocate_on_ray_reclaims_a_killed_train_actors_micro_batch(make_cfg, ray_head):
    """The same scheduler objects on Ray actors (`runtime.ray_transport.RayTransport`, a local head
    on 127.0.0.1; skipped without Ray): colocate's satellite actor killed while it trains a
    micro-batch; the micro-batch is claimed again and every execution trains exactly once."""
    cfg = _cfg(make_cfg, "colocate")
    sched = build_scheduler("colocate", cfg)
    be = KillOnCommand(
        replay_backend(cfg, sched.initial_roles(), time_scale=SCALE, backend="ray"),
        lambda c: isinstance(c, RunMicroBatch) and c.cell != 0,
    )
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert be.killed and stats.cells_lost == 1 == sched.cells_lost and stats.micro_batches_reclaimed == 1
    assert sched.done and sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    lost = be.killed[0]  # a new actor process, and it answered
    assert len(be.pids_seen[lost]) == 2 and be.transport.pid(lost) in be.pids_seen[lost]
