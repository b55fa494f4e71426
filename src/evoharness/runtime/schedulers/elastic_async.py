"""Elastic-async: QwenGyre's elastic cells without the per-step barrier.

The paper's elastic schedule (`elastic.py`) hides training behind the tail of
the *same* step's rollout, so a step lasts at least max(rollout, training).
A tuned streaming async (`async_.py`) overlaps step j's training with step
j+1's rollout instead, but on a fixed split of cells. This schedule does both:

- *Bounded-staleness streaming rollout* (AReaL, arXiv 2505.24298): a group is
  dispatched under the newest version v whenever rollout has room and the gate
  allows it (groups dispatched <= (v + η + 1) x G); executions run across
  weight updates (their cached contexts are re-prefilled, nothing is aborted).
- *Completion-order batches* (`batching.StalenessBatcher`): batch j (trained
  with the weights of version j) takes finished units oldest version first,
  so no straggler holds up a batch, and every sample is trained within η
  versions of its behaviour policy. A unit is a GRPO group (``train_unit =
  "group"``) or one execution.
- *Elastic cells* (QwenGyre, arXiv 2609.33848): the core cell 0 trains from
  the start and holds the only optimizer state; satellites move rollout ->
  train one at a time when the waterlevel rule holds, w(t) <= C_R(t) - C_e,
  *and* trainable micro-batches wait for every train cell and the new one
  (the ready-work gate, ``gate_ready_per_cell`` micro-batches per cell, while
  rollout is still running); the leaving cell's executions migrate (in-flight
  calls re-issued, no aborted turn). A satellite moves train -> rollout when
  it is idle with nothing to claim while dispatchable work waits for rollout
  room. Training streams with dynamic membership from the shared queue;
  weights stay fixed within a step. Transfers and weight syncs never overlap.

So the staleness gate throttles rollout when training lags, the waterlevel
rule then hands the freed cells to training, and idle trainers go back to
rollout once the gate opens: the split follows the load instead of being
fixed, and training is never held to one step's rollout.
"""

from __future__ import annotations

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (
    Command,
    ExecutionFinished,
    MicroBatchDone,
    Migrate,
    RoleSwitchDone,
    SwitchRole,
    WeightSyncDone,
)
from evoharness.runtime.schedulers.base import Scheduler
from evoharness.runtime.schedulers.batching import StalenessBatcher


class ElasticAsync(Scheduler):
    """Args (beyond `Scheduler`'s): staleness: the bound η >= 0;
    gate_ready_per_cell: unclaimed micro-batches per train cell (the moving
    one included) before a satellite moves to train while rollout runs (> 0)."""

    name = "elastic-async"

    def __init__(
        self,
        cells: int,
        capacity: int,
        groups_per_step: int,
        group_size: int,
        steps: int,
        train_unit: str = "group",
        staleness: int = 1,
        gate_ready_per_cell: float = 1.0,
        mb_size: int = 1,
        balance_micro_batches: bool = False,
    ):
        if cells < 2:
            raise ValueError("elastic-async needs at least 2 cells (the core trains, one generates)")
        if staleness < 0:
            raise ValueError("staleness bound η must be >= 0")
        if gate_ready_per_cell <= 0:
            raise ValueError(f"gate_ready_per_cell must be > 0, got {gate_ready_per_cell}")
        super().__init__(
            cells, capacity, groups_per_step, group_size, steps, train_unit, mb_size, balance_micro_batches
        )
        if self.pool.rollout_capacity < group_size:
            raise ValueError("elastic-async: the rollout cells cannot host one whole group")
        self.eta = staleness
        self.gate_ready_per_cell = gate_ready_per_cell
        self.unit = group_size if train_unit == "group" else 1  # executions per unit
        self.batcher = StalenessBatcher(self.N // self.unit, staleness)
        self.group_version: dict[int, int] = {}
        self.next_group = 0
        self.issued = 0  # executions dispatched, reported or not
        self.transferring: int | None = None
        self.syncing = False
        self.sync_waiting = False
        self.train_cells = 1  # cells in TRAIN (the core from the start)
        self.transfers = 0
        self.mb_pending = self.N
        self.idle_train.append(0)

    def initial_roles(self) -> list[Role]:
        return [Role.TRAIN] + [Role.ROLLOUT] * (self.K - 1)

    def start(self) -> list[Command]:
        out: list[Command] = []
        self._dispatch_more(out)
        return out

    # ---- rollout side ------------------------------------------------------
    def _gate_open(self) -> bool:
        """AReaL's staleness gate: another group may start under this version."""
        return self.next_group < self.steps * self.G and self.next_group < (self.version + self.eta + 1) * self.G

    def _room(self) -> bool:
        return self.pool.rollout_capacity - (self.issued - self.counters.finished) >= self.group_size

    def _dispatch_more(self, out: list[Command]) -> None:
        while self._gate_open() and self._room():
            g = self.next_group
            self.group_version[g] = self.version
            self.batcher.dispatched(self.version, self.group_size // self.unit)
            self.dispatch(g, out)
            self.next_group += 1
            self.issued += self.group_size

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        super().on_finished(ev, out)
        self._dispatch_more(out)
        self._balance(out)

    # ---- training side -----------------------------------------------------
    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        v = self.group_version[executions[0] // self.group_size]
        for i in range(0, len(executions), self.unit):
            self.batcher.ready(v, tuple(executions[i : i + self.unit]))
        self._take(out)

    def _take(self, out: list[Command]) -> None:
        for unit in self.batcher.take():
            self.mb_queue.extend(unit)
        self.claim(out)

    def on_micro_batch_done(self, ev: MicroBatchDone, out: list[Command]) -> None:
        self.running_mb.pop(ev.cell, None)
        self.mb_pending -= len(ev.executions)
        self.idle_train.append(ev.cell)
        if self.mb_pending == 0:
            if self.transferring is not None:
                self.sync_waiting = True  # sync once the cell in transfer has landed
            else:
                self._sync(out)
            return
        self.claim(out)
        self._balance(out)

    def _sync(self, out: list[Command]) -> None:
        self.syncing = True  # (no transfer starts while a sync waits or runs)
        self.sync_weights(out)

    def sync_cells(self) -> tuple[int, ...]:
        """Every cell but one lost during the sync (its replacement loads the newest weights)."""
        return tuple(c.id for c in self.pool.cells if c.role in (Role.ROLLOUT, Role.TRAIN))

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        self.syncing = False
        self.version = ev.version
        self.steps_done += 1
        if self.steps_done == self.steps:
            self.done = True
            return
        self.mb_pending = self.N
        self.batcher.next_batch()
        self._take(out)
        self._dispatch_more(out)
        self._balance(out)

    # ---- elastic cells -----------------------------------------------------
    def _balance(self, out: list[Command]) -> None:
        """At most one transfer at a time, none during a weight sync."""
        if self.transferring is not None or self.syncing or self.sync_waiting or self.done:
            return
        if not self._to_train(out):
            self._to_rollout(out)

    def _to_train(self, out: list[Command]) -> bool:
        pool = self.pool
        w = self.counters.outstanding
        if not self.mb_queue or w > pool.rollout_capacity - self.capacity:
            return False
        if w > 0 and len(self.mb_queue) < self.gate_ready_per_cell * (self.train_cells + 1) * self.mb_size:
            return False
        cell = pool.least_loaded(need_free=False)
        if cell is None:
            return False
        pool.set_role(cell, Role.TO_TRAIN)  # takes no new requests
        for e in sorted(cell.bound):
            pool.unbind(e)
            target = pool.least_loaded()
            assert target is not None, "w <= C_R - C_e guarantees room elsewhere"
            pool.bind(e, target)
            out.append(Migrate(e, target.id))
        out.append(SwitchRole(cell.id, Role.TRAIN))
        self.transferring = cell.id
        self.transfers += 1
        return True

    def _to_rollout(self, out: list[Command]) -> bool:
        # rollout is short of room when dispatchable work waits for it, or when dispatched
        # executions wait for a cell (every satellite may have left; the gate may be shut)
        if self.mb_queue or not (self.queue or (self._gate_open() and not self._room())):
            return False
        idle = [c for c in self.idle_train if c != 0]
        if not idle:
            return False
        c = idle[0]
        self.idle_train.remove(c)
        self.pool.set_role(self.pool.cells[c], Role.TO_ROLLOUT)
        out.append(SwitchRole(c, Role.ROLLOUT))
        self.transferring = c
        self.train_cells -= 1
        self.transfers += 1
        return True

    def cell_lost(self, cell: int, role: Role, out: list[Command]) -> None:
        """A lost satellite (`Scheduler.on_cell_lost`): its replacement joins
        rollout and the balance moves it on from there."""
        if role == Role.TRAIN:
            self.train_cells -= 1
        if self.transferring == cell:
            self.transferring = None  # a sync waiting for it waits for its replacement instead

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        cell = self.pool.cells[ev.cell]
        self.pool.set_role(cell, ev.role)
        if self.transferring == ev.cell:
            self.transferring = None
        if ev.role == Role.TRAIN:
            self.train_cells += 1
            self.idle_train.append(ev.cell)
            self.claim(out)
        else:  # back in rollout, with the newest weights (the world loads them on the way)
            self.route(out)
            self._dispatch_more(out)
        if self.sync_waiting:
            self.sync_waiting = False
            if self.mb_pending == 0:
                self._sync(out)
                return
        self._balance(out)
