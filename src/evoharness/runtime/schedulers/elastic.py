"""Elastic (QwenGyre, arXiv 2609.33848): cells move between rollout and train.

All cells start a step in rollout and the step's executions are dispatched at
once. Each time an execution finishes or a transfer completes, the next cell
may move rollout -> train only when the remaining rollout capacity still
covers the outstanding work:

    w(t) = d(t) - f(t)  <=  C_R(t) - C_e

(C_R: capacity of the cells in rollout, C_e: one cell's capacity). Transfers
are serial, the core cell first, then the least-loaded rollout cell. A cell
leaving rollout takes no new requests and its executions are migrated to other
rollout cells; a model call in flight is re-issued there (harness-preserving
role transfer: no agent turn is aborted). Training is streaming with dynamic
membership: a cell joins the running step when its transfer completes and
claims micro-batches from the shared queue (a GRPO group becomes trainable
when all its members finished); weights stay fixed within the step. After the
optimizer step and weight sync every train cell returns to rollout. The
schedule stays on-policy (staleness 0).

``gate_on_ready_work`` (off by default; not in the paper) adds a second
condition on top of the rule: while rollout is still running (w(t) > 0), the
next cell moves only when trainable work is already waiting for it, i.e. the
shared queue holds at least ``gate_ready_per_cell`` unclaimed micro-batches
per train cell counting the one that would move (idle train cells claim at
once, so a non-empty queue means every train cell is busy). Under GRPO a group
trains only when its slowest member finished, so the paper's rule alone moves
cells that then sit idle while their rollout throughput is lost and the
remaining executions are packed onto fewer cells. Once w(t) = 0 the gate no
longer applies.

A lost satellite (`Scheduler.on_cell_lost`): its executions are re-issued on
the rollout cells left (queued while w(t) exceeds their room), a micro-batch
it trained is claimed again by the core or another train cell, a transfer it
was in ends (a weight sync that waited for it goes ahead), and its
replacement joins rollout, from where the waterlevel rule may move it again.
"""

from __future__ import annotations

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (
    Command,
    ExecutionFinished,
    ExecutionStarted,
    Migrate,
    RoleSwitchDone,
    SwitchRole,
    WeightSyncDone,
)
from evoharness.runtime.schedulers.base import Scheduler


class Elastic(Scheduler):
    """Args (beyond `Scheduler`'s): reissue: migrate a leaving cell's
    executions (True, QwenGyre); False switches it bluntly, so the world aborts
    its in-flight turns (an ablation that shows what re-issuing saves).
    gate_on_ready_work: also require waiting trainable work before a transfer
    (see the module docstring); gate_ready_per_cell: how much, in unclaimed
    micro-batches per train cell after the move (> 0)."""

    name = "elastic"

    def __init__(
        self,
        cells: int,
        capacity: int,
        groups_per_step: int,
        group_size: int,
        steps: int,
        train_unit: str = "group",
        reissue: bool = True,
        gate_on_ready_work: bool = False,
        gate_ready_per_cell: float = 1.0,
        mb_size: int = 1,
        balance_micro_batches: bool = False,
    ):
        super().__init__(
            cells, capacity, groups_per_step, group_size, steps, train_unit, mb_size, balance_micro_batches
        )
        if gate_ready_per_cell <= 0:
            raise ValueError(f"gate_ready_per_cell must be > 0, got {gate_ready_per_cell}")
        self.reissue = reissue
        self.gate_on_ready_work = gate_on_ready_work
        self.gate_ready_per_cell = gate_ready_per_cell
        self.transferring: int | None = None  # the cell in rollout -> train transfer
        self.sync_waiting = False
        self.transfers = 0
        self.train_cells = 0  # cells now in TRAIN

    def start(self) -> list[Command]:
        out: list[Command] = []
        self._begin_step(out)
        return out

    def _begin_step(self, out: list[Command]) -> None:
        self.mb_pending = self.N
        s = self.steps_done
        for g in range(s * self.G, (s + 1) * self.G):
            self.dispatch(g, out)

    def maybe_transfer(self, out: list[Command]) -> None:
        """Move the next cell to train if w(t) <= C_R(t) - C_e (and, when
        gated, trainable work is waiting for it)."""
        pool = self.pool
        if self.transferring is not None or self.mb_pending == 0:
            return
        w = self.counters.outstanding
        if w == 0 and not self.mb_queue:
            return  # nothing left for one more trainer to do
        if w > pool.rollout_capacity - self.capacity:
            return
        if self.gate_on_ready_work and w > 0 and not self.ready_work_waiting():
            return
        core = pool.cells[0]
        cell = core if core.role == Role.ROLLOUT else pool.least_loaded(need_free=False)
        if cell is None:
            return
        pool.set_role(cell, Role.TO_TRAIN)  # stops taking new requests
        for e in sorted(cell.bound):
            pool.unbind(e)
            if self.reissue:
                target = pool.least_loaded()
                assert target is not None, "w <= C_R - C_e guarantees room elsewhere"
                pool.bind(e, target)
                out.append(Migrate(e, target.id))
        out.append(SwitchRole(cell.id, Role.TRAIN))
        self.transferring = cell.id
        self.transfers += 1

    def ready_work_waiting(self) -> bool:
        """Enough unclaimed micro-batches that the moved cell, and every
        current train cell, has one waiting."""
        return len(self.mb_queue) >= self.gate_ready_per_cell * (self.train_cells + 1) * self.mb_size

    def on_started(self, ev: ExecutionStarted, out: list[Command]) -> None:
        super().on_started(ev, out)
        self.maybe_transfer(out)  # a small batch may not need every cell

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        super().on_finished(ev, out)
        self.maybe_transfer(out)

    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        self.mb_queue.extend(executions)
        self.claim(out)

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        cell = self.pool.cells[ev.cell]
        self.pool.set_role(cell, ev.role)
        if ev.role == Role.TRAIN:
            self.transferring = None
            self.train_cells += 1
            self.idle_train.append(ev.cell)
            if self.sync_waiting:
                self.sync_waiting = False
                self._sync(out)
                return
            self.claim(out)
            self.maybe_transfer(out)
        else:
            self.route(out)

    def cell_lost(self, cell: int, role: Role, out: list[Command]) -> None:
        if role == Role.TRAIN:
            self.train_cells -= 1
        if self.transferring == cell:
            self.transferring = None
            if self.sync_waiting:
                self.sync_waiting = False
                self._sync(out)
        self.maybe_transfer(out)

    def on_replacement(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        super().on_replacement(ev, out)
        self.maybe_transfer(out)

    def on_step_trained(self, out: list[Command]) -> None:
        if self.transferring is not None:
            self.sync_waiting = True  # sync once the cell in transfer has landed
        else:
            self._sync(out)

    def _sync(self, out: list[Command]) -> None:
        self.sync_weights(out)

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        self.version = ev.version
        self.steps_done += 1
        self.idle_train.clear()
        self.train_cells = 0
        if self.steps_done == self.steps:
            self.done = True
            return
        for c in self.pool.cells:
            if c.role == Role.TRAIN:
                self.pool.set_role(c, Role.TO_ROLLOUT)
                out.append(SwitchRole(c.id, Role.ROLLOUT))
        self._begin_step(out)


class ElasticGated(Elastic):
    """`Elastic` with ``gate_on_ready_work=True``: a name of its own so one run
    can put both side by side (``--policies colocate,elastic,elastic-gated``)."""

    name = "elastic-gated"

    def __init__(self, *args, **kwargs):
        kwargs["gate_on_ready_work"] = True
        super().__init__(*args, **kwargs)
