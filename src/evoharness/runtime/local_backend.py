"""`local` backend: K cells as worker processes on this machine, replaying a workload in real time.

Each cell is a process (multiprocessing, spawn) that serves what the driver
sends it: a rollout cell runs its model calls concurrently, a train cell one
micro-batch at a time, and both pay the role-switch and weight-sync costs.
The executions' agent loops (turns, tool waits) live in the driver process,
as they live in the harness behind the gateway: a call bound to a cell is
sent to that cell's process, a migrated call is cancelled there and re-issued
on the new cell (QwenGyre's harness-preserving transfer), and a cell that
leaves rollout without migrating orphans its executions (the turn in flight is
aborted and counted).

Work durations come from a `runtime.workload.Workload` draw scaled by
``time_scale`` (seconds of real time per simulated second), so the same
workload runs in the simulator and here and the two can be compared. A call
lasts its decode work at ``gen_tps_single`` (no processor sharing in a cell:
the process serves its calls in parallel), a micro-batch ``micro_batch_s``.
This backend exercises the control plane with real processes and real time;
the model itself (the in-process engine in rollout cells, trainer replicas
with torch.distributed gloo) is the next piece: see docs/simulator.md.
"""

from __future__ import annotations

import heapq
import multiprocessing as mp
import os
import queue
import time
from typing import Any

from evoharness.runtime.cells import Role
from evoharness.runtime.events import (Bind, Command, Dispatch, Event, ExecutionDispatched, ExecutionFinished,
                                       ExecutionOrphaned, ExecutionStarted, MicroBatchDone, Migrate,
                                       RoleSwitchDone, RunMicroBatch, SwitchRole, SyncWeights, WeightSyncDone)
from evoharness.runtime.workload import SimConfig, Workload


def _cell_main(cell: int, inbox: Any, outbox: Any) -> None:
    """A cell process: timed jobs ("call" | "train" | "switch" | "sync", token, payload, seconds)
    run concurrently; ("cancel", token) drops one; ("stop",) ends the process."""
    timers: list[tuple[float, int, tuple]] = []
    cancelled: set[int] = set()
    seq = 0
    while True:
        timeout = max(0.0, timers[0][0] - time.monotonic()) if timers else None
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

    def __init__(self, cfg: SimConfig, roles: list[Role], time_scale: float = 1e-3):
        if len(roles) != cfg.cluster.cells:
            raise ValueError(f"{len(roles)} roles for {cfg.cluster.cells} cells")
        self.cfg, self.scale = cfg, time_scale
        self.wl = Workload(cfg.workload, cfg.seed)
        self.gs = cfg.workload.group_size
        self.N = cfg.workload.groups_per_step * self.gs
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in roles]
        self.procs = [ctx.Process(target=_cell_main, args=(c, self.inboxes[c], self.outbox), daemon=True)
                      for c in range(len(roles))]
        for p in self.procs:
            p.start()
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
        self._sync_left: dict[int, int] = {}
        self.counts = {"calls": 0, "reissued_calls": 0, "aborted_turns": 0, "micro_batches": 0}
        self.pids_seen: dict[int, set[int]] = {c: set() for c in range(len(roles))}

    # ---- workload -------------------------------------------------------------
    def _turns(self, e: int) -> tuple[Any, int, int]:
        step = e // self.N
        if step not in self._steps:
            self._steps[step] = self.wl.sample_step(step)
        b = self._steps[step]
        i = e % self.N
        return b, int(b.offsets[i]), int(b.n_turns[i])

    def _send(self, cell: int, kind: str, payload: Any, seconds: float) -> int:
        self._token += 1
        self._jobs[self._token] = (kind, cell, payload)
        self.inboxes[cell].put((kind, self._token, payload, seconds * self.scale))
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
        self.inboxes[self.x_cell[e]].put(("cancel", tok))

    # ---- commands -------------------------------------------------------------
    def apply(self, c: Command) -> None:
        if isinstance(c, Dispatch):
            for e in range(c.group * self.gs, (c.group + 1) * self.gs):
                self.x_state[e], self.x_k[e] = "queued", 0
                self._events.append(ExecutionDispatched(e, c.group))
        elif isinstance(c, Bind):
            st = self.x_state[c.execution]
            self.x_cell[c.execution] = c.cell
            if st == "queued":
                self._events.append(ExecutionStarted(c.execution, c.cell))
                self._start_call(c.execution)
            elif st == "wait":
                self._start_call(c.execution)
        elif isinstance(c, Migrate):
            e = c.execution
            if self.x_state[e] == "call":
                self._cancel_call(e)
                self.x_cell[e] = c.cell
                self._start_call(e)            # re-issued: the harness sees no error
                self.counts["reissued_calls"] += 1
            else:
                self.x_cell[e] = c.cell
        elif isinstance(c, SwitchRole):
            if self.role[c.cell] == Role.ROLLOUT:
                for e in sorted(x for x, cell in self.x_cell.items() if cell == c.cell):
                    aborted = self.x_state[e] == "call"
                    if aborted:
                        self._cancel_call(e)
                        self.x_state[e] = "wait"
                        self.counts["aborted_turns"] += 1
                    del self.x_cell[e]
                    self._events.append(ExecutionOrphaned(e, c.cell, aborted))
            self.role[c.cell] = Role.TO_TRAIN if c.role == Role.TRAIN else Role.TO_ROLLOUT
            cl = self.cfg.cluster
            self._send(c.cell, "switch", int(c.role),
                       cl.switch_to_train_s if c.role == Role.TRAIN else cl.switch_to_rollout_s)
        elif isinstance(c, RunMicroBatch):
            tokens = [float(self._tokens(e)) for e in c.executions]
            self._send(c.cell, "train", c.executions, self.cfg.cluster.micro_batch_s(tokens))
            self.counts["micro_batches"] += 1
        elif isinstance(c, SyncWeights):
            self._sync_left[c.version] = len(c.cells)
            for cell in c.cells:
                self._send(cell, "sync", c.version, self.cfg.cluster.weight_sync_s)
        else:
            raise ValueError(f"unknown command {c!r}")

    def _tokens(self, e: int) -> int:
        b, off, n = self._turns(e)
        return int(round(float((b.prompt[off:off + n] + b.completion[off:off + n]).sum())))

    # ---- completions ------------------------------------------------------------
    def _on_job(self, cell: int, pid: int, kind: str, token: int, payload: Any) -> None:
        self.pids_seen[cell].add(pid)
        if self._jobs.pop(token, None) is None:
            return                              # cancelled after it completed
        if kind == "call":
            e = payload
            if self.x_call.get(e) != token:
                return
            del self.x_call[e]
            b, off, _ = self._turns(e)
            self.x_state[e] = "tool"
            heapq.heappush(self._tools, (time.monotonic() + float(b.tool_s[off + self.x_k[e]]) * self.scale,
                                         e, self.x_k[e]))
        elif kind == "train":
            self._events.append(MicroBatchDone(cell, tuple(payload)))
        elif kind == "switch":
            self.role[cell] = Role(payload)
            self._events.append(RoleSwitchDone(cell, Role(payload)))
        elif kind == "sync":
            self._sync_left[payload] -= 1
            if self._sync_left[payload] == 0:
                del self._sync_left[payload]
                self._events.append(WeightSyncDone(payload))

    def _on_tool(self, e: int) -> None:
        _, _, n = self._turns(e)
        self.x_k[e] += 1
        if self.x_k[e] == n:
            self.x_state[e] = "done"
            cell = self.x_cell.pop(e, -1)
            self._events.append(ExecutionFinished(e, cell, self._tokens(e)))
        elif e in self.x_cell:
            self._start_call(e)
        else:
            self.x_state[e] = "wait"            # orphaned: waits for a Bind

    def poll(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        while not self._events:
            now = time.monotonic()
            while self._tools and self._tools[0][0] <= now:
                _, e, _ = heapq.heappop(self._tools)
                self._on_tool(e)
            if self._events:
                break
            for c, p in enumerate(self.procs):
                if not p.is_alive():
                    raise RuntimeError(f"cell {c} process {p.pid} died (exit code {p.exitcode})")
            wait = min(deadline, self._tools[0][0] if self._tools else deadline) - now
            if wait <= 0 and now >= deadline:
                break
            try:
                self._on_job(*self.outbox.get(timeout=max(0.0, min(wait, 0.2))))
            except queue.Empty:
                pass
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        for q in self.inboxes:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
