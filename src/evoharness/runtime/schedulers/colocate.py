"""Colocate (verl-style synchronous hybrid engine).

Every cell generates until the batch's last execution finishes; then every
cell switches to training (in parallel), trains the batch, the optimizer step
and weight sync follow, and every cell switches back. The step time is
therefore the slowest execution plus the whole training phase: the straggler
tail leaves the accelerators idle (QwenGyre, arXiv 2609.33848, problem 1).
"""

from __future__ import annotations

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (Command, ExecutionFinished, RoleSwitchDone, SwitchRole,
                                       SyncWeights, WeightSyncDone)
from evoharness.runtime.schedulers.base import Scheduler


class Colocate(Scheduler):
    name = "colocate"

    def resume_at(self, step: int) -> "Colocate":
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

    def on_finished(self, ev: ExecutionFinished, out: list[Command]) -> None:
        super().on_finished(ev, out)
        if self.counters.finished == (self.steps_done + 1) * self.N:
            for c in self.pool.cells:
                self.pool.set_role(c, Role.TO_TRAIN)
                out.append(SwitchRole(c.id, Role.TRAIN))

    def on_trainable(self, executions: list[int], out: list[Command]) -> None:
        self.mb_queue.extend(executions)

    def on_role_switch_done(self, ev: RoleSwitchDone, out: list[Command]) -> None:
        cell = self.pool.cells[ev.cell]
        self.pool.set_role(cell, ev.role)
        if ev.role == Role.TRAIN:
            self.idle_train.append(ev.cell)
            self.claim(out)
        else:
            self.route(out)

    def on_step_trained(self, out: list[Command]) -> None:
        out.append(SyncWeights(self.version + 1, tuple(range(self.K))))

    def on_weight_sync_done(self, ev: WeightSyncDone, out: list[Command]) -> None:
        self.version = ev.version
        self.steps_done += 1
        self.idle_train.clear()
        if self.steps_done == self.steps:
            self.done = True
            return
        for c in self.pool.cells:
            self.pool.set_role(c, Role.TO_ROLLOUT)
            out.append(SwitchRole(c.id, Role.ROLLOUT))
        self._begin_step(out)
