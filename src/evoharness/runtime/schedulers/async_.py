"""Async (AReaL-style, disaggregated) with a staleness bound η.

A fixed split: cells ``0..train_cells-1`` train (cell 0, the core, among
them), the rest only generate. Rollout never waits for training: a group is
dispatched under the newest policy version v whenever a rollout slot is free,
provided the staleness gate allows it (AReaL, arXiv 2505.24298, §5: reject new
generation when ⌊N_r / B⌋ > i + η, with N_r groups already dispatched, B groups
per batch, i the trainer's version). Batch j holds groups [jG, (j+1)G) in
dispatch order and is trained with weights of version j, so a sample's
staleness j - v is at most η; behaviour versions are kept per sample (by the
world, from `Dispatch.version`). As in AReaL, the trainer starts step j when
batch j is complete; with ``stream=True`` train cells instead claim its
micro-batches as they become trainable. Weight updates pause the rollout cells
(interruptible generation): no agent turn is aborted.

``batch_order = "completion"`` fills batch j in completion order instead
(`batching.StalenessBatcher`: oldest behaviour version first, a unit whose
deadline is not due only if older ones keep their seats), so a straggler no
longer holds up its batch while staleness stays <= η.

A lost satellite (`Scheduler.on_cell_lost`) keeps the split: a rollout cell's
executions are re-issued on the other rollout cells (fewer groups fit until
its replacement serves), a train cell's micro-batch is claimed again by the
other train cells (the core among them) and its replacement switches back to
train.
"""

from __future__ import annotations

from evoharness.runtime.cells import Role
from evoharness.runtime.events import Command, ExecutionFinished, RoleSwitchDone, WeightSyncDone
from evoharness.runtime.schedulers.base import Scheduler
from evoharness.runtime.schedulers.batching import StalenessBatcher


class Async(Scheduler):
    """Args (beyond `Scheduler`'s): train_cells: size of the fixed train
    split (default K // 4, at least 1); staleness: the bound η >= 0;
    stream: train micro-batches before the whole batch is in;
    batch_order: ``dispatch`` (batch j = groups jG..(j+1)G-1) or
    ``completion`` (see the module docstring)."""

    name = "async"

    def __init__(
        self,
        cells: int,
        capacity: int,
        groups_per_step: int,
        group_size: int,
        steps: int,
        train_cells: int | None = None,
        staleness: int = 1,
        train_unit: str = "group",
        stream: bool = False,
        mb_size: int = 1,
        balance_micro_batches: bool = False,
        batch_order: str = "dispatch",
    ):
        if cells < 2:
            raise ValueError("async needs at least 2 cells (one to train, one to generate)")
        self.train_cells = max(1, cells // 4) if train_cells is None else train_cells
        if not 1 <= self.train_cells < cells:
            raise ValueError(f"async train_cells must be in [1, {cells - 1}], got {self.train_cells}")
        if staleness < 0:
            raise ValueError("staleness bound η must be >= 0")
        if batch_order not in ("dispatch", "completion"):
            raise ValueError(f"batch_order must be 'dispatch' or 'completion', got {batch_order!r}")
        self.eta = staleness
        self.stream = stream
        self.batch_order = batch_order
        super().__init__(
            cells, capacity, groups_per_step, group_size, steps, train_unit, mb_size, balance_micro_batches
        )
        if self.pool.rollout_capacity < group_size:
            raise ValueError("async: the rollout cells cannot host one whole group")
        self.next_group = 0
        self.issued = 0  # executions dispatched (including not yet reported)
        self.ready: dict[int, list[int]] = {}  # batch -> trainable executions waiting for its step
        self.mb_pending = self.N
        self.idle_train.extend(range(self.train_cells))
        self.unit = group_size if train_unit == "group" else 1
        self.batcher = StalenessBatcher(self.N // self.unit, staleness)
        self.group_version: dict[int, int] = {}
        self.taken: list[int] = []  # completion order: executions of the batch being filled

    def initial_roles(self) -> list[Role]:
        return [Role.TRAIN if i < self.train_cells else Role.ROLLOUT for i in range(self.K)]

    def start(self) -> list[Command]:
        out: list[Command] = []
        self._maybe_dispatch(out)
        return out

    def _maybe_dispatch(self, out: list[Command]) -> None:
        total = self.steps * self.G
        while (
            self.next_group < total
            and self.next_group // self.G <= self.version + self.eta
            and self.pool.rollout_capacity - (self.issued - self.counters.finished) >= self.group_size
        ):
            self.group_version[self.next_group] = self.version
            self.batcher.dispatched(self.version, self.group_size // self.unit)
            self.dispatch(self.next_group, out)
            self.next_group += 1
            self.issued += self.group_size

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        super().on_finished(ev, out)
        self._maybe_dispatch(out)

    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        if self.batch_order == "completion":
            v = self.group_version[executions[0] // self.group_size]
            for i in range(0, len(executions), self.unit):
                self.batcher.ready(v, tuple(executions[i : i + self.unit]))
        else:
            self.ready.setdefault(executions[0] // self.N, []).extend(executions)
        self._release(out)

    def _release(self, out: list[Command]) -> None:
        """Hand the current batch's trainable executions to the train cells."""
        if self.batch_order == "completion":
            for unit in self.batcher.take():
                self.taken.extend(unit)
            if self.taken and (self.stream or self.batcher.full):
                self.mb_queue.extend(self.taken)
                self.taken.clear()
                self.claim(out)
            return
        ready = self.ready.get(self.steps_done)
        if ready and (self.stream or len(ready) == self.N):
            self.mb_queue.extend(ready)
            ready.clear()
            self.claim(out)

    def replacement_role(self, cell: int) -> Role:
        return self.initial_roles()[cell]

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        """Only a lost cell's replacement switches (the split is fixed)."""
        self.pool.set_role(self.pool.cells[ev.cell], ev.role)
        if ev.role == Role.TRAIN:
            self.idle_train.append(ev.cell)
            self.claim(out)
        else:
            self.route(out)
            self._maybe_dispatch(out)

    def on_step_trained(self, out: list[Command]) -> None:
        self.sync_weights(out)

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        self.version = ev.version
        self.steps_done += 1
        if self.steps_done == self.steps:
            self.done = True
            return
        self.mb_pending = self.N
        self.ready.pop(self.steps_done - 1, None)
        if self.batch_order == "completion":
            self.batcher.next_batch()
        self._release(out)
        self._maybe_dispatch(out)
