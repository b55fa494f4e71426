"""`local` backend: K cells as worker processes on this machine, replaying a workload in real time.

Each cell is a process (multiprocessing, spawn) that serves what the driver
sends it: a rollout cell runs its model calls concurrently, a train cell one
micro-batch at a time, and both pay the role-switch and weight-sync costs.
The executions' agent loops (turns, tool waits) live in the driver process,
as they live in the harness behind the gateway: a call bound to a cell is
sent to that cell's process, a migrated call is cancelled there and re-issued
on the new cell (QwenGyre's harness-preserving transfer), and a cell that
leaves rollout without migrating orphans its executions (the turn in flight is
aborted and counted). With ``via_gateway`` (model backends) the calls go
through a `gateway.Gateway` instead (`runtime.gateway_cells`): such a switch
drains the cell and its calls are re-issued where their executions go next,
so no turn is aborted.

Work durations come from a `runtime.workload.Workload` draw scaled by
``time_scale`` (seconds of real time per simulated second), so the same
workload runs in the simulator and here and the two can be compared. A call
lasts its decode work at ``gen_tps_single`` (no processor sharing in a cell:
the process serves its calls in parallel), a micro-batch ``micro_batch_s``.
This backend exercises the control plane with real processes and real time;
`LocalModelBackend` below puts a real model in the cells (`runtime.cell_worker`),
and `runtime.alfworld_backend` runs the ALFWorld RL workload on it
(``evoharness rl --schedule``).
"""

from __future__ import annotations

import contextlib
import heapq
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import threading
import time
from typing import Any

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (Bind, CellLost, Command, Dispatch, Event, ExecutionDispatched,
                                       ExecutionFinished, ExecutionOrphaned, ExecutionStarted, MicroBatchDone,
                                       Migrate, RoleSwitchDone, RunMicroBatch, SwitchRole, SyncWeights, WeightSyncDone)
from evoharness.runtime.workload import Workload
from evoharness.config.sim import SimConfig


class CellOutbox:
    """A cell's reply channel: the write end of a pipe of its own, read by the driver.

    One pipe per cell rather than one `multiprocessing.Queue` shared by all:
    a shared queue's writers share a lock, and a cell killed (SIGKILL, OOM)
    while its feeder thread held it silenced every other cell for good (the
    job stalled). A dead cell can now only break its own pipe, which the
    driver reads as end-of-file and drops; its replacement gets a new one.
    ``put`` blocks while the pipe is full (the driver drains it)."""

    def __init__(self, conn: Any):
        self._conn, self._lock = conn, threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self._conn}     # pickled into the spawned cell (a lock does not travel)

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["conn"])

    def put(self, msg: tuple) -> None:
        with self._lock:
            self._conn.send(msg)


def _cell_main(cell: int, inbox: Any, outbox: CellOutbox) -> None:
    """A cell process: timed jobs ("call" | "train" | "switch" | "sync", token, payload, seconds)
    run concurrently; ("cancel", token) drops one; ("stop",) ends the process."""
    timers: list[tuple[float, int, tuple]] = []
    cancelled: set[int] = set()
    seq = 0
    parent = os.getppid()
    while True:
        if os.getppid() != parent:
            return                  # the driver died (e.g. SIGKILL of the job): do not linger
        timeout = min(1.0, max(0.0, timers[0][0] - time.monotonic())) if timers else 1.0
        try:
            msg = inbox.get(timeout=timeout)
        except queue.Empty:
            msg = None
        if msg is not None:
            if msg[0] == "stop":
                return
            if msg[0] == "cancel":
                cancelled.add(msg[1])
            else:
                seq += 1
                heapq.heappush(timers, (time.monotonic() + msg[3], seq, msg))
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, m = heapq.heappop(timers)
            if m[1] in cancelled:
                cancelled.discard(m[1])
                continue
            outbox.put((cell, os.getpid(), m[0], m[1], m[2]))


class LocalBackend:
    """K cell processes driven by `runtime.driver.Driver`.

    Args:
        cfg: workload and cluster (cells, switch and sync costs, throughputs).
        roles: the scheduler's initial roles, one per cell.
        time_scale: real seconds per simulated second (e.g. 1e-3).
    """

    gw: Any = None      # a `gateway_cells.CellGateway` when calls go through the gateway (model backends)

    def __init__(self, cfg: SimConfig, roles: list[Role], time_scale: float = 1e-3,
                 state: dict[str, Any] | None = None):
        if len(roles) != cfg.cluster.cells:
            raise ValueError(f"{len(roles)} roles for {cfg.cluster.cells} cells")
        self.cfg, self.scale = cfg, time_scale
        self.wl = Workload(cfg.workload, cfg.seed)
        self.gs = cfg.workload.group_size
        self.N = cfg.workload.groups_per_step * self.gs
        self._start_cells(len(roles))
        self.role = list(roles)
        self._steps: dict[int, Any] = {}
        self._token = 0
        self._jobs: dict[int, tuple] = {}           # token -> what it was (kind, ...)
        self.x_cell: dict[int, int] = {}            # execution -> cell it is bound to
        self.x_k: dict[int, int] = {}               # execution -> turn index
        self.x_call: dict[int, int] = {}            # execution -> token of its call in flight
        self.x_state: dict[int, str] = {}           # queued | call | tool | wait | done
        self._tools: list[tuple[float, int, int]] = []   # (due, execution, turn) in this process
        self._events: list[Event] = []
        self._gw_jobs: dict[int, Any] = {}          # gateway mode: cell job token -> the gateway call waiting on it
        self._gw_tok: dict[Any, int] = {}           # and back
        self._sync_left: dict[int, int] = {}
        self.counts = {"calls": 0, "reissued_calls": 0, "aborted_turns": 0, "micro_batches": 0, "cells_lost": 0,
                       "migrations": 0}
        self.pids_seen: dict[int, set[int]] = {c: set() for c in range(len(roles))}
        # idle accounting (as the simulator's): per cell, jobs running and seconds per role, busy seconds
        k = len(roles)
        self._busy, self._since = [0] * k, [time.monotonic()] * k
        self._role_s = {r: [0.0] * k for r in Role}
        self._busy_s = {r: [0.0] * k for r in Role}
        if state is not None:
            self._restore(state)

    def state(self) -> dict[str, Any]:
        """The executions' progress (a job checkpoint; see `Driver`): no micro-batch,
        switch or sync is in flight when it is taken, so only rollout is kept."""
        now = time.monotonic()
        return {"x_cell": dict(self.x_cell), "x_k": dict(self.x_k), "x_state": dict(self.x_state),
                "tools": [(max(0.0, t - now), e, k) for t, e, k in self._tools], "counts": dict(self.counts),
                **self._extra_state()}

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _restore(self, st: dict[str, Any]) -> None:
        """Carry on from `state()`: a call that was in flight is issued again on its cell."""
        self.x_cell, self.x_k, self.x_state = dict(st["x_cell"]), dict(st["x_k"]), dict(st["x_state"])
        self.counts.update(st["counts"])
        now = time.monotonic()
        self._tools = [(now + r, e, k) for r, e, k in st["tools"]]
        heapq.heapify(self._tools)
        for e, x in sorted(self.x_state.items()):
            if x == "call":
                self._start_call(e)
                self.counts["reissued_calls"] += 1

    # ---- transport: cell processes and queues (a Ray backend swaps these) -------------
    def _start_cells(self, k: int) -> None:
        self._ctx = mp.get_context("spawn")
        self.inboxes: list[Any] = [None] * k
        self.outboxes: list[CellOutbox | None] = [None] * k   # cell c's write end (passed to its process)
        self._replies: list[Any] = [None] * k                 # cell c's read end (None once it read EOF)
        self.procs: list[Any] = [None] * k
        self._next_cell = 0                                    # where `_next_reply` starts looking
        for c in range(k):
            self._spawn(c)

    def _spawn(self, c: int) -> None:
        """Start cell c's process with a fresh inbox and reply pipe."""
        self.inboxes[c] = self._ctx.Queue()
        reader, writer = self._ctx.Pipe(duplex=False)
        self._replies[c], self.outboxes[c] = reader, CellOutbox(writer)
        target, args = self._process(c)
        self.procs[c] = self._ctx.Process(target=target, args=args, daemon=True)
        self.procs[c].start()
        writer.close()      # only the cell holds its write end now: its death reads as EOF

    def _post(self, cell: int, msg: tuple) -> None:
        self.inboxes[cell].put(msg)

    def _dead_cells(self) -> list[int]:
        return [c for c, p in enumerate(self.procs) if not p.is_alive()]

    def _next_reply(self, timeout: float) -> tuple | None:
        """One reply from any cell, or None after `timeout` s; cells take turns (none starves)."""
        k = len(self._replies)
        order = [(self._next_cell + i) % k for i in range(k)]
        live = [self._replies[c] for c in order if self._replies[c] is not None]
        for r in multiprocessing.connection.wait(live, timeout) if live else []:
            c = self._replies.index(r)
            self._next_cell = (c + 1) % k
            try:
                return r.recv()
            except (EOFError, OSError):
                # the cell died (`_dead_cells` reports it): drop its pipe and any half-written reply
                r.close()
                self._replies[c] = None
        if not live:
            time.sleep(timeout)
        return None

    def _respawn(self, c: int) -> None:
        if self._replies[c] is not None:
            self._replies[c].close()    # the dead cell's replies: its jobs were dropped with it
        self._spawn(c)

    def _process(self, cell: int) -> tuple[Any, tuple]:
        """The target and arguments of cell `cell`'s process."""
        return _cell_main, (cell, self.inboxes[cell], self.outboxes[cell])

    # ---- workload -------------------------------------------------------------
    def _turns(self, e: int) -> tuple[Any, int, int]:
        step = e // self.N
        if step not in self._steps:
            self._steps[step] = self.wl.sample_step(step)
        b = self._steps[step]
        i = e % self.N
        return b, int(b.offsets[i]), int(b.n_turns[i])

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
        for c in range(len(self.role)):
            self._tick(c)
        try:
            yield
        finally:
            self._since = [time.monotonic()] * len(self.role)

    def idle(self) -> dict[str, float]:
        """Share of each role's time a cell ran nothing (no call in rollout, no
        micro-batch in train), over all cells, as the simulator's idle ratios."""
        for c in range(len(self.role)):
            self._tick(c)
        out = {}
        for r, name in ((Role.ROLLOUT, "idle_rollout"), (Role.TRAIN, "idle_train")):
            t = sum(self._role_s[r])
            out[name] = 1.0 - sum(self._busy_s[r]) / t if t else 0.0
        return out

    def _send(self, cell: int, kind: str, payload: Any, seconds: float = 0.0, key: Any = None) -> int:
        """Queue a job on `cell`; `key` (default: the payload) is what its reply is matched to."""
        if kind in ("call", "train"):
            self._tick(cell, +1)
        self._token += 1
        self._jobs[self._token] = (kind, cell, payload if key is None else key)
        self._post(cell, (kind, self._token, payload, seconds * self.scale))
        return self._token

    def _start_call(self, e: int) -> None:
        b, off, _ = self._turns(e)
        i = off + self.x_k[e]
        work = (float(b.completion[i]) + float(b.prompt[i]) / self.cfg.cluster.prefill_speedup)
        self.x_call[e] = self._send(self.x_cell[e], "call", e, work / self.cfg.cluster.gen_tps_single)
        self.x_state[e] = "call"
        self.counts["calls"] += 1

    def _cancel_call(self, e: int) -> None:
        tok = self.x_call.pop(e)
        self._jobs.pop(tok, None)
        self._tick(self.x_cell[e], -1)
        self._post(self.x_cell[e], ("cancel", tok))

    # ---- commands -------------------------------------------------------------
    def apply(self, c: Command) -> None:
        if isinstance(c, Dispatch):
            for e in range(c.group * self.gs, (c.group + 1) * self.gs):
                self.x_state[e], self.x_k[e] = "queued", 0
                self._events.append(ExecutionDispatched(e, c.group))
        elif isinstance(c, (Bind, Migrate)) and self.x_state[c.execution] == "done":
            # it finished while the command was decided (its ExecutionFinished is not handled yet):
            # binding it again would leave a phantom on the cell, orphaned when the cell leaves rollout
            return
        elif isinstance(c, Bind):
            st = self.x_state[c.execution]
            self.x_cell[c.execution] = c.cell
            if self.gw is not None:
                self.gw.bind(c.execution, c.cell)      # a held call of it (a drained cell's) goes there now
            if st == "queued":
                self._events.append(ExecutionStarted(c.execution, c.cell))
                self._start_call(c.execution)
            elif st == "wait":
                self._start_call(c.execution)
        elif isinstance(c, Migrate):
            e = c.execution
            self.counts["migrations"] += 1
            if self.gw is not None:            # the gateway re-issues a call in flight on the new cell
                old, self.x_cell[e] = self.x_cell.get(e), c.cell
                if old is None:
                    self.gw.bind(e, c.cell)
                else:
                    self.gw.migrate(e, old, c.cell)
            elif self.x_state[e] == "call":
                self._cancel_call(e)
                self.x_cell[e] = c.cell
                self._start_call(e)            # re-issued: the harness sees no error
                self.counts["reissued_calls"] += 1
            else:
                self.x_cell[e] = c.cell
        elif isinstance(c, SwitchRole):
            if self.role[c.cell] == Role.ROLLOUT and self.gw is not None:
                # drain through the gateway: the cell's calls wait there for their executions'
                # next cells and are re-issued on them; no turn is aborted
                held = sorted(x for x, cell in self.x_cell.items() if cell == c.cell)
                for e in held:
                    del self.x_cell[e]
                    self._events.append(ExecutionOrphaned(e, c.cell, False))
                self.gw.drain(c.cell, held)
            elif self.role[c.cell] == Role.ROLLOUT:
                for e in sorted(x for x, cell in self.x_cell.items() if cell == c.cell):
                    aborted = self.x_state[e] == "call"
                    if aborted:
                        self._cancel_call(e)
                        self.x_state[e] = "wait"
                        self.counts["aborted_turns"] += 1
                    del self.x_cell[e]
                    self._events.append(ExecutionOrphaned(e, c.cell, aborted))
            self._tick(c.cell, role=Role.TO_TRAIN if c.role == Role.TRAIN else Role.TO_ROLLOUT)
            self._switch(c.cell, c.role)
        elif isinstance(c, RunMicroBatch):
            self._micro_batch(c)
            self.counts["micro_batches"] += 1
        elif isinstance(c, SyncWeights):
            self._sync(c)
        else:
            raise ValueError(f"unknown command {c!r}")

    def _switch(self, cell: int, role: Role) -> None:
        cl = self.cfg.cluster
        self._send(cell, "switch", int(role), cl.switch_to_train_s if role == Role.TRAIN else cl.switch_to_rollout_s)

    def _micro_batch(self, c: RunMicroBatch) -> None:
        tokens = [float(self._tokens(e)) for e in c.executions]
        self._send(c.cell, "train", c.executions, self.cfg.cluster.micro_batch_s(tokens))

    def _sync(self, c: SyncWeights) -> None:
        self._sync_left[c.version] = len(c.cells)
        for cell in c.cells:
            self._send(cell, "sync", c.version, self.cfg.cluster.weight_sync_s)

    def _tokens(self, e: int) -> int:
        b, off, n = self._turns(e)
        return int(round(float((b.prompt[off:off + n] + b.completion[off:off + n]).sum())))

    # ---- completions ------------------------------------------------------------
    def _on_job(self, cell: int, pid: int, kind: str, token: int, result: Any) -> None:
        self.pids_seen[cell].add(pid)
        if token in self._gw_jobs:             # a call the gateway routed here: its answer goes back there
            self._jobs.pop(token, None)
            self._tick(cell, -1)
            fut = self._gw_jobs.pop(token)
            self._gw_tok.pop(fut, None)
            self.gw.resolve(fut, result)
            return
        job = self._jobs.pop(token, None)
        if job is None:
            return                              # cancelled after it completed
        payload = job[2]
        if kind in ("call", "train"):
            self._tick(cell, -1)
        if kind == "call":
            e = payload
            if self.x_call.get(e) != token:
                return
            del self.x_call[e]
            self._call_done(e, cell, result)
            self._start_tool(e, self._tool_delay(e))
        elif kind == "train":
            self._events.append(MicroBatchDone(cell, tuple(payload)))
        elif kind == "switch":
            self._tick(cell, role=Role(payload))
            self._events.append(RoleSwitchDone(cell, Role(payload)))
            if self.gw is not None and Role(payload) == Role.ROLLOUT:
                self.gw.resume(cell)
        elif kind == "sync":
            self._synced(payload)

    def _synced(self, version: int) -> None:
        """One cell of weight sync `version` is done (or lost); the last one completes the sync."""
        self._sync_left[version] -= 1
        if self._sync_left[version] == 0:
            del self._sync_left[version]
            self._events.append(WeightSyncDone(version))

    def _call_done(self, e: int, cell: int, result: Any) -> None:
        """A model call of `e` completed on `cell` (the replay has nothing to record)."""

    def _start_tool(self, e: int, delay_s: float) -> None:
        """`e` waits `delay_s` real seconds for its tool (environment) before its next turn."""
        self.x_state[e] = "tool"
        heapq.heappush(self._tools, (time.monotonic() + delay_s, e, self.x_k[e]))

    def _tool_delay(self, e: int) -> float:
        """Real seconds of the tool wait after `e`'s current call (the workload's draw, scaled)."""
        b, off, _ = self._turns(e)
        return float(b.tool_s[off + self.x_k[e]]) * self.scale

    def _last_turn(self, e: int) -> bool:
        """Whether `e` has played its last turn (`x_k` already counts the one just ended)."""
        return self.x_k[e] == self._turns(e)[2]

    def _on_tool(self, e: int) -> None:
        self.x_k[e] += 1
        if self._last_turn(e):
            self.x_state[e] = "done"
            cell = self.x_cell.pop(e, -1)
            if self.gw is not None:
                self.gw.release(e)
            self._events.append(ExecutionFinished(e, cell, self._tokens(e)))
        elif e in self.x_cell:
            self._start_call(e)
        else:
            self.x_state[e] = "wait"            # orphaned: waits for a Bind

    def poll(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        while not self._events:
            self._pump()
            now = time.monotonic()
            while self._tools and self._tools[0][0] <= now:
                _, e, _ = heapq.heappop(self._tools)
                self._on_tool(e)
            if self._events:
                break
            for c in self._dead_cells():
                self._lose(c)
            if self._events:
                break
            wait = min(deadline, self._tools[0][0] if self._tools else deadline) - now
            if wait <= 0 and now >= deadline:
                break
            # through the gateway, answers also arrive on its thread: look again soon
            reply = self._next_reply(max(0.0, min(wait, 0.2 if self.gw is None else 0.005)))
            if reply is not None:
                self._on_job(*reply)
        out, self._events = self._events, []
        return out

    def _lose(self, c: int) -> None:
        """Cell c's process died: report it, orphan its executions (their calls
        are re-issued when they are bound again), drop its jobs (a weight sync
        counts as acknowledged: the replacement loads the newest weights) and
        start a replacement that joins rollout."""
        self.counts["cells_lost"] += 1
        self._events.append(CellLost(c))
        held = sorted(x for x, cell in self.x_cell.items() if cell == c)
        if self.gw is not None:
            self.gw.lost(c, held)         # its calls wait in the gateway and are re-issued on the next bind
        for e in held:
            if self.x_state[e] == "call" and self.gw is None:
                self._jobs.pop(self.x_call.pop(e), None)
                self.x_state[e] = "wait"
                self.counts["reissued_calls"] += 1
            del self.x_cell[e]
            self._events.append(ExecutionOrphaned(e, c, False))
        for token, job in [(t, j) for t, j in self._jobs.items() if j[1] == c]:
            del self._jobs[token]
            self._job_lost(token, job)
        self._respawn(c)
        self._tick(c, -self._busy[c], Role.TO_ROLLOUT)
        self._switch(c, Role.ROLLOUT)

    def _job_lost(self, token: int, job: tuple) -> None:
        if token in self._gw_jobs:
            fut = self._gw_jobs.pop(token)
            self._gw_tok.pop(fut, None)
            self.gw.fail(fut, f"cell {job[1]} lost")
            return
        kind, _, key = job
        if kind in ("sync", "load"):
            self._synced(key)

    def close(self) -> None:
        if self.gw is not None:
            self.gw.close()
        self._close_cells()

    # ---- calls through the gateway (`gateway_cells`) --------------------------------
    def _issue(self, e: int, payload: Any) -> int:
        """Start execution e's model call on its cell (direct) or through the gateway; its call id."""
        if self.gw is None:
            return self._send(self.x_cell[e], "call", payload, key=e)
        self._token += 1
        if e in self.x_cell:
            self.gw.bind(e, self.x_cell[e])
        else:
            self.gw.hold(e)       # a resumed call of an execution not placed yet
        self.gw.call(e, self._token, payload)
        return self._token

    def _pump(self) -> None:
        """Gateway mode: post the cell jobs the gateway routed, cancel the ones it gave up,
        and take the answered calls (each completes its execution's turn)."""
        if self.gw is None:
            return
        while True:
            try:
                kind, cell, e, payload, fut = self.gw.pending.get_nowait()
            except queue.Empty:
                break
            if kind == "call":
                tok = self._send(cell, "call", payload, key=("gateway", e))
                self._gw_jobs[tok], self._gw_tok[fut] = fut, tok
            else:
                tok = self._gw_tok.pop(fut, None)
                if tok is not None and self._gw_jobs.pop(tok, None) is not None:
                    job = self._jobs.pop(tok, None)
                    if job is not None:
                        self._tick(job[1], -1)
                        self._post(job[1], ("cancel", tok))
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
            self._call_done(e, int(attempts[-1].backend.removeprefix("cell")), out.detail)
            self._start_tool(e, self._tool_delay(e))
        for k in ("drains", "drain_s_total", "drain_s_max"):
            self.counts[k] = self.gw.counts[k]

    def _close_cells(self) -> None:
        """Stop the cells (transport; a Ray backend swaps it)."""
        for q in self.inboxes:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for r in self._replies:
            if r is not None:
                r.close()


class LocalModelBackend(LocalBackend):
    """K cell processes with a real model (`runtime.cell_worker`): real decoding,
    real gradients, the core's optimizer step, weights versions on disk.

    The executions are synthetic multi-turn agents with real tokens: a seeded
    random prompt, then per turn one model call (``max_new_tokens``) followed
    by ``tool_tokens`` seeded random "tool output" ids; the turn count is the
    workload's draw capped at ``max_turns``. Reward: the share of even token ids
    among the completion tokens (a signal the policy can learn); advantages are
    group-normalised (GRPO), token weights 1/(N·n_j) over the N executions of a
    step, so streamed micro-batches sum to the batch loss.

    Args (beyond `LocalBackend`'s): model_dir: a local HF model directory;
    work_dir: where weights versions and gradients go; lr: the core's AdamW
    learning rate; via_gateway: the executions' calls go through a
    `gateway.Gateway` routed by execution (`gateway_cells`: a rollout -> train
    switch drains the cell and re-issues its calls; none is aborted).
    """

    def __init__(self, cfg: SimConfig, roles: list[Role], model_dir: str, work_dir: str, lr: float = 1e-3,
                 max_new_tokens: int = 6, prompt_tokens: int = 12, tool_tokens: int = 3, max_turns: int = 3,
                 time_scale: float = 1e-3, ready_timeout_s: float = 300.0, state: dict[str, Any] | None = None,
                 via_gateway: bool = False):
        from evoharness.models.init import load_tokenizer

        if via_gateway:
            from evoharness.runtime.gateway_cells import CellGateway

            self._gw_done: queue.Queue = queue.Queue()
            self.gw = CellGateway(len(roles), lambda *done: self._gw_done.put(done))
            for c, r in enumerate(roles):
                if r != Role.ROLLOUT:
                    self.gw.drain(c, [])       # not serving until it switches to rollout

        self.model_dir, self.work_dir, self.lr = str(model_dir), str(work_dir), lr
        tok = load_tokenizer(model_dir)
        special = set(tok.all_special_ids)
        self.ids = [i for i in range(len(tok)) if i not in special]
        self.max_new, self.prompt_len, self.tool_len, self.max_turns = max_new_tokens, prompt_tokens, tool_tokens, \
            max_turns
        self.x_ctx: dict[int, list[int]] = {}
        self.x_rec: dict[int, list[tuple[list[int], list[int], list[float], int]]] = {}
        self.newest = 0
        self.mb_tokens: dict[int, list[int]] = {}       # version -> tokens of its micro-batch jobs
        self.train_stats: list[dict[str, float]] = []
        self.step_stats: list[dict[str, float]] = []
        super().__init__(cfg, roles, time_scale, state)   # (a `state` restores into the books above)
        ready: set[int] = set()
        deadline = time.monotonic() + ready_timeout_s
        while len(ready) < len(roles):
            dead = self._dead_cells()
            if dead or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"cells {dead or sorted(set(range(len(roles))) - ready)} did not load the "
                                   f"model ({'process died' if dead else f'{ready_timeout_s:.0f} s timeout'})")
            reply = self._next_reply(1.0)
            if reply is None:
                continue
            cell, pid, kind, _, _ = reply
            if kind == "ready":
                ready.add(cell)
                self.pids_seen[cell].add(pid)
        self._since = [time.monotonic()] * len(roles)   # idle ratios count from here, not the model loading

    def _cell_args(self, cell: int) -> tuple[str, str, float, dict[str, Any] | None]:
        """What any transport hands a new cell's `cell_worker.cell_main`: (model_dir, work_dir, lr, options)."""
        return self.model_dir, self.work_dir, self.lr, None

    def _process(self, cell: int) -> tuple[Any, tuple]:
        from evoharness.runtime.cell_worker import cell_main
        model_dir, work_dir, lr, options = self._cell_args(cell)
        return cell_main, (cell, model_dir, work_dir, lr, self.inboxes[cell], self.outboxes[cell], options)

    # ---- executions with real tokens --------------------------------------------
    def _rng(self, *key: int):
        import numpy as np
        return np.random.default_rng([self.cfg.seed, *key])

    def _random_ids(self, n: int, *key: int) -> list[int]:
        idx = self._rng(*key).integers(0, len(self.ids), n)
        return [self.ids[i] for i in idx]

    def _n_turns(self, e: int) -> int:
        _, _, n = super()._turns(e)
        return min(n, self.max_turns)

    def _turns(self, e: int) -> tuple[Any, int, int]:
        b, off, _ = super()._turns(e)
        return b, off, self._n_turns(e)

    def _tokens(self, e: int) -> int:
        return len(self.x_ctx[e])

    def _start_call(self, e: int) -> None:
        if e not in self.x_ctx:
            self.x_ctx[e] = self._random_ids(self.prompt_len, e)
            self.x_rec[e] = []
        seed = hash((self.cfg.seed, e, self.x_k[e])) & 0x7FFFFFFF
        self.x_call[e] = self._issue(e, (self.x_ctx[e], self.max_new, seed))
        self.x_state[e] = "call"
        self.counts["calls"] += 1

    def _call_done(self, e: int, cell: int, result: Any) -> None:
        ids, logprobs, version = result
        self.x_rec[e].append((list(self.x_ctx[e]), list(ids), list(logprobs), version))
        self.x_ctx[e] = self.x_ctx[e] + list(ids) + self._random_ids(self.tool_len, e, self.x_k[e], 1)

    def reward(self, e: int) -> float:
        comp = [t for rec in self.x_rec[e] for t in rec[1]]
        return sum(t % 2 == 0 for t in comp) / len(comp) if comp else 0.0

    def _advantage(self, e: int) -> float:
        g = e // self.gs
        members = range(g * self.gs, (g + 1) * self.gs)
        if any(self.x_state.get(m) != "done" for m in members):
            raise RuntimeError(f"execution {e} trained before its group finished (GRPO needs the group)")
        r = [self.reward(m) for m in members]
        mean = sum(r) / len(r)
        std = (sum((x - mean) ** 2 for x in r) / len(r)) ** 0.5
        return (self.reward(e) - mean) / (std + 1e-6)

    # ---- training, weights ------------------------------------------------------------
    def _micro_batch(self, c: RunMicroBatch) -> None:
        samples = []
        for e in c.executions:
            adv = self._advantage(e)
            n_tok = sum(len(rec[1]) for rec in self.x_rec[e])
            for prompt, comp, lps, _ in self.x_rec[e]:
                if comp:
                    samples.append(dict(prompt_ids=prompt, completion_ids=comp, logprobs=lps, advantage=adv,
                                        episode_id=str(e), weight=1.0 / (self.N * n_tok)))
        tok = self._send(c.cell, "train", (c.version, samples), key=c.executions)
        self.mb_tokens.setdefault(c.version, []).append(tok)

    def _sync(self, c: SyncWeights) -> None:
        v = c.version - 1
        self._send(0, "step", (v, self.mb_tokens.pop(v, [])), key=(c.version, tuple(c.cells)))

    def _switch(self, cell: int, role: Role) -> None:
        self._send(cell, "switch", (int(role), self.newest), key=int(role))

    def _on_job(self, cell: int, pid: int, kind: str, token: int, result: Any) -> None:
        if kind == "train":
            self.train_stats.append(result)
        if kind == "step":
            self.pids_seen[cell].add(pid)
            version, cells = self._jobs.pop(token)[2]
            self.step_stats.append(result)
            self.newest = version
            self._load_on([x for x in cells if x != 0], version)
            return
        if kind == "load":
            kind = "sync"          # counted like the replay's per-cell sync acknowledgement
        super()._on_job(cell, pid, kind, token, result)

    def _load_on(self, cells: list[int], version: int) -> None:
        """`cells` load the weights file `version` the core wrote; with none the sync is done at once."""
        self._sync_left[version] = len(cells)
        for x in cells:
            self._send(x, "load", version, key=version)
        if not cells:
            del self._sync_left[version]
            self._events.append(WeightSyncDone(version))

    def _job_lost(self, token: int, job: tuple) -> None:
        if job[0] == "train":
            for tokens in self.mb_tokens.values():
                if token in tokens:
                    tokens.remove(token)    # the core must not sum a gradient that was never written
        if job[0] == "step":
            raise RuntimeError("the core cell failed during its optimizer step: resume from the last checkpoint")
        super()._job_lost(token, job)

    def turn_versions(self) -> dict[int, list[int]]:
        """Per execution, the weights version of each model call (its behaviour versions)."""
        return {e: [rec[3] for rec in recs] for e, recs in self.x_rec.items()}
