"""Colocate (verl-style synchronous hybrid engine).

Every cell generates until the batch's last execution finishes; then every
cell switches to training (in parallel), trains the batch, the optimizer step
and weight sync follow, and every cell switches back. The step time is
therefore the slowest execution plus the whole training phase: the straggler
tail leaves the accelerators idle (QwenGyre, arXiv 2609.33848, problem 1).

A lost satellite (`Scheduler.on_cell_lost`): in rollout its executions are
re-issued on the other cells; in training its micro-batch is claimed again by
the others. Its replacement serves rollout, or trains when it reports during
the training phase with micro-batches still waiting; a cell that lands in
train after the step's weight sync goes back to rollout.
"""

from __future__ import annotations

from evoharness.runtime.cells import Role
from evoharness.runtime.events import Command, ExecutionFinished, RoleSwitchDone, SwitchRole, WeightSyncDone
from evoharness.runtime.schedulers.base import Scheduler


class Colocate(Scheduler):
    name = "colocate"

    def resume_at(self, step: int) -> Colocate:
        """Start at step `step` (0 <= step <= steps) as if steps 0..step-1 had run: a
        synchronous schedule has nothing in flight at a weight sync, so its whole
        state is the step count (the in-process runtime resumes from a checkpoint so)."""
        if not 0 <= step <= self.steps or self.counters.dispatched:
            raise ValueError(f"resume_at({step}): before start(), with 0 <= step <= {self.steps}")
        self.steps_done = self.version = step
        self.counters.dispatched = self.counters.started = self.counters.finished = step * self.N
        self.done = step == self.steps
        return self

    def start(self) -> list[Command]:
        out: list[Command] = []
        self._begin_step(out)
        return out

    def _begin_step(self, out: list[Command]) -> None:
        self.mb_pending = self.N
        s = self.steps_done
        for g in range(s * self.G, (s + 1) * self.G):
            self.dispatch(g, out)

    def _rolled_out(self) -> bool:
        """The step's rollout is over: its training (or weight sync) runs."""
        return self.counters.finished >= (self.steps_done + 1) * self.N

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        super().on_finished(ev, out)
        if self.counters.finished == (self.steps_done + 1) * self.N:
            for c in self.pool.cells:
                if c.role == Role.ROLLOUT:  # (not a lost cell's replacement still on its way)
                    self.pool.set_role(c, Role.TO_TRAIN)
                    out.append(SwitchRole(c.id, Role.TRAIN))

    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        self.mb_queue.extend(executions)

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        cell = self.pool.cells[ev.cell]
        self.pool.set_role(cell, ev.role)
        if ev.role == Role.TRAIN and not self._rolled_out():
            # landed after the step's weight sync (a replacement's switch): the next rollout runs
            self.pool.set_role(cell, Role.TO_ROLLOUT)
            out.append(SwitchRole(ev.cell, Role.ROLLOUT))
        elif ev.role == Role.TRAIN:
            self.idle_train.append(ev.cell)
            self.claim(out)
        else:
            self.route(out)

    def replacement_role(self, cell: int) -> Role:
        return Role.TRAIN if self._rolled_out() and self.mb_queue else Role.ROLLOUT

    def on_step_trained(self, out: list[Command]) -> None:
        self.sync_weights(out)

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        self.version = ev.version
        self.steps_done += 1
        self.idle_train.clear()
        if self.steps_done == self.steps:
            self.done = True
            return
        for c in self.pool.cells:
            if c.role == Role.TRAIN:  # (a replacement on its way or already in rollout stays)
                self.pool.set_role(c, Role.TO_ROLLOUT)
                out.append(SwitchRole(c.id, Role.ROLLOUT))
        self._begin_step(out)
