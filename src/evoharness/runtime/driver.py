"""The runtime driver: a scheduler's commands become real actions, real completions its events.

The schedulers in `runtime.schedulers` are clock-free objects (``start()``,
``handle(event)`` -> commands). The simulator (`runtime.sim`) is one world
they drive; a `Backend` is another: real processes or Ray actors that host
the executions' model calls (rollout cells) and the forward/backward passes
(train cells). The driver has no scheduling logic of its own: it forwards
every command to the backend, feeds every event the backend reports back to
the scheduler, in order, and checks on the way that the run is sound
(every execution finishes and is trained exactly once, micro-batches only on
train cells, no staleness beyond what the schedule promises) and measures it
(wall time per step, role switches and their latency, aborted turns,
staleness), under verl-style metric names.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (
    CellLost,
    Command,
    Dispatch,
    Event,
    ExecutionFinished,
    ExecutionOrphaned,
    MicroBatchDone,
    RoleSwitchDone,
    RunMicroBatch,
    SwitchRole,
    SyncWeights,
    WeightSyncDone,
)
from evoharness.runtime.schedulers import Scheduler

# what a job checkpoint may name besides the project's own classes (`load_job`)
_SAFE_GLOBALS = (
    {
        ("builtins", n)
        for n in (
            "dict",
            "list",
            "set",
            "frozenset",
            "tuple",
            "int",
            "float",
            "complex",
            "str",
            "bytes",
            "bytearray",
            "bool",
            "slice",
            "range",
        )
    }
    | {("collections", n) for n in ("deque", "Counter", "OrderedDict", "defaultdict")}
    | {("copyreg", "_reconstructor")}
)


def _safe_getattr(obj: Any, name: str) -> Any:
    """``getattr`` as pickle uses it for enum members and bound methods (a scheduler's handler
    table), allowed on the project's own enums and objects only."""
    import enum

    if isinstance(obj, type) and issubclass(obj, enum.Enum) and name in obj.__members__:
        return obj[name]
    attr = getattr(type(obj), name, None)
    if (
        type(obj).__module__.startswith("evoharness.")
        and not name.startswith("__")
        and callable(attr)
        and getattr(attr, "__module__", "").startswith("evoharness.")
    ):
        return getattr(obj, name)  # a method of a project object
    raise pickle.UnpicklingError(f"a job checkpoint may not look up {name!r} on {type(obj).__name__}")


class _JobUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _safe_getattr
        if module == "evoharness" or module.startswith("evoharness."):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__.startswith("evoharness"):
                return obj  # a class of the project (schedulers, events, records)
        raise pickle.UnpicklingError(f"a job checkpoint may not name {module}.{name}")


def load_job(path: str | Path) -> dict[str, Any]:
    """A job checkpoint (`Driver.save`), unpickled with only the project's classes, containers and
    enum members allowed: a checkpoint from elsewhere cannot run code.

    Raises:
        pickle.UnpicklingError: the file names anything else (or is not a job checkpoint).
    """
    with open(path, "rb") as f:
        return _JobUnpickler(f).load()


class Backend(Protocol):
    """A world of K cells that carries out commands and reports events.

    ``apply`` must not block for long (it starts work); ``poll`` returns the
    events that happened since, waiting at most `timeout` seconds for one.
    """

    def apply(self, command: Command) -> None: ...

    def poll(self, timeout: float) -> list[Event]: ...

    def close(self) -> None: ...

    def state(self) -> dict[str, Any]:
        """What a replacement backend needs to carry on (for a job checkpoint)."""
        ...


class DriverError(RuntimeError):
    """The backend reported something impossible, or the run stalled."""


@dataclass
class RunStats:
    """What a driven run measured (seconds; counts)."""

    wall_s: float = 0.0
    step_end_s: list[float] = field(default_factory=list)
    switches: int = 0
    switch_latency_s: dict[str, list[float]] = field(default_factory=lambda: {"to_train": [], "to_rollout": []})
    aborted_turns: int = 0
    cells_lost: int = 0
    micro_batches_reclaimed: int = 0
    staleness: Counter = field(default_factory=Counter)
    micro_batch_s: list[tuple[float, float]] = field(default_factory=list)  # (trajectory tokens, seconds)
    sync_s: list[float] = field(default_factory=list)  # SyncWeights -> WeightSyncDone
    events: int = 0
    commands: int = 0

    def metrics(self) -> dict[str, float]:
        steps = len(self.step_end_s)
        ends = [0.0] + self.step_end_s
        lat = self.switch_latency_s
        return {
            "timing_s/run": self.wall_s,
            "timing_s/step": (ends[-1] / steps) if steps else 0.0,
            "timing_s/step_max": max((b - a for a, b in zip(ends, ends[1:])), default=0.0),
            "runtime/switches": float(self.switches),
            "runtime/aborted_turns": float(self.aborted_turns),
            "runtime/switch_to_train_s": sum(lat["to_train"]) / len(lat["to_train"]) if lat["to_train"] else 0.0,
            "runtime/switch_to_rollout_s": (
                sum(lat["to_rollout"]) / len(lat["to_rollout"]) if lat["to_rollout"] else 0.0
            ),
            "runtime/staleness_max": float(max(self.staleness, default=0)),
            "runtime/cells_lost": float(self.cells_lost),
            "runtime/micro_batches_reclaimed": float(self.micro_batches_reclaimed),
            "runtime/micro_batch_s": (
                sum(s for _, s in self.micro_batch_s) / len(self.micro_batch_s) if self.micro_batch_s else 0.0
            ),
            "runtime/sync_s": sum(self.sync_s) / len(self.sync_s) if self.sync_s else 0.0,
        }


class Driver:
    """Runs `scheduler` on `backend` until the scheduler is done.

    Args:
        scheduler: a fresh scheduler built for the backend's K cells.
        backend: the world.
        stall_s: raise `DriverError` when no event arrives for this long while
            the scheduler still waits (a dead backend must not hang the job).
        checkpoint: if set, a job checkpoint (`save`) is written there at
            every weight sync, before the scheduler sees it. At that moment no
            micro-batch and no role switch is in flight in any schedule, only
            rollout, which the backend can re-issue (or the replacement of a cell
            lost during the sync itself: a restored scheduler gives its place to a
            fresh cell). `Driver.resume` carries
            on from it. (A caller of `steps` may instead `save` when it likes.)
    """

    def __init__(
        self, scheduler: Scheduler, backend: Backend, stall_s: float = 120.0, checkpoint: str | Path | None = None
    ):
        self.sched, self.backend, self.stall_s = scheduler, backend, stall_s
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self._pending: list[Event] | None = None
        self._elapsed = 0.0
        self.stats = RunStats()
        gs = scheduler.group_size
        self._gs = gs
        self._behaviour: dict[int, int] = {}  # execution -> behaviour version
        self._finished: set[int] = set()
        self._trained: set[int] = set()
        self._role = list(scheduler.initial_roles())
        self._switch_t0: dict[int, float] = {}
        self._running: dict[int, tuple[tuple[int, ...], int]] = {}  # train cell -> (executions, version)
        self._tokens: dict[int, int] = {}  # finished execution -> trajectory tokens
        self._op_t0: dict[Any, float] = {}  # ("mb", cell) / ("sync", version) -> when it was commanded
        self._first_step = scheduler.steps_done  # a scheduler resumed at a step boundary (`Colocate.resume_at`)
        self._t0 = 0.0

    def _apply(self, cmds: list[Command]) -> None:
        now = time.monotonic() - self._t0
        for c in cmds:
            self.stats.commands += 1
            if isinstance(c, Dispatch):
                for e in range(c.group * self._gs, (c.group + 1) * self._gs):
                    if e in self._behaviour:
                        raise DriverError(f"execution {e} dispatched twice")
                    self._behaviour[e] = c.version
            elif isinstance(c, RunMicroBatch):
                if self._role[c.cell] != Role.TRAIN:
                    raise DriverError(f"micro-batch on cell {c.cell} in role {self._role[c.cell].name}")
                for e in c.executions:
                    if e not in self._finished or e in self._trained:
                        raise DriverError(f"execution {e} trained before it finished, or twice")
                    self._trained.add(e)
                    self.stats.staleness[c.version - self._behaviour[e]] += 1
                self._running[c.cell] = (c.executions, c.version)
                self._op_t0[("mb", c.cell)] = now
            elif isinstance(c, SyncWeights):
                self._op_t0[("sync", c.version)] = now
            elif isinstance(c, SwitchRole):
                self._role[c.cell] = Role.TO_TRAIN if c.role == Role.TRAIN else Role.TO_ROLLOUT
                self._switch_t0[c.cell] = now
                self.stats.switches += 1
            self.backend.apply(c)

    def _observe(self, ev: Event) -> None:
        now = time.monotonic() - self._t0
        if isinstance(ev, ExecutionFinished):
            if ev.execution in self._finished:
                raise DriverError(f"execution {ev.execution} finished twice")
            self._finished.add(ev.execution)
            self._tokens[ev.execution] = ev.tokens
        elif isinstance(ev, ExecutionOrphaned):
            self.stats.aborted_turns += int(ev.aborted)
        elif isinstance(ev, MicroBatchDone):
            self._running.pop(ev.cell, None)
            if ("mb", ev.cell) in self._op_t0:
                self.stats.micro_batch_s.append(
                    (float(sum(self._tokens.get(e, 0) for e in ev.executions)), now - self._op_t0.pop(("mb", ev.cell)))
                )
        elif isinstance(ev, CellLost):
            # its micro-batch never counted: the scheduler claims it again
            self.stats.cells_lost += 1
            self._role[ev.cell] = Role.TO_ROLLOUT
            self._switch_t0[ev.cell] = now
            lost, version = self._running.pop(ev.cell, ((), 0))
            self._op_t0.pop(("mb", ev.cell), None)
            if lost:
                self.stats.micro_batches_reclaimed += 1
            for e in lost:
                self._trained.discard(e)
                k = version - self._behaviour[e]
                self.stats.staleness[k] -= 1
                if not self.stats.staleness[k]:
                    del self.stats.staleness[k]
        elif isinstance(ev, RoleSwitchDone):
            self._role[ev.cell] = ev.role
            key = "to_train" if ev.role == Role.TRAIN else "to_rollout"
            self.stats.switch_latency_s[key].append(now - self._switch_t0.pop(ev.cell, now))
        elif isinstance(ev, WeightSyncDone):
            self.stats.step_end_s.append(now)
            if ("sync", ev.version) in self._op_t0:
                self.stats.sync_s.append(now - self._op_t0.pop(("sync", ev.version)))

    def run(self) -> RunStats:
        """Drive to the end; returns the measurements.

        Raises:
            DriverError: an impossible report or a stall (see `stall_s`).
        """
        for _ in self.steps():
            pass
        return self.stats

    def steps(self) -> Iterator[int]:
        """Drive to the end, yielding each new weights version as its `WeightSyncDone`
        arrives, before the scheduler sees it: a consistent point (no micro-batch, switch
        or sync in flight in any schedule, only rollout the backend can re-issue, or a
        lost cell's replacement, which a restored scheduler starts afresh) where
        the caller records the step and may `save` a job checkpoint. Time spent by the
        caller between yields is not counted in the run's wall time, nor in the backend's
        role times (its ``paused()`` context, when it has one).

        Raises:
            DriverError: an impossible report or a stall (see `stall_s`).
        """
        self._t0 = time.monotonic() - self._elapsed
        if self.sched.done:  # e.g. a finished run resumed (`Colocate.resume_at(steps)`)
            return
        if self._pending is None:
            self._apply(self.sched.start())
            events: list[Event] = []
            seen = None
        else:  # resumed: the checkpoint was taken at its first event, a weight sync already yielded
            events, self._pending = self._pending, None
            seen = events[0]
        last = time.monotonic()
        while not self.sched.done:
            if not events:
                events = self.backend.poll(timeout=1.0)
            if not events:
                if time.monotonic() - last > self.stall_s:
                    raise DriverError(
                        f"no event for {self.stall_s:.0f} s; {self.sched.name} waits "
                        f"(steps done {self.sched.steps_done})"
                    )
                continue
            last = time.monotonic()
            for i, ev in enumerate(events):
                if isinstance(ev, WeightSyncDone) and ev is not seen:
                    self._pending = events[i:]  # what a checkpoint taken now carries on from
                    if self.checkpoint is not None:
                        self.save(self.checkpoint)
                    paused = time.monotonic()
                    with getattr(self.backend, "paused", contextlib.nullcontext)():
                        yield ev.version
                    self._t0 += time.monotonic() - paused
                    last = time.monotonic()
                    self._pending = None
                self.stats.events += 1
                self._observe(ev)
                self._apply(self.sched.handle(ev))
                if self.sched.done:
                    break
            events = []
        self.stats.wall_s = time.monotonic() - self._t0
        n0, n = self._first_step * self.sched.N, self.sched.steps * self.sched.N
        missing = [e for e in range(n0, n) if e not in self._trained]
        if missing:
            raise DriverError(
                f"{len(missing)} executions of the {self.sched.steps} steps never trained (first: {missing[:5]})"
            )

    _BOOKS = ("_behaviour", "_finished", "_trained", "_role", "_running", "stats", "_first_step", "_tokens")

    def save(self, path: str | Path) -> None:
        """Write a job checkpoint to `path` (atomically): the scheduler, the driver's books,
        the backend's `state()` and the events not yet handled. Only between `steps` yields."""
        if self._pending is None:
            raise DriverError("a job checkpoint is taken at a weight sync (while `steps` yields)")
        path = Path(path)
        state = {
            "scheduler": self.sched,
            "backend": self.backend.state(),
            "pending": list(self._pending),
            "elapsed": time.monotonic() - self._t0,
            **{k: getattr(self, k) for k in self._BOOKS},
        }
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def resume(
        cls,
        checkpoint: str | Path,
        make_backend: Callable[[Scheduler, dict[str, Any]], Backend],
        stall_s: float = 120.0,
    ) -> Driver:
        """A driver that carries on from `checkpoint` (and keeps writing it).

        Args:
            make_backend: builds the replacement world from the restored
                scheduler (its cells' roles) and the saved backend state.
        """
        state = load_job(checkpoint)
        d = cls(state["scheduler"], make_backend(state["scheduler"], state["backend"]), stall_s, checkpoint)
        for k in cls._BOOKS:
            if k in state:  # (older checkpoints lack the newer books: fresh ones)
                setattr(d, k, state[k])
        d._first_step = state.get("_first_step", 0)
        d._pending, d._elapsed = state["pending"], state["elapsed"]
        d._switch_t0 = {}
        return d
