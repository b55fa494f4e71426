"""K cells driven by a scheduler: the `runtime.driver.Backend` of every real run.

A `CellBackend` is assembled from three parts with small interfaces:

- a transport (`runtime.transport`): where the cells' workers run (in-process, processes, Ray);
- a training coordinator: what a micro-batch and a weight sync send to the cells
  (`ModelTraining`: a trainer rank per train cell, a data-parallel group or the core alone;
  `runtime.synthetic.TimedTraining`: the replay's timed jobs);
- an `AgentWorkload`: the agents and how their finished executions train (ALFWorld games,
  repository tasks in `recipes`; the timed replay of a simulator workload, `runtime.synthetic`).

The agents' loops live in the driver process, as they live in a harness behind the gateway:
execution ``e`` asks its workload for its next model call, the call goes to the cell the
scheduler bound ``e`` to (directly, or through the gateway with ``via_gateway``: routed by
execution, re-issued on a drained cell's successor), and the answer goes back to the workload.
A migrated call is cancelled on its old cell and re-issued on the new one (QwenGyre's
harness-preserving transfer); a cell that leaves rollout without migrating orphans its
executions (a turn in flight is aborted and counted). The backend measures what the simulator
measures (idle ratio per role, switches, aborted turns) and writes the run's call trace
(``trace.jsonl``, the simulator's format) as each step's executions are recorded.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import queue
import time
from pathlib import Path
from typing import Any, Protocol

from evoharness.config.sim import SimConfig
from evoharness.runtime.cells import Role
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
    Migrate,
    RoleSwitchDone,
    RunMicroBatch,
    SwitchRole,
    SyncWeights,
    WeightSyncDone,
)
from evoharness.runtime.transport import Transport

_WAIT = ("run_job",)  # the key of a job `run_job` waits for


class AgentWorkload(Protocol):
    """The agents a `CellBackend` plays, and how their finished executions train. Execution
    ``e = u·N + g·G + k`` is member ``k`` of GRPO group ``g`` of step ``u``."""

    def start(self, e: int) -> None:
        """Open execution e (a start that fails ends it: `finished`)."""
        ...

    def request(self, e: int) -> Any | None:
        """The payload of e's next model call (the same one again while it is unanswered); None while
        e waits for something else (an agent on a thread) or has finished."""
        ...

    def reply(self, e: int, result: dict[str, Any]) -> None:
        """e's model call answered: ``{"result": the cell's answer, "seconds", "version"}``."""
        ...

    # optional: ``call_seconds(e) -> float``, how long e's pending call lasts on a timed cell
    # (`runtime.cell.TimedCell`, the replay's `runtime.synthetic.ReplayWorkload`); 0 without it

    def tool_delay(self, e: int) -> float:
        """Seconds from a call's answer to e's next request (0 when the tool ran inline)."""
        ...

    def finished(self, e: int) -> bool: ...

    def woken(self) -> list[int]:
        """Executions whose request became ready, or that finished, on their own since the last call."""
        ...

    def tokens(self, e: int) -> int:
        """e's trajectory tokens so far (the scheduler's and the simulator's work measure)."""
        ...

    def calls(self, e: int) -> list[dict[str, Any]]:
        """e's model calls for the trace: ``prompt_tokens``, ``completion_tokens``, ``policy_version``."""
        ...

    def trace_key(self, e: int) -> tuple[str, str, float]:
        """(task id, episode id, wall seconds) of a finished execution, for the trace."""
        ...

    def micro_batch(self, executions: tuple[int, ...], version: int) -> Any | None:
        """The rows a streamed micro-batch of these finished executions trains at weights
        `version`; None: nothing trains before the weight sync (the step has several updates)."""
        ...

    def sync(self, version: int, executions: list[int], ranks: int) -> list[dict[str, Any]]:
        """Step ``version - 1``'s update plan (the trained `executions`) for each of `ranks`
        train ranks: ``{"updates", "lr", "step", "scale"}`` (`train.step.run_updates`)."""
        ...

    def step_done(
        self, version: int, executions: list[int], stats: dict[str, Any], timing: dict[str, float]
    ) -> dict[str, Any]:
        """Step ``version - 1`` trained: its metrics record; consolidate what the next step reads.
        `stats`: ``micro`` (the streamed micro-batches' statistics), ``ranks`` (per train rank,
        per update), ``scale`` (the stream's N/M): `train.step.merged_update_metrics`' arguments."""
        ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class CellBackend:
    """K cells (module docstring).

    Args:
        sim: the batch shape (``workload.groups_per_step`` P, ``group_size`` G) and the cluster.
        roles: the scheduler's initial roles, one per cell.
        transport: where the cells run.
        make_worker: builds cell c's worker where it runs (`runtime.cell.ModelCell` / `TimedCell`; picklable).
        workload: the agents.
        training: the training coordinator (`ModelTraining`, `runtime.synthetic.TimedTraining`).
        work_dir: the call trace and the training coordinator's files.
        gateway: the executions' calls go through a gateway (`runtime.gateway_cells.CellGateway`).
        state: a job checkpoint's `state()` to carry on from.
        ready_timeout_s: how long the cells may take to start.

    Raises:
        RuntimeError: a cell did not start (or the transport could not place the cells).
    """

    def __init__(
        self,
        sim: SimConfig,
        roles: list,
        transport: Transport,
        make_worker: Any,
        workload: AgentWorkload,
        training: Any,
        work_dir: str | Path,
        gateway: Any = None,
        state: dict[str, Any] | None = None,
        ready_timeout_s: float = 300.0,
    ):
        if len(roles) != sim.cluster.cells:
            raise ValueError(f"{len(roles)} roles for {sim.cluster.cells} cells")
        self.sim, self.transport, self.workload, self.training = sim, transport, workload, training
        self.work_dir = Path(work_dir)
        self.G = sim.workload.group_size
        self.N = sim.workload.groups_per_step * self.G
        self.K = len(roles)
        self.role = list(roles)
        self.gw = gateway
        self._call_s = getattr(workload, "call_seconds", None)  # a timed workload's call durations
        self._token = 0
        self._jobs: dict[int, tuple] = {}  # token -> (kind, cell, key)
        self.x_cell: dict[int, int] = {}  # execution -> cell it is bound to
        self.x_call: dict[int, int] = {}  # execution -> token of its call in flight
        self.x_state: dict[int, str] = {}  # queued | call | tool | wait (orphaned) | pending (agent) | done
        self.x_times: dict[int, list[list[float]]] = {}  # execution -> [issue, answer, cell] per call (trace)
        self._tools: list[tuple[float, int]] = []  # (due, execution)
        self._events: list[Event] = []
        self._gw_jobs: dict[int, Any] = {}  # gateway mode: cell job token -> the gateway call waiting on it
        self._gw_tok: dict[Any, int] = {}  # and back
        self._gw_done: queue.Queue = queue.Queue()
        self.records: list[dict[str, Any]] = []  # one per weight sync (the workload's step record)
        self._waited: dict[int, Any] = {}  # `run_job` results by token
        self.counts = {
            "calls": 0,
            "reissued_calls": 0,
            "aborted_turns": 0,
            "micro_batches": 0,
            "cells_lost": 0,
            "migrations": 0,
        }
        self.pids_seen: dict[int, set[int]] = {c: set() for c in range(self.K)}
        self._t0 = time.monotonic()
        # idle accounting (as the simulator's): per cell, jobs running and seconds per role, busy seconds
        self._busy, self._since = [0] * self.K, [time.monotonic()] * self.K
        self._role_s = {r: [0.0] * self.K for r in Role}
        self._busy_s = {r: [0.0] * self.K for r in Role}
        if self.gw is not None:
            self.gw.on_done = lambda *done: self._gw_done.put(done)
            for c, r in enumerate(roles):
                if r != Role.ROLLOUT:
                    self.gw.drain(c, [])  # not serving until it switches to rollout
        self.training.attach(self, state.get("training") if state else None)
        try:
            transport.start(self.K, make_worker)
        except BaseException:  # e.g. a cluster that cannot place the cells: release what was started
            self.close()
            raise
        self._wait_ready(ready_timeout_s)
        if state is not None:
            self._restore(state)

    def _wait_ready(self, timeout_s: float) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(ready) < self.K:
            dead = self.transport.dead_cells()
            if dead or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(
                    f"cells {dead or sorted(set(range(self.K)) - ready)} did not start "
                    f"({'process died' if dead else f'{timeout_s:.0f} s timeout'})"
                )
            reply = self.transport.next_reply(1.0)
            if reply is not None and reply[2] == "ready":
                ready.add(reply[0])
                self.pids_seen[reply[0]].add(reply[1])
        self._since = [time.monotonic()] * self.K  # idle ratios count from here, not the model loading

    # ---- job checkpoints ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a replacement backend needs (`Driver.save`): the executions' progress, the
        workload's books, the training coordinator's. Taken at a weight sync: no micro-batch,
        switch or sync is in flight then, only rollout, which a replacement re-issues."""
        now = time.monotonic()
        return {
            "x_cell": dict(self.x_cell),
            "x_state": dict(self.x_state),
            "tools": [(max(0.0, t - now), e) for t, e in self._tools],
            "counts": dict(self.counts),
            "x_times": dict(self.x_times),
            "workload": self.workload.state(),
            "training": self.training.state(),
        }

    def _restore(self, st: dict[str, Any]) -> None:
        """Carry on from `state()`: a call that was in flight is issued again on its cell."""
        self.x_cell, self.x_state = dict(st["x_cell"]), dict(st["x_state"])
        self.x_times = dict(st.get("x_times", {}))
        self.counts.update(st["counts"])
        self.workload.restore(st["workload"])
        now = time.monotonic()
        self._tools = [(now + r, e) for r, e in st["tools"]]
        heapq.heapify(self._tools)
        for e, x in sorted(self.x_state.items()):
            if x == "call":
                self.counts["reissued_calls"] += 1
                self._next_call(e)

    # ---- jobs -------------------------------------------------------------------------
    def send(self, cell: int, kind: str, payload: Any, seconds: float = 0.0, key: Any = None) -> int:
        """Queue a job on `cell`; `key` is what its reply is matched to."""
        if kind in ("call", "train", "step"):
            self._tick(cell, +1)
        self._token += 1
        self._jobs[self._token] = (kind, cell, key)
        self.transport.post(cell, (kind, self._token, payload, seconds))
        return self._token

    def run_job(self, cell: int, kind: str, payload: Any, timeout_s: float = 3600.0) -> Any:
        """Run one job on `cell` and wait for its result (a checkpoint's ``save``, an evaluation's
        ``publish``); other replies meanwhile are handled as usual.

        Raises:
            RuntimeError: the cell died or did not answer within `timeout_s`.
        """
        tok = self.send(cell, kind, payload, key=_WAIT)
        deadline = time.monotonic() + timeout_s
        while tok not in self._waited:
            if cell in self.transport.dead_cells() or time.monotonic() > deadline:
                raise RuntimeError(f"cell {cell} did not finish its {kind} job")
            reply = self.transport.next_reply(0.2)
            if reply is not None:
                self._on_job(*reply)
        return self._waited.pop(tok)

    def emit(self, ev: Event) -> None:
        self._events.append(ev)

    def _tick(self, c: int, busy: int = 0, role: Role | None = None) -> None:
        """Close cell c's accounting segment, then change its running jobs by `busy` and/or its role."""
        now = time.monotonic()
        dt, r = now - self._since[c], self.role[c]
        self._role_s[r][c] += dt
        if self._busy[c] > 0:
            self._busy_s[r][c] += dt
        self._since[c] = now
        self._busy[c] = max(0, self._busy[c] + busy)
        if role is not None:
            self.role[c] = role

    @contextlib.contextmanager
    def paused(self):
        """The driver is away (recording a step, writing a checkpoint): that interval counts in
        no role's time, as it counts in no step's (`Driver.steps`)."""
        for c in range(self.K):
            self._tick(c)
        try:
            yield
        finally:
            self._since = [time.monotonic()] * self.K

    def idle(self) -> dict[str, float]:
        """Share of each role's time a cell ran nothing (no call in rollout, no micro-batch in
        train), over all cells, as the simulator's idle ratios."""
        for c in range(self.K):
            self._tick(c)
        out = {}
        for r, name in ((Role.ROLLOUT, "idle_rollout"), (Role.TRAIN, "idle_train")):
            t = sum(self._role_s[r])
            out[name] = 1.0 - sum(self._busy_s[r]) / t if t else 0.0
        return out

    # ---- executions ---------------------------------------------------------------------
    def _next_call(self, e: int) -> None:
        """Issue e's next model call on its cell (or through the gateway), or wait for the agent."""
        payload = self.workload.request(e)
        if payload is None:
            if self.workload.finished(e):
                self._finish(e)
            else:
                self.x_state[e] = "pending"  # the agent is busy (a tool on its thread): `woken` resumes it
            return
        times = self.x_times.setdefault(e, [])
        if self.x_state.get(e) != "call":  # a new call (a re-issue keeps its first issue time)
            times.append([time.monotonic() - self._t0, 0.0, -1])
        self.x_state[e] = "call"
        self.counts["calls"] += 1
        if self.gw is None:
            self.x_call[e] = self.send(self.x_cell[e], "call", payload, self._seconds(e), key=e)
            return
        self._token += 1
        self.x_call[e] = self._token
        if isinstance(payload, dict) and payload.get("episode_id"):  # its records under the episode's id
            self.gw.name(e, payload["episode_id"])
        if e in self.x_cell:
            self.gw.bind(e, self.x_cell[e])
        else:
            self.gw.hold(e)  # a resumed call of an execution not placed yet
        self.gw.call(e, self._token, payload)

    def _seconds(self, e: int) -> float:
        """How long e's pending call lasts on a timed cell (0: a model cell answers when it is done)."""
        return self._call_s(e) if self._call_s is not None else 0.0

    def _cancel_call(self, e: int) -> None:
        tok = self.x_call.pop(e)
        if self._jobs.pop(tok, None) is not None:
            self._tick(self.x_cell[e], -1)
            self.transport.post(self.x_cell[e], ("cancel", tok))

    def _answered(self, e: int, cell: int, result: dict[str, Any]) -> None:
        self.x_times[e][-1][1:] = [time.monotonic() - self._t0, cell]
        self.workload.reply(e, result)
        self.x_state[e] = "tool"
        heapq.heappush(self._tools, (time.monotonic() + self.workload.tool_delay(e), e))

    def _on_tool(self, e: int) -> None:
        """e's tool is done: its next call, or its end (orphaned: it waits for a bind)."""
        if self.x_state.get(e) not in ("tool", "pending"):
            return  # a second wake-up of a turn already moved on
        if self.workload.finished(e):
            self._finish(e)
        elif e in self.x_cell:
            self._next_call(e)
        else:
            self.x_state[e] = "wait"

    def _finish(self, e: int) -> None:
        self.x_state[e] = "done"
        cell = self.x_cell.pop(e, -1)
        if self.gw is not None:
            self.gw.release(e)
        self._events.append(ExecutionFinished(e, cell, max(1, self.workload.tokens(e))))

    # ---- commands -----------------------------------------------------------------------
    def apply(self, c: Command) -> None:
        if isinstance(c, Dispatch):
            for e in range(c.group * self.G, (c.group + 1) * self.G):
                self.x_state[e] = "queued"
                self._events.append(ExecutionDispatched(e, c.group))
        elif isinstance(c, (Bind, Migrate)) and self.x_state[c.execution] == "done":
            # it finished while the command was decided (its ExecutionFinished is not handled yet):
            # binding it again would leave a phantom on the cell, orphaned when the cell leaves rollout
            return
        elif isinstance(c, Bind):
            self._bind(c.execution, c.cell)
        elif isinstance(c, Migrate):
            self._migrate(c.execution, c.cell)
        elif isinstance(c, SwitchRole):
            if self.role[c.cell] == Role.ROLLOUT:
                self._leave_rollout(c.cell)
            self._tick(c.cell, role=Role.TO_TRAIN if c.role == Role.TRAIN else Role.TO_ROLLOUT)
            self.training.switch(c.cell, c.role)
        elif isinstance(c, RunMicroBatch):
            self.counts["micro_batches"] += 1
            self.training.micro_batch(c)
        elif isinstance(c, SyncWeights):
            self.training.sync(c)
        else:
            raise ValueError(f"unknown command {c!r}")

    def _bind(self, e: int, cell: int) -> None:
        st = self.x_state[e]
        self.x_cell[e] = cell
        if self.gw is not None:
            self.gw.bind(e, cell)  # a held call of it (a drained cell's) goes there now
        if st == "queued":
            self._events.append(ExecutionStarted(e, cell))
            self.workload.start(e)
            self._next_call(e)
        elif st == "wait":
            self._next_call(e)

    def _migrate(self, e: int, cell: int) -> None:
        self.counts["migrations"] += 1
        if self.gw is not None:  # the gateway re-issues a call in flight on the new cell
            old, self.x_cell[e] = self.x_cell.get(e), cell
            if old is None:
                self.gw.bind(e, cell)
            else:
                self.gw.migrate(e, old, cell)
        elif self.x_state[e] == "call":
            self._cancel_call(e)
            self.x_cell[e] = cell
            self.counts["reissued_calls"] += 1
            self._next_call(e)  # re-issued: the harness sees no error
        else:
            self.x_cell[e] = cell

    def _leave_rollout(self, cell: int) -> None:
        held = sorted(x for x, c in self.x_cell.items() if c == cell)
        if self.gw is not None:
            # drain through the gateway: the cell's calls wait there for their executions'
            # next cells and are re-issued on them; no turn is aborted
            for e in held:
                del self.x_cell[e]
                self._events.append(ExecutionOrphaned(e, cell, False))
            self.gw.drain(cell, held)
            return
        for e in held:
            aborted = self.x_state[e] == "call"
            if aborted:
                self._cancel_call(e)
                self.x_state[e] = "wait"
                self.counts["aborted_turns"] += 1
            del self.x_cell[e]
            self._events.append(ExecutionOrphaned(e, cell, aborted))

    # ---- events -------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        while not self._events:
            self._pump()
            now = time.monotonic()
            while self._tools and self._tools[0][0] <= now:
                self._on_tool(heapq.heappop(self._tools)[1])
            for e in self.workload.woken():
                if self.x_state.get(e) in ("tool", "pending"):
                    heapq.heappush(self._tools, (time.monotonic(), e))
            if self._events:
                break
            for c in self.transport.dead_cells():
                self._lose(c)
            if self._events:
                break
            wait = min(deadline, self._tools[0][0] if self._tools else deadline) - now
            if wait <= 0 and now >= deadline:
                break
            # agents on threads and gateway answers arrive elsewhere: look again soon
            short = self.gw is not None or any(x == "pending" for x in self.x_state.values())
            reply = self.transport.next_reply(max(0.0, min(wait, 0.005 if short else 0.2)))
            if reply is not None:
                self._on_job(*reply)
        out, self._events = self._events, []
        return out

    def _on_job(self, cell: int, pid: int, kind: str, token: int, result: Any) -> None:
        self.pids_seen[cell].add(pid)
        if token in self._gw_jobs:  # a call the gateway routed here: its answer goes back there
            self._jobs.pop(token, None)
            self._tick(cell, -1)
            fut = self._gw_jobs.pop(token)
            self._gw_tok.pop(fut, None)
            self.gw.resolve(fut, result)
            return
        job = self._jobs.pop(token, None)
        if job is None:
            return  # cancelled after it completed
        if job[2] is _WAIT:
            self._waited[token] = result
            return
        if kind in ("call", "train", "step"):
            self._tick(cell, -1)
        if kind == "call":
            e = job[2]
            if self.x_call.get(e) != token:
                return
            del self.x_call[e]
            self._answered(e, cell, result)
        elif kind == "switch":
            self._tick(cell, role=Role(result))
            self._events.append(RoleSwitchDone(cell, Role(result)))
            if self.gw is not None and Role(result) == Role.ROLLOUT:
                self.gw.resume(cell)
        else:
            self.training.on_reply(cell, kind, job[2], result)

    def _pump(self) -> None:
        """Gateway mode: post the cell jobs the gateway routed, cancel the ones it gave up,
        and take the answered calls."""
        if self.gw is None:
            return
        while True:
            try:
                kind, cell, e, payload, fut = self.gw.pending.get_nowait()
            except queue.Empty:
                break
            if kind == "call":
                tok = self.send(cell, "call", payload, self._seconds(e), key=("gateway", e))
                self._gw_jobs[tok], self._gw_tok[fut] = fut, tok
            else:
                tok = self._gw_tok.pop(fut, None)
                if tok is not None and self._gw_jobs.pop(tok, None) is not None:
                    job = self._jobs.pop(tok, None)
                    if job is not None:
                        self._tick(job[1], -1)
                        self.transport.post(job[1], ("cancel", tok))
        while True:
            try:
                e, call_id, out, attempts = self._gw_done.get_nowait()
            except queue.Empty:
                break
            if self.x_call.get(e) != call_id:
                continue
            if isinstance(out, BaseException):
                raise RuntimeError(f"execution {e}'s model call failed in the gateway: {out}") from out
            del self.x_call[e]
            self.counts["reissued_calls"] += len(attempts) - 1
            self._answered(e, int(attempts[-1].backend.removeprefix("cell")), out.detail)
        for k in ("drains", "drain_s_total", "drain_s_max"):
            self.counts[k] = self.gw.counts[k]

    def _lose(self, c: int) -> None:
        """Cell c's worker died: report it, orphan its executions (their calls are re-issued when
        they are bound again), drop its jobs and start a replacement that joins rollout.

        Raises:
            RuntimeError: the training coordinator cannot go on without it (`ModelTraining.cell_lost`).
        """
        self.training.cell_lost(c)
        self.counts["cells_lost"] += 1
        self._events.append(CellLost(c))
        held = sorted(x for x, cell in self.x_cell.items() if cell == c)
        if self.gw is not None:
            self.gw.lost(c, held)  # its calls wait in the gateway and are re-issued on the next bind
        for e in held:
            if self.x_state[e] == "call" and self.gw is None:
                self._jobs.pop(self.x_call.pop(e), None)
                self.x_state[e] = "wait"
                self.counts["reissued_calls"] += 1
            del self.x_cell[e]
            self._events.append(ExecutionOrphaned(e, c, False))
        for token, job in [(t, j) for t, j in self._jobs.items() if j[1] == c]:
            del self._jobs[token]
            if token in self._gw_jobs:
                fut = self._gw_jobs.pop(token)
                self._gw_tok.pop(fut, None)
                self.gw.fail(fut, f"cell {c} lost")
            else:
                self.training.job_lost(c, job[0], job[2], token)
        self.transport.respawn(c)
        self._tick(c, -self._busy[c], Role.TO_ROLLOUT)
        self.training.switch(c, Role.ROLLOUT)

    # ---- steps ---------------------------------------------------------------------------
    def record_step(self, version: int, executions: list[int], stats: dict[str, Any], timing: dict[str, float]) -> None:
        """Step ``version - 1`` trained (the training coordinator calls this before the weight sync
        completes): the workload's record, and the executions' call trace."""
        self._write_trace(executions, version)
        self.records.append(self.workload.step_done(version, executions, stats, timing))

    def _write_trace(self, execs: list[int], step: int) -> None:
        """Append the executions' calls to ``trace.jsonl``, one trajectory a line in the simulator's
        trace format (docs/simulator.md: tokens and start/end seconds per call), so `evoharness
        simulate --workload` replays this run."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.work_dir / "trace.jsonl", "a") as f:
            for e in execs:
                calls, times = self.workload.calls(e), self.x_times.pop(e, [])
                if not calls:
                    continue
                task_id, episode_id, wall_s = self.workload.trace_key(e)
                turns = [
                    {**call, "start": round(a, 4), "end": round(b, 4), **({"cell": int(c)} if c >= 0 else {})}
                    for call, (a, b, c) in zip(calls, times)
                ]
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "task_id": f"{task_id}#u{e // self.N}",
                            "episode_id": episode_id,
                            "wall_s": wall_s,
                            "turns": turns,
                        }
                    )
                    + "\n"
                )

    def close(self) -> None:
        if self.gw is not None:
            self.gw.close()
        self.workload.close()
        self.transport.close()


class ModelTraining:
    """Train cells with models (module docstring): what micro-batches and weight syncs send.

    - ``single``: the core (cell 0) holds the only optimizer state; a micro-batch another cell
      trained reaches the core as a gradient the cell leaves in the exchange (key
      ``grads/v<version>/mb<n>``) and the core adds at the sync (exactly the micro-batches of the
      step, each once): cells may join and leave training within a step (QwenGyre's dynamic
      membership). With one cell nothing goes through the exchange.
    - ``allreduce``: a fixed group of train cells (`members`, the core among them) are
      data-parallel replicas; each keeps the gradient of the micro-batches it trained and at the
      sync every member runs the same update on its share of the batch, all-reducing its gradient
      first (DDP-style): no gradient in the exchange and no weight reload on the members. A
      member lost fails the job (its gradient lived only in its memory): it resumes from its last
      checkpoint. The group meets at a ``tcp://`` address on the core's host that the core picks
      at the first sync (`group`: NCCL between CUDA ranks, gloo otherwise).

    After the update the core publishes the new weights when other cells need them, and the cells
    of the sync that did not train load them (`runtime.cell.WeightStore`). Weights and gradients
    travel through the transport's exchange (`runtime.exchange`): files on one machine, Ray's
    object store on a cluster.
    """

    def __init__(self, mode: str = "single", members: list[int] | None = None):
        if mode not in ("single", "allreduce"):
            raise ValueError(f"unknown training mode {mode!r}")
        self.mode = mode
        self.members = sorted(members) if mode == "allreduce" and members else [0]
        if 0 not in self.members:
            raise ValueError("the train group must include the core (cell 0)")
        self.be: CellBackend | None = None
        self.newest = 0
        self._micro: dict[int, list[dict]] = {}  # version -> streamed micro-batches' statistics
        self._micro_s: dict[int, float] = {}  # version -> their cell-seconds
        self._grads: dict[int, dict[int, str]] = {}  # version -> train job token -> its gradient's key
        self._trained: dict[int, set[int]] = {}  # version -> executions trained on it
        self._step: dict[int, dict[str, Any]] = {}  # version (new) -> the sync in flight
        self.gradients_sent = 0  # satellite gradients sent to the core through the exchange (their keys number them)
        self._init: str | None = None  # the train group's rendezvous (formed once, at the first sync)

    def attach(self, backend: CellBackend, state: dict[str, Any] | None) -> None:
        self.be = backend
        if state:
            self.newest = state["newest"]

    def state(self) -> dict[str, Any]:
        return {"newest": self.newest}

    def switch(self, cell: int, role: Role) -> None:
        self.be.send(cell, "switch", (int(role), self.newest), key=int(role))

    def micro_batch(self, c: RunMicroBatch) -> None:
        be = self.be
        if self.mode == "allreduce" and c.cell not in self.members:
            raise RuntimeError(f"cell {c.cell} is outside the all-reduce group {self.members}")
        self._trained.setdefault(c.version, set()).update(c.executions)  # a re-claimed micro-batch counts once
        rows = be.workload.micro_batch(c.executions, c.version)
        if rows is None:  # several updates per step: the batch trains at the sync
            be.emit(MicroBatchDone(c.cell, c.executions))
            return
        payload: dict[str, Any] = {"version": c.version, "rows": rows}
        if self.mode == "single" and c.cell != 0:  # a satellite's gradient goes to the core
            self.gradients_sent += 1
            payload["grad_key"] = f"{_grad_prefix(c.version)}mb{self.gradients_sent}"
        tok = be.send(c.cell, "train", payload, key=("train", c.version, c.executions))
        if "grad_key" in payload:
            self._grads.setdefault(c.version, {})[tok] = payload["grad_key"]

    def sync(self, c: SyncWeights) -> None:
        be, v = self.be, c.version - 1
        plans = be.workload.sync(c.version, sorted(self._trained.get(v, ())), len(self.members))
        grads = sorted(self._grads.pop(v, {}).values())
        self._step[c.version] = {
            "cells": c.cells,
            "left": len(self.members),
            "updates": {},
            "plans": plans,
            "t0": time.monotonic(),
        }
        for rank, cell in enumerate(self.members):
            be.send(
                cell,
                "step",
                {
                    "version": v,
                    "plan": plans[rank],
                    "grad_keys": grads if cell == 0 else [],
                    "drop_prefix": _grad_prefix(v) if cell == 0 and self.mode == "single" and be.K > 1 else None,
                    "publish": cell == 0 and be.K > 1,
                    "group": self.group(rank) if self.mode == "allreduce" else None,
                },
                key=("step", c.version),
            )

    def group(self, rank: int) -> tuple[int, int, str] | None:
        """Member `rank`'s place in the train group: ``(rank, world, init_method)`` (`CellParts.join_group`;
        the backend follows the device: NCCL on CUDA, gloo on CPU); None with one member. The group
        forms once for the cells' lifetime, at their first sync (a resumed job: a fresh one), and
        meets at a ``tcp://`` address the core (rank 0) picks on its host: no shared filesystem."""
        if len(self.members) < 2:
            return None
        if self._init is None:
            self._init = self.be.run_job(self.members[0], "rendezvous", None)
        return (rank, len(self.members), self._init)

    def on_reply(self, cell: int, kind: str, key: Any, result: Any) -> None:
        be = self.be
        if kind == "train":
            _, version, executions = key
            self._micro.setdefault(version, []).append(result["stats"])
            self._micro_s[version] = self._micro_s.get(version, 0.0) + result["seconds"]
            be.emit(MicroBatchDone(cell, executions))
        elif kind == "step":
            version = key[1]
            st = self._step[version]
            st["updates"][cell] = result["updates"]
            st["left"] -= 1
            if st["left"]:
                return
            self.newest = version
            executions = sorted(self._trained.pop(version - 1, set()))
            stats = {
                "micro": self._micro.pop(version - 1, []),
                "ranks": [st["updates"][c] for c in self.members],
                "scale": st["plans"][0]["scale"],
            }
            # cell-seconds: the streamed micro-batches' and the sync's update
            train_s = time.monotonic() - st["t0"] + self._micro_s.pop(version - 1, 0.0)
            be.record_step(version, executions, stats, {"train": train_s})
            self._load_on([x for x in st.pop("cells") if x not in self.members], version)
        elif kind == "load":
            self._loaded(key[1])

    def _load_on(self, cells: list[int], version: int) -> None:
        """`cells` load weights `version`; with none the sync is done at once."""
        self._step[version]["left"] = len(cells)
        for x in cells:
            self.be.send(x, "load", version, key=("load", version))
        if not cells:
            self._loaded(version, done=True)

    def _loaded(self, version: int, done: bool = False) -> None:
        st = self._step[version]
        if not done:
            st["left"] -= 1
        if st["left"] <= 0:
            del self._step[version]
            self.be.emit(WeightSyncDone(version))

    def cell_lost(self, cell: int) -> None:
        """Cell `cell` died. A member of an all-reduce group fails the job at once, whatever it was
        doing: the gradients of the micro-batches it trained this step lived only in its memory, and
        the survivors' process group includes the dead rank (a collective with it fails under gloo
        and blocks under NCCL), so a replacement cannot simply take its place.

        Raises:
            RuntimeError: `cell` is a member of the all-reduce group (the message names the resume).
        """
        if self.mode == "allreduce" and len(self.members) > 1 and cell in self.members:
            raise RuntimeError(
                f"cell {cell} of the all-reduce group {self.members} failed: its accumulated "
                "gradient is lost and the group cannot continue; resume the job from its last "
                "checkpoint (a fresh group forms)"
            )

    def job_lost(self, cell: int, kind: str, key: Any, token: int) -> None:
        """A job died with its cell: a satellite's micro-batch is re-claimed by the scheduler (its
        gradient never counts); a lost weight load counts as done (the replacement loads the newest
        weights); a member of the train group lost mid-step fails the job."""
        if kind == "train":
            _, version, executions = key
            self._trained.get(version, set()).difference_update(executions)
            if self.mode == "allreduce":
                raise RuntimeError(
                    f"cell {cell} of the all-reduce group {self.members} failed: its accumulated "
                    "gradient is lost and the group cannot continue; resume the job from its last "
                    "checkpoint (a fresh group forms)"
                )
            self._grads.get(version, {}).pop(token, None)
        elif kind == "step":
            raise RuntimeError(f"cell {cell} failed during the optimizer step: resume the job from its last checkpoint")
        elif kind == "load":
            self._loaded(key[1])


def _grad_prefix(version: int) -> str:
    """The exchange keys of the satellites' gradients trained at weights `version`."""
    return f"grads/v{version}/"
