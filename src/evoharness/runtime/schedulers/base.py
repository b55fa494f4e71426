"""The scheduler interface and what every schedule shares.

A scheduler is a plain object: ``start()`` and ``handle(event)`` return the
commands to carry out (see `runtime.events`). It never sees a clock, so the
same object can drive the discrete-event simulator (`runtime.sim`) or a real
runtime. Shared pieces live here: the gateway queue with least-loaded routing,
the d/p/f counters, GRPO group completion, and a streaming trainer whose train
cells claim micro-batches (one execution's trajectory each) from a shared
queue (QwenGyre, arXiv 2609.33848, "streaming training with dynamic
membership"; weights stay fixed within a step), and what a lost cell costs.

A lost cell (`CellLost`, any schedule): a satellite's running micro-batch goes
back to the front of the shared queue, its executions come back as
`ExecutionOrphaned` and are re-issued on the rollout cells left, and its
replacement reports in rollout (`RoleSwitchDone(cell, ROLLOUT)`); the schedule
then puts it where it wants it (``replacement_role``). Until then the cell gets
no command. Losing the core (cell 0, which holds the optimizer state), or a
member of an all-reduce group of train cells, fails the job, which resumes from
its last checkpoint; how train cells combine gradients is the backend's concern
(`runtime.cell_backend.ModelTraining`).
"""

from __future__ import annotations

from collections import deque

from evoharness.runtime.cells import CellPool, Counters, Role
from evoharness.runtime.events import (
    Bind,
    CellLost,
    Command,
    Dispatch,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionOrphaned,
    ExecutionStarted,
    MicroBatchDone,
    ModelCallFinished,
    ModelCallStarted,
    RoleSwitchDone,
    RunMicroBatch,
    SwitchRole,
    SyncWeights,
    WeightSyncDone,
)


class Scheduler:
    """Base scheduler: subclasses override the ``on_*`` hooks they need.

    Args:
        cells: K.
        capacity: executions one cell hosts at once in rollout (C_e).
        groups_per_step: GRPO groups per training batch.
        group_size: executions per group.
        steps: optimizer steps to run; ``done`` turns True after the last
            weight sync.
        train_unit: when a finished execution becomes trainable: ``group``
            (GRPO: once every member of its group finished, since the
            advantage needs the group's rewards) or ``execution`` (at once,
            e.g. a baseline that does not wait for the group).
        mb_size: executions one train cell takes per micro-batch (its
            data-parallel replicas; 1 by default). A cell claims fewer when
            fewer are waiting rather than wait for more.
        balance_micro_batches: claim the longest waiting executions first
            (LPT) instead of in queue order; with mb_size > 1 they are also
            batched with similar lengths: a cell's replicas run in lockstep
            (FSDP), so mixing a long and a short trajectory idles a replica.
    """

    name = "base"
    observes_model_calls = False

    def __init__(
        self,
        cells: int,
        capacity: int,
        groups_per_step: int,
        group_size: int,
        steps: int,
        train_unit: str = "group",
        mb_size: int = 1,
        balance_micro_batches: bool = False,
    ):
        if train_unit not in ("group", "execution"):
            raise ValueError(f"train_unit must be 'group' or 'execution', got {train_unit!r}")
        self.train_unit = train_unit
        if mb_size < 1:
            raise ValueError(f"mb_size must be >= 1, got {mb_size}")
        self.mb_size = mb_size
        self.balance_micro_batches = balance_micro_batches
        if cells < 1 or capacity < 1 or groups_per_step < 1 or group_size < 1 or steps < 1:
            raise ValueError("cells, capacity, groups_per_step, group_size and steps must be >= 1")
        self.K, self.capacity = cells, capacity
        self.G, self.group_size, self.steps = groups_per_step, group_size, steps
        self.N = groups_per_step * group_size  # executions per step
        self.pool = CellPool(capacity, self.initial_roles())
        self.counters = Counters()
        self.version = 0  # policy version of the newest weights
        self.steps_done = 0
        self.done = False
        self.queue: deque[int] = deque()  # dispatched, waiting for a cell
        self.group_left: dict[int, int] = {}  # group -> members not finished
        self.tokens: dict[int, int] = {}  # finished execution -> trajectory tokens
        self.mb_queue: deque[int] = deque()  # executions ready to train this step
        self.idle_train: deque[int] = deque()  # train cells waiting for a micro-batch
        self.mb_pending = 0  # micro-batches of this step not yet done
        self.running_mb: dict[int, tuple[int, ...]] = {}  # train cell -> executions it is training
        self.cells_lost = 0
        self.replacing: set[int] = set()  # lost cells whose replacement has not reported yet
        self.rejoining: set[int] = set()  # ... or has not landed in the role it is sent to
        self.sync_held = False  # a weight sync waits for them (`sync_weights`)
        self._resume_switch: list[int] = []  # restored: replacements to switch to train (`__setstate__`)
        self._handlers = {
            ExecutionDispatched: self.on_dispatched,
            ExecutionStarted: self.on_started,
            ExecutionFinished: self.on_finished,
            ExecutionOrphaned: self.on_orphaned,
            ModelCallStarted: self.on_model_call,
            ModelCallFinished: self.on_model_call,
            MicroBatchDone: self.on_micro_batch_done,
            RoleSwitchDone: self._role_switch_done,
            WeightSyncDone: self.on_weight_sync_done,
            CellLost: self.on_cell_lost,
        }

    def __setstate__(self, state: dict) -> None:
        """Restored from a job checkpoint (`runtime.driver.Driver.resume`), the schedule drives
        fresh cells: a lost cell's replacement that was on its way (starting, or switching on to
        train: a cell lost during a weight sync) is one of them, in rollout, or, where the
        schedule wants it in train, switched there by the first event handled."""
        self.__dict__.update(state)
        # (a checkpoint pickled before lost cells were handled here: no books, the old handler)
        for k, v in (("replacing", set()), ("rejoining", set()), ("sync_held", False)):
            self.__dict__.setdefault(k, v)
        self._handlers[RoleSwitchDone] = self._role_switch_done
        self._resume_switch = []
        for c in sorted(self.rejoining):
            cell = self.pool.cells[c]
            self.pool.set_role(cell, Role.ROLLOUT)
            if self.replacement_role(c) == Role.TRAIN:
                self.pool.set_role(cell, Role.TO_TRAIN)
                self._resume_switch.append(c)
            else:
                self.rejoining.discard(c)
        self.replacing.clear()

    # ---- interface ---------------------------------------------------------
    def initial_roles(self) -> list[Role]:
        return [Role.ROLLOUT] * self.K

    def start(self) -> list[Command]:
        raise NotImplementedError

    def handle(self, event: Event) -> list[Command]:
        out: list[Command] = []
        if self._resume_switch:
            out += [SwitchRole(c, Role.TRAIN) for c in self._resume_switch]
            self._resume_switch = []
        self._handlers[type(event)](event, out)
        return out

    # ---- shared helpers ----------------------------------------------------
    def dispatch(self, group: int, out: list[Command]) -> None:
        self.group_left[group] = self.group_size
        out.append(Dispatch(group, self.version))

    def route(self, out: list[Command]) -> None:
        """Bind waiting executions to the least-loaded rollout cells."""
        pool, q = self.pool, self.queue
        while q:
            cell = pool.least_loaded()
            if cell is None:
                return
            e = q.popleft()
            pool.bind(e, cell)
            out.append(Bind(e, cell.id))

    def members(self, group: int) -> range:
        return range(group * self.group_size, (group + 1) * self.group_size)

    def claim(self, out: list[Command]) -> None:
        """Idle train cells claim micro-batches from the shared queue, in
        queue order (QwenGyre's shared queue) or, with
        ``balance_micro_batches``, the longest waiting executions first."""
        q = self.mb_queue
        if self.balance_micro_batches and self.idle_train and len(q) > 1:
            # a cell's replicas run in lockstep: batch similar lengths together, longest first (LPT)
            self.mb_queue = q = deque(sorted(q, key=lambda e: -self.tokens[e]))
        while self.idle_train and q:
            execs = tuple(q.popleft() for _ in range(min(self.mb_size, len(q))))
            cell = self.idle_train.popleft()
            self.running_mb[cell] = execs
            out.append(RunMicroBatch(cell, execs, self.version))

    # ---- default event handlers -------------------------------------------
    def on_dispatched(self, ev: ExecutionDispatched, out: list[Command]) -> None:
        self.counters.dispatched += 1
        self.queue.append(ev.execution)
        self.route(out)

    def on_started(self, ev: ExecutionStarted, out: list[Command]) -> None:
        self.counters.started += 1

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        self.counters.finished += 1
        self.tokens[ev.execution] = ev.tokens
        if self.pool.unbind(ev.execution) is None and ev.execution in self.queue:
            self.queue.remove(ev.execution)  # an orphan that finished its last tool call unbound
        g = ev.execution // self.group_size
        self.group_left[g] -= 1
        if self.train_unit == "execution":
            self.on_trainable([ev.execution], out)
        if self.group_left[g] == 0:
            del self.group_left[g]
            if self.train_unit == "group":
                self.on_trainable(list(self.members(g)), out)
        self.route(out)

    def on_orphaned(self, ev: ExecutionOrphaned, out: list[Command]) -> None:
        self.pool.unbind(ev.execution)
        self.queue.appendleft(ev.execution)
        self.route(out)

    def on_model_call(self, ev: ModelCallStarted | ModelCallFinished, out: list[Command]) -> None:
        pass

    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        """Finished executions whose micro-batches may now be trained."""

    def on_micro_batch_done(self, ev: MicroBatchDone, out: list[Command]) -> None:
        self.running_mb.pop(ev.cell, None)
        self.mb_pending -= len(ev.executions)
        self.idle_train.append(ev.cell)
        if self.mb_pending == 0:
            self.on_step_trained(out)
        else:
            self.claim(out)

    def on_step_trained(self, out: list[Command]) -> None:
        pass

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        pass

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        pass

    def sync_cells(self) -> tuple[int, ...]:
        """The cells a weight sync goes to (default: all)."""
        return tuple(range(self.K))

    def sync_weights(self, out: list[Command]) -> None:
        """The optimizer step and weight sync of version + 1 to `sync_cells`, held
        while a lost cell's replacement is on its way: it then joins with the
        newest weights and a job checkpoint at the sync (`runtime.driver`) finds
        no role switch in flight."""
        if self.rejoining:
            self.sync_held = True
        else:
            out.append(SyncWeights(self.version + 1, self.sync_cells()))

    def _role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        if ev.cell in self.replacing:
            self.replacing.discard(ev.cell)
            self.on_replacement(ev, out)
        else:
            self.on_role_switch_done(ev, out)
        if ev.cell in self.rejoining and self.pool.cells[ev.cell].role in (Role.ROLLOUT, Role.TRAIN):
            self.rejoining.discard(ev.cell)
            if self.sync_held and not self.rejoining:
                self.sync_held = False
                out.append(SyncWeights(self.version + 1, self.sync_cells()))

    def on_cell_lost(self, ev: CellLost, out: list[Command]) -> None:
        """A satellite failed: its micro-batch is claimed again (by an idle
        train cell now, else by the next one that frees up), its executions
        follow as `ExecutionOrphaned`, and its replacement is awaited.

        Raises:
            RuntimeError: the core cell 0 failed (it holds the only optimizer
                state); the job resumes from its last checkpoint.
        """
        if ev.cell == 0:
            raise RuntimeError(
                f"{self.name}: the core cell 0 failed (it holds the only optimizer state); "
                "resume the job from its last checkpoint"
            )
        role = self.lose_cell(ev.cell)
        self.replacing.add(ev.cell)
        self.rejoining.add(ev.cell)
        self.cell_lost(ev.cell, role, out)
        self.claim(out)

    def cell_lost(self, cell: int, role: Role, out: list[Command]) -> None:
        """Hook: the schedule's own books after satellite `cell` (in `role`) was lost."""

    def replacement_role(self, cell: int) -> Role:
        """Where the schedule wants the replacement of lost `cell` now (ROLLOUT or TRAIN)."""
        return Role.ROLLOUT

    def on_replacement(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        """The replacement of a lost cell reported in rollout: it serves there
        (as a cell switched back to rollout) or, if `replacement_role` says so,
        moves on to train."""
        if ev.role == Role.ROLLOUT and self.replacement_role(ev.cell) == Role.TRAIN:
            self.pool.set_role(self.pool.cells[ev.cell], Role.TO_TRAIN)
            out.append(SwitchRole(ev.cell, Role.TRAIN))
            return
        self.on_role_switch_done(ev, out)

    def lose_cell(self, cell: int) -> Role:
        """Shared part of losing `cell`: its running micro-batch goes back to
        the front of the queue, it leaves the idle trainers and is marked in
        transfer to rollout until its replacement reports. Returns the role it
        had. (Its executions come back through `ExecutionOrphaned`.)"""
        self.cells_lost += 1
        lost = self.running_mb.pop(cell, ())
        self.mb_queue.extendleft(reversed(lost))
        if cell in self.idle_train:
            self.idle_train.remove(cell)
        c = self.pool.cells[cell]
        role = c.role
        self.pool.set_role(c, Role.TO_ROLLOUT)
        return role
