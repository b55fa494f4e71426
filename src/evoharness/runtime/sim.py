"""Discrete-event simulator of rollout/training schedules at cluster scale.

The world that a `Scheduler` (colocate, async, elastic) drives: executions,
their turns, K cells, the clock. One heap of timed events (heapq); between
them the scheduler's commands are applied and its events delivered in order,
at the same instant.

Models (units: seconds, tokens):

- *Generation*: a rollout cell serves its in-flight model calls by processor
  sharing. With n calls each gets ``per_seq_tps(n)`` tokens/s
  (``tps(n) = gen_tps_single * n**gen_concurrency_exponent``, sublinear). A
  call's work is its completion tokens plus its new prompt tokens divided by
  ``prefill_speedup``. A cell of ``decode_replicas`` > 1 is that many such
  servers (capacity / replicas slots each); an execution is pinned to the
  replica of its cell with the fewest executions (a router keeps a session
  where its KV cache is). Each server keeps a virtual clock V (tokens served
  to each sequence so far), so a call finishes when V passes its start V plus
  its work: one heap per server, at most one live event per server, O(log n)
  per change.
- *Tools*: after each call the execution waits its tool latency (no cell
  capacity is used, but the execution keeps its slot and KV cache).
- *Training*: a micro-batch of executions takes ``max(sum(tokens) /
  train_tps, max(tokens) / seq_train_tps)`` on one train cell: a cell is
  ``train_replicas`` data-parallel replicas and one trajectory trains on one
  replica (``train_seq_tps``; by default one replica per cell). Train
  utilisation counts the replicas in use.
- *Weight sync*: ``weight_sync_s`` on the cells named; rollout cells pause.
  New weights invalidate the KV (prefix) cache (``sync_flushes_kv``): every
  execution bound to a synced rollout cell re-prefills its context, the call
  in flight at once, an execution between calls at its next call (AReaL's
  interruptible generation recomputes the KV cache under the new weights;
  vLLM/SGLang reset the prefix cache on a weight update). Only schedules whose
  executions span a weight update pay it (async); colocate and elastic sync
  with nothing in flight.
- *Role switches*: ``switch_to_train_s`` / ``switch_to_rollout_s`` (QwenGyre,
  arXiv 2609.33848: 8.52 s and 3.46 s).
- *Migration* (elastic): a re-issued call restarts on the new cell and
  re-prefills its whole context (the KV cache is not moved); progress on the
  old cell is counted as wasted. Re-prefill work is counted when the call that
  carries it completes (``reprefill_tokens``); work of a cancelled call is
  ``wasted_tokens``.

Invariants are checked as commands arrive (`SchedulingError`): a cell holds one
role, never exceeds its capacity, trains only in train role, and every
execution finishes and is trained exactly once.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evoharness.config.sim import SimConfig
from evoharness.runtime.cells import Role
from evoharness.runtime.events import (
    Bind,
    Dispatch,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionOrphaned,
    ExecutionStarted,
    MicroBatchDone,
    Migrate,
    ModelCallFinished,
    ModelCallStarted,
    RoleSwitchDone,
    RunMicroBatch,
    SwitchRole,
    SyncWeights,
    WeightSyncDone,
)
from evoharness.runtime.schedulers import Scheduler, make_scheduler
from evoharness.runtime.workload import Workload

# accounting states of a cell
S_ROLLOUT, S_TRAIN, S_SWITCH, S_SYNC = 0, 1, 2, 3
STATE_NAMES = ("rollout", "train", "switch", "sync")
# execution states
X_NEW, X_QUEUED, X_CALL, X_TOOL, X_WAIT, X_DONE = 0, 1, 2, 3, 4, 5
INF = float("inf")
# timed event kinds
E_CELL, E_TOOL, E_SWITCH, E_MB, E_SYNC = 0, 1, 2, 3, 4


class SchedulingError(RuntimeError):
    """A scheduler asked for something the cluster cannot do."""


@dataclass
class Timeline:
    """Per-cell state changes: times (s), state codes, utilisation in [0, 1]."""

    t: list[list[float]]
    state: list[list[int]]
    util: list[list[float]]


@dataclass
class SimResult:
    """What one simulated run measured. See `metrics` for the flat summary."""

    policy: str
    wall_s: float
    step_end_s: list[float]
    metrics: dict[str, float]
    staleness: dict[int, int]
    timeline: Timeline | None = None
    checks: dict[str, Any] = field(default_factory=dict)


class Simulator:
    """Run `scheduler` on `cfg`'s workload and cluster.

    Args:
        cfg: workload, cluster and steps.
        scheduler: a fresh scheduler built for this cluster and workload.
        workload: the workload object (defaults to one built from `cfg`).
        record_timeline: keep per-cell state changes for the PNG timeline.
    """

    def __init__(
        self, cfg: SimConfig, scheduler: Scheduler, workload: Workload | None = None, record_timeline: bool = False
    ):
        self.cfg, self.sched = cfg, scheduler
        self.wl = workload or Workload(cfg.workload, cfg.seed)
        cl = cfg.cluster
        K, C = cl.cells, cl.capacity
        self.K, self.C = K, C
        self.G, self.gs = cfg.workload.groups_per_step, cfg.workload.group_size
        self.N = self.G * self.gs
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self._events: deque = deque()
        # decode: each cell is R replicas (servers) of C / R slots; an execution is pinned to one
        R = self.R = cl.decode_replicas
        Cr = C // R
        self._ps = [cl.per_seq_tps(n) for n in range(Cr + 1)]  # per-sequence tokens/s on a replica
        self._tp = [n * p for n, p in enumerate(self._ps)]  # a replica's tokens/s with n calls
        self._full = R * self._tp[Cr]  # a full cell's tokens/s
        self._pf = cl.prefill_speedup
        # executions (global id = group * group_size + k), filled step by step
        self.x_off: list[int] = []
        self.x_turns: list[int] = []
        self.x_tokens: list[int] = []
        self.x_k: list[int] = []
        self.x_cell: list[int] = []
        self.x_srv: list[int] = []  # the replica (server) its calls run on
        self.x_state: list[int] = []
        self.x_tok: list[int] = []  # call token, bumps invalidate a call
        self.x_reprefill: list[bool] = []
        self.x_version: list[int] = []
        self.x_callv0: list[float] = []
        self.x_calls: list[float] = []  # work of the call in flight
        self.x_extra: list[float] = []  # re-prefill part of that work
        self.x_done_count: list[int] = []
        self.x_trained: list[int] = []
        self.t_svc: list[float] = []
        self.t_tool: list[float] = []
        self.t_ctx: list[float] = []  # context tokens before each turn (re-prefill)
        self._steps_drawn = 0
        self.work = {"completion": 0.0, "prompt": 0.0, "train_tokens": 0.0, "service": 0.0}
        # cells
        roles = scheduler.initial_roles()
        if len(roles) != K:
            raise SchedulingError(f"scheduler built for {len(roles)} cells, cluster has {K}")
        self.c_role = list(roles)
        self.c_sync = [False] * K
        self.c_busy = [False] * K
        self.c_bound: list[set[int]] = [set() for _ in range(K)]
        self.c_bound_max = [0] * K
        S = K * R  # servers: replica r of cell c is c * R + r
        self.s_V = [0.0] * S
        self.s_t = [0.0] * S
        self.s_n = [0] * S
        self.s_rate = [0.0] * S
        self.s_heap: list[list[tuple[float, int, int, int]]] = [[] for _ in range(S)]
        self.s_ver = [0] * S
        self.s_next = [INF] * S  # time of the server's pending completion event
        self.s_bound = [0] * S  # executions pinned to it
        self.c_tp = [0.0] * K  # sum of its replicas' tokens/s
        self.c_state = [S_ROLLOUT if r == Role.ROLLOUT else S_TRAIN for r in roles]
        self.c_u = [0.0] * K
        self.c_since = [0.0] * K
        self.acc_T = [[0.0] * K for _ in range(4)]
        self.acc_U = [[0.0] * K for _ in range(4)]
        self.acc_Z = [[0.0] * K for _ in range(4)]
        self.timeline = (
            Timeline([[0.0] for _ in range(K)], [[s] for s in self.c_state], [[0.0] for _ in range(K)])
            if record_timeline
            else None
        )
        # tallies
        self.n = Counter()
        self.staleness: Counter = Counter()
        self.step_end: list[float] = []
        self.batch_done: dict[int, float] = {}  # step -> when its last execution finished
        self._sync_inflight = False
        self.served = 0.0  # work of completed calls, re-prefill excluded
        self._calls = scheduler.observes_model_calls

    # ---- workload -------------------------------------------------------------
    def _ensure_step(self, step: int) -> None:
        while self._steps_drawn <= step:
            b = self.wl.sample_step(self._steps_drawn)
            if len(b.n_turns) != self.N:
                raise SchedulingError(f"workload drew {len(b.n_turns)} executions, expected {self.N}")
            base = len(self.t_svc)
            svc = b.completion + b.prompt / self._pf
            per_turn = b.prompt + b.completion
            cs = np.cumsum(per_turn) - per_turn  # exclusive cumsum
            ctx = cs - np.repeat(cs[b.offsets[:-1]], b.n_turns)  # within each execution
            self.t_svc.extend(svc.tolist())
            self.t_tool.extend(b.tool_s.tolist())
            self.t_ctx.extend(ctx.tolist())
            self.x_off.extend((b.offsets[:-1] + base).tolist())
            self.x_turns.extend(b.n_turns.tolist())
            tokens = b.tokens.tolist()
            self.x_tokens.extend(tokens)
            n = self.N
            self.x_k.extend([0] * n)
            self.x_cell.extend([-1] * n)
            self.x_srv.extend([-1] * n)
            self.x_state.extend([X_NEW] * n)
            self.x_tok.extend([0] * n)
            self.x_reprefill.extend([False] * n)
            self.x_version.extend([-1] * n)
            self.x_callv0.extend([0.0] * n)
            self.x_calls.extend([0.0] * n)
            self.x_extra.extend([0.0] * n)
            self.x_done_count.extend([0] * n)
            self.x_trained.extend([0] * n)
            self.work["completion"] += float(b.completion.sum())
            self.work["prompt"] += float(b.prompt.sum())
            self.work["service"] += float(svc.sum())
            self.work["train_tokens"] += float(sum(tokens))
            self._steps_drawn += 1

    # ---- clock, accounting ------------------------------------------------------
    def _push(self, t: float, kind: int, a: int, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _acct(self, c: int, state: int, util: float) -> None:
        """Close cell c's current accounting segment and open a new one."""
        now = self.now
        dt = now - self.c_since[c]
        s = self.c_state[c]
        if dt > 0:
            u = self.c_u[c]
            self.acc_T[s][c] += dt
            self.acc_U[s][c] += dt * u
            if u == 0.0:
                self.acc_Z[s][c] += dt
        self.c_since[c] = now
        if state != s or util != self.c_u[c]:
            self.c_state[c] = state
            self.c_u[c] = util
            if self.timeline is not None:
                tl = self.timeline
                tl.t[c].append(now)
                tl.state[c].append(state)
                tl.util[c].append(util)

    def _advance(self, s: int) -> None:
        dt = self.now - self.s_t[s]
        if dt > 0:
            self.s_V[s] += dt * self.s_rate[s]
        self.s_t[s] = self.now

    def _servers(self, c: int) -> range:
        return range(c * self.R, (c + 1) * self.R)

    def _set_n(self, s: int, n: int) -> None:
        """Change server s's number of in-flight calls (after `_advance`)."""
        c = s // self.R
        self.s_n[s] = n
        # summed afresh, not updated by +=/-=: float drift left an empty cell at ~1e-16, never idle
        self.c_tp[c] = self._tp[n] if self.R == 1 else sum(self._tp[self.s_n[x]] for x in self._servers(c))
        if self.c_sync[c]:
            self.s_rate[s] = 0.0
            return
        self.s_rate[s] = self._ps[n]
        if self.c_role[c] == Role.ROLLOUT:
            self._acct(c, S_ROLLOUT, self.c_tp[c] / self._full)

    def _reschedule(self, s: int) -> None:
        """Make sure an event fires no later than server s's next call
        completion. An earlier pending event is kept (it re-checks when it
        fires), so a new call, which only slows the others, pushes nothing."""
        rate, h = self.s_rate[s], self.s_heap[s]
        if rate > 0.0:
            tok = self.x_tok
            while h and h[0][3] != tok[h[0][2]]:
                heapq.heappop(h)
        if rate <= 0.0 or not h:
            if self.s_next[s] != INF:
                self.s_ver[s] += 1
                self.s_next[s] = INF
            return
        dv = h[0][0] - self.s_V[s]
        t = self.now + dv / rate if dv > 0 else self.now
        if t < self.s_next[s]:
            self.s_ver[s] += 1
            self.s_next[s] = t
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, E_CELL, s, self.s_ver[s]))

    # ---- model calls --------------------------------------------------------------
    def _start_call(self, e: int) -> None:
        c = self.x_srv[e]
        idx = self.x_off[e] + self.x_k[e]
        work = self.t_svc[idx]
        extra = 0.0
        if self.x_reprefill[e]:
            extra = self.t_ctx[idx] / self._pf
            work += extra
            self.x_reprefill[e] = False
        self.x_extra[e] = extra
        now = self.now
        V = self.s_V[c] + (now - self.s_t[c]) * self.s_rate[c]
        self.s_V[c], self.s_t[c] = V, now
        tok = self.x_tok[e] + 1
        self.x_tok[e] = tok
        self.x_state[e] = X_CALL
        self.x_callv0[e] = V
        self.x_calls[e] = work
        self._seq += 1
        heapq.heappush(self.s_heap[c], (V + work, self._seq, e, tok))
        self._set_n(c, self.s_n[c] + 1)
        self._reschedule(c)
        if self._calls:
            self._events.append(ModelCallStarted(e, self.x_cell[e]))

    def _cancel_call(self, e: int) -> None:
        c = self.x_srv[e]
        self._advance(c)
        self.n["wasted_tokens"] += min(self.x_calls[e], self.s_V[c] - self.x_callv0[e])
        self.x_extra[e] = 0.0
        self.x_tok[e] += 1
        self._set_n(c, self.s_n[c] - 1)
        self._reschedule(c)

    def _on_cell(self, c: int, ver: int) -> None:
        """Server c's earliest call may be complete (c is a server id)."""
        if ver != self.s_ver[c]:
            return
        self.s_next[c] = INF
        now, rate = self.now, self.s_rate[c]
        V = self.s_V[c] + (now - self.s_t[c]) * rate
        self.s_V[c], self.s_t[c] = V, now
        h, tok, off, k = self.s_heap[c], self.x_tok, self.x_off, self.x_k
        heap, pop, push = self._heap, heapq.heappop, heapq.heappush
        tol = 1e-9 * (1.0 + V)
        n0 = n = self.s_n[c]
        while h:
            vf, _, e, t = h[0]
            if t != tok[e]:
                pop(h)
                continue
            dv = vf - V
            if dv > tol and now + dv / rate > now:
                break
            pop(h)
            n -= 1
            idx = off[e] + k[e]
            self.served += self.t_svc[idx]
            if self.x_extra[e]:
                self.n["reprefill_tokens"] += self.x_extra[e]
            self.x_state[e] = X_TOOL
            tok[e] = t + 1
            self._seq += 1
            push(heap, (now + self.t_tool[idx], self._seq, E_TOOL, e, 0))
            if self._calls:
                self._events.append(ModelCallFinished(e, self.x_cell[e]))
        if n != n0:
            self.n["model_calls"] += n0 - n
            self._set_n(c, n)
        self._reschedule(c)

    def _on_tool(self, e: int) -> None:
        self.x_k[e] += 1
        if self.x_k[e] == self.x_turns[e]:
            c = self.x_cell[e]
            self.x_state[e] = X_DONE
            self.batch_done[e // self.N] = self.now
            self.x_done_count[e] += 1
            if c >= 0:
                self.c_bound[c].discard(e)
                self._unpin(e)
            self.x_cell[e] = -1
            self._events.append(ExecutionFinished(e, c, self.x_tokens[e]))
        elif self.x_cell[e] < 0:
            self.x_state[e] = X_WAIT
        else:
            self._start_call(e)

    # ---- commands -------------------------------------------------------------------
    def _apply(self, cmd: Any) -> None:
        t = type(cmd)
        if t is Bind:
            self._bind(cmd.execution, cmd.cell)
        elif t is Dispatch:
            self._dispatch(cmd.group, cmd.version)
        elif t is RunMicroBatch:
            self._micro_batch(cmd.cell, cmd.executions, cmd.version)
        elif t is Migrate:
            self._migrate(cmd.execution, cmd.cell)
        elif t is SwitchRole:
            self._switch(cmd.cell, cmd.role)
        elif t is SyncWeights:
            self._sync(cmd.version, cmd.cells)
        else:
            raise SchedulingError(f"unknown command {cmd!r}")

    def _check_room(self, c: int, what: str) -> None:
        if not 0 <= c < self.K:
            raise SchedulingError(f"{what}: no cell {c}")
        if self.c_role[c] != Role.ROLLOUT:
            raise SchedulingError(f"{what}: cell {c} is {self.c_role[c].name}, not ROLLOUT")
        if len(self.c_bound[c]) >= self.C:
            raise SchedulingError(f"{what}: cell {c} is full ({self.C} executions)")

    def _unpin(self, e: int) -> None:
        self.s_bound[self.x_srv[e]] -= 1
        self.x_srv[e] = -1

    def _hold(self, e: int, c: int) -> None:
        """Bind e to cell c, pinned to its replica with the fewest executions
        (a router keeps a session on one replica: its KV cache lives there)."""
        b = self.c_bound[c]
        b.add(e)
        self.x_cell[e] = c
        sb = self.s_bound
        s = min(self._servers(c), key=lambda i: sb[i]) if self.R > 1 else c
        sb[s] += 1
        self.x_srv[e] = s
        if len(b) > self.c_bound_max[c]:
            self.c_bound_max[c] = len(b)

    def _dispatch(self, g: int, version: int) -> None:
        self._ensure_step(g // self.G)
        for e in range(g * self.gs, (g + 1) * self.gs):
            if self.x_state[e] != X_NEW:
                raise SchedulingError(f"group {g} dispatched twice")
            self.x_state[e] = X_QUEUED
            self.x_version[e] = version
            self.n["dispatched"] += 1
            self._events.append(ExecutionDispatched(e, g))

    def _bind(self, e: int, c: int) -> None:
        st = self.x_state[e] if 0 <= e < len(self.x_state) else -1
        if st not in (X_QUEUED, X_WAIT, X_TOOL) or self.x_cell[e] >= 0:
            raise SchedulingError(f"bind: execution {e} is not waiting for a cell")
        self._check_room(c, f"bind execution {e}")
        self._hold(e, c)
        if st == X_QUEUED:
            self.n["started"] += 1
            self._events.append(ExecutionStarted(e, c))
            self._start_call(e)
        elif st == X_WAIT:
            self._start_call(e)

    def _migrate(self, e: int, c: int) -> None:
        old = self.x_cell[e] if 0 <= e < len(self.x_cell) else -1
        if old < 0 or old == c:
            raise SchedulingError(f"migrate: execution {e} is not bound elsewhere")
        self._check_room(c, f"migrate execution {e}")
        self.c_bound[old].discard(e)
        in_call = self.x_state[e] == X_CALL
        if in_call:
            self._cancel_call(e)
            self.n["reissued_calls"] += 1
        self._unpin(e)
        self.n["migrations"] += 1
        self.x_reprefill[e] = True
        self._hold(e, c)
        if in_call:
            self._start_call(e)

    def _switch(self, c: int, role: Role) -> None:
        cur = self.c_role[c]
        if role not in (Role.ROLLOUT, Role.TRAIN) or cur not in (Role.ROLLOUT, Role.TRAIN) or cur == role:
            raise SchedulingError(f"switch cell {c}: {cur.name} -> {Role(role).name} is not a role change")
        if self.c_busy[c] or self.c_sync[c]:
            raise SchedulingError(f"switch cell {c}: busy training or syncing")
        if cur == Role.ROLLOUT:
            for e in sorted(self.c_bound[c]):  # not migrated: the harness sees an error
                aborted = self.x_state[e] == X_CALL
                if aborted:
                    self._cancel_call(e)
                    self.x_state[e] = X_WAIT
                    self.n["aborted_turns"] += 1
                self.x_reprefill[e] = True
                self._unpin(e)
                self.x_cell[e] = -1
                self._events.append(ExecutionOrphaned(e, c, aborted))
            self.c_bound[c].clear()
            for s in self._servers(c):
                self._advance(s)
                self.s_rate[s] = 0.0
                self._reschedule(s)
        self.c_role[c] = Role.TO_TRAIN if role == Role.TRAIN else Role.TO_ROLLOUT
        self._acct(c, S_SWITCH, 0.0)
        cl = self.cfg.cluster
        cost = cl.switch_to_train_s if role == Role.TRAIN else cl.switch_to_rollout_s
        self.n["switches"] += 1
        self._push(self.now + cost, E_SWITCH, c, role)

    def _on_switch(self, c: int, role: Role) -> None:
        self.c_role[c] = role
        if role == Role.ROLLOUT:
            for s in self._servers(c):
                self._advance(s)
                self._set_n(s, self.s_n[s])
            self._acct(c, S_ROLLOUT, self.c_tp[c] / self._full)
        else:
            self._acct(c, S_TRAIN, 0.0)
        self._events.append(RoleSwitchDone(c, role))

    def _micro_batch(self, c: int, execs: tuple[int, ...], version: int) -> None:
        if self.c_role[c] != Role.TRAIN or self.c_busy[c] or self.c_sync[c]:
            raise SchedulingError(f"micro-batch on cell {c}: not an idle train cell ({self.c_role[c].name})")
        cl = self.cfg.cluster
        if not execs or len(execs) > cl.train_replicas:
            raise SchedulingError(
                f"micro-batch on cell {c}: {len(execs)} executions, a cell trains 1 to {cl.train_replicas} at once"
            )
        tokens = []
        for e in execs:
            if self.x_state[e] != X_DONE or self.x_trained[e]:
                raise SchedulingError(f"micro-batch: execution {e} not finished or already trained")
            self.x_trained[e] += 1
            tokens.append(self.x_tokens[e])
            self.staleness[version - self.x_version[e]] += 1
        self.n["trained_tokens"] += sum(tokens)
        self.n["micro_batches"] += 1
        self.c_busy[c] = True
        dt = cl.micro_batch_s(tokens)
        # share of the cell's training throughput the micro-batch uses (idle replicas on a short one)
        self._acct(c, S_TRAIN, sum(tokens) / cl.train_tps / dt if dt > 0 else 1.0)
        self._push(self.now + dt, E_MB, c, execs)

    def _on_micro_batch(self, c: int, execs: tuple[int, ...]) -> None:
        self.c_busy[c] = False
        self._acct(c, S_TRAIN, 0.0)
        self._events.append(MicroBatchDone(c, execs))

    def _sync(self, version: int, cells: tuple[int, ...]) -> None:
        if self._sync_inflight:
            raise SchedulingError("weight sync while another is in flight")
        for c in cells:
            if self.c_role[c] not in (Role.ROLLOUT, Role.TRAIN) or self.c_busy[c]:
                raise SchedulingError(f"weight sync: cell {c} is {self.c_role[c].name} / busy")
        self._sync_inflight = True
        flush = self.cfg.cluster.sync_flushes_kv
        for c in cells:
            for s in self._servers(c):
                self._advance(s)
            if flush and self.c_role[c] == Role.ROLLOUT:
                self._flush_kv(c)
            self.c_sync[c] = True
            for s in self._servers(c):
                self.s_rate[s] = 0.0
                self._reschedule(s)
            self._acct(c, S_SYNC, 0.0)
        self._push(self.now + self.cfg.cluster.weight_sync_s, E_SYNC, version, cells)

    def _flush_kv(self, c: int) -> None:
        """New weights on cell c (after `_advance`): its executions' cached
        contexts are stale. A call in flight grows by the re-prefill of the
        context before its turn; the others re-prefill at their next call."""
        for e in self.c_bound[c]:
            st = self.x_state[e]
            if st == X_CALL:
                extra = self.t_ctx[self.x_off[e] + self.x_k[e]] / self._pf
                if extra <= 0.0:
                    continue
                self.x_calls[e] += extra
                self.x_extra[e] += extra
                tok = self.x_tok[e] + 1
                self.x_tok[e] = tok
                self._seq += 1
                heapq.heappush(self.s_heap[self.x_srv[e]], (self.x_callv0[e] + self.x_calls[e], self._seq, e, tok))
                self.n["kv_flushes"] += 1
            elif st == X_TOOL and self.x_k[e] + 1 < self.x_turns[e]:
                self.x_reprefill[e] = True
                self.n["kv_flushes"] += 1

    def _on_sync(self, version: int, cells: tuple[int, ...]) -> None:
        self._sync_inflight = False
        for c in cells:
            self.c_sync[c] = False
            for s in self._servers(c):
                self._advance(s)
            if self.c_role[c] == Role.ROLLOUT:
                for s in self._servers(c):
                    self._set_n(s, self.s_n[s])
                    self._reschedule(s)
            else:
                self._acct(c, S_TRAIN, 0.0)
        self.step_end.append(self.now)
        self._events.append(WeightSyncDone(version))

    # ---- main loop ------------------------------------------------------------------
    def _drain(self) -> None:
        ev, handle, apply = self._events, self.sched.handle, self._apply
        while ev:
            for cmd in handle(ev.popleft()):
                apply(cmd)

    def run(self) -> SimResult:
        for cmd in self.sched.start():
            self._apply(cmd)
        self._drain()
        heap, pop = self._heap, heapq.heappop
        on_cell, on_tool = self._on_cell, self._on_tool
        events = 0
        while not self.sched.done:
            if not heap:
                raise SchedulingError(
                    f"deadlock: {self.sched.name} is waiting but nothing is running "
                    f"(t={self.now:.1f} s, steps done {self.sched.steps_done})"
                )
            t, _, kind, a, b = pop(heap)
            self.now = t
            events += 1
            if kind == E_CELL:
                on_cell(a, b)
            elif kind == E_TOOL:
                on_tool(a)
            elif kind == E_MB:
                self._on_micro_batch(a, b)
            elif kind == E_SWITCH:
                self._on_switch(a, b)
            else:
                self._on_sync(a, b)
            if self._events:
                self._drain()
        self.n["timed_events"] = events
        return self._result()

    def _result(self) -> SimResult:
        wall = self.now
        for c in range(self.K):
            self._acct(c, self.c_state[c], self.c_u[c])
        T = [sum(x) for x in self.acc_T]
        U = [sum(x) for x in self.acc_U]
        Z = [sum(x) for x in self.acc_Z]
        cl = self.cfg.cluster
        cell_s = self.K * wall if wall > 0 else 1.0
        trained = sum(self.staleness.values())
        stale = sorted(self.staleness.elements()) if trained else [0]
        m = {
            "wall_s": wall,
            "wall_h": wall / 3600,
            "steps": float(len(self.step_end)),
            # training not hidden behind rollout: last execution of a batch finished -> its weights synced
            "post_rollout_h": float(np.mean([t - self.batch_done[s] for s, t in enumerate(self.step_end)])) / 3600
            if self.step_end
            else 0.0,
            "cells": float(self.K),
            "accelerator_hours": self.K * cl.accelerators_per_cell * wall / 3600,
            "idle_rollout": Z[S_ROLLOUT] / T[S_ROLLOUT] if T[S_ROLLOUT] else 0.0,
            "util_rollout": U[S_ROLLOUT] / T[S_ROLLOUT] if T[S_ROLLOUT] else 0.0,
            "idle_train": Z[S_TRAIN] / T[S_TRAIN] if T[S_TRAIN] else 0.0,
            "frac_rollout": T[S_ROLLOUT] / cell_s,
            "frac_train": T[S_TRAIN] / cell_s,
            "frac_switch": T[S_SWITCH] / cell_s,
            "frac_sync": T[S_SYNC] / cell_s,
            "busy": (U[S_ROLLOUT] + U[S_TRAIN]) / cell_s,
            "staleness_mean": float(np.mean(stale)),
            "staleness_max": float(max(stale)),
            "aborted_turns": float(self.n["aborted_turns"]),
            "switches": float(self.n["switches"]),
            "reissued_calls": float(self.n["reissued_calls"]),
            "migrations": float(self.n["migrations"]),
            "reprefill_tokens": float(self.n["reprefill_tokens"]),
            "wasted_tokens": float(self.n["wasted_tokens"]),
            "kv_flushes": float(self.n["kv_flushes"]),
            "model_calls": float(self.n["model_calls"]),
            "trained_executions": float(trained),
            "timed_events": float(self.n["timed_events"]),
        }
        n_x = self._steps_drawn * self.N
        wanted = len(self.step_end) * self.N
        checks = {
            "finished_once": all(x == 1 for x in self.x_done_count[:wanted]),
            "trained_once": all(x == 1 for x in self.x_trained[:wanted]),
            "executions": wanted,
            "drawn": n_x,
            "max_bound": max(self.c_bound_max),
            "capacity": self.C,
            "workload_service": float(sum(self.t_svc[: self.x_off[wanted - 1] + self.x_turns[wanted - 1]]))
            if wanted
            else 0.0,
            "workload_turns": sum(self.x_turns[:wanted]),
            "served_service": self.served,
            "model_calls": self.n["model_calls"],
            # tokens the cells' throughput integral delivered vs. what calls consumed
            "throughput_integral": U[S_ROLLOUT] * self._full,
            "consumed": self.served + self.n["reprefill_tokens"] + self.n["wasted_tokens"],
            "trained_tokens": float(self.n["trained_tokens"]),
            "workload_train_tokens": float(sum(self.x_tokens[:wanted])),
        }
        return SimResult(self.sched.name, wall, list(self.step_end), m, dict(self.staleness), self.timeline, checks)


def build_scheduler(name: str, cfg: SimConfig) -> Scheduler:
    """A scheduler for `cfg`'s cluster and workload, with `cfg.policy` knobs."""
    base = dict(
        cells=cfg.cluster.cells,
        capacity=cfg.cluster.capacity,
        groups_per_step=cfg.workload.groups_per_step,
        group_size=cfg.workload.group_size,
        steps=cfg.steps,
        train_unit=cfg.policy.train_unit,
        mb_size=cfg.cluster.train_replicas,
        balance_micro_batches=cfg.policy.balance_micro_batches,
    )
    if name == "async":
        base.update(
            train_cells=cfg.policy.async_train_cells,
            staleness=cfg.policy.staleness,
            stream=cfg.policy.async_stream,
            batch_order=cfg.policy.async_batch_order,
        )
    elif name == "elastic-async":
        base.update(staleness=cfg.policy.staleness, gate_ready_per_cell=cfg.policy.elastic_async_ready_per_cell)
    elif name in ("elastic", "elastic-gated"):
        base.update(reissue=cfg.policy.elastic_reissue, gate_ready_per_cell=cfg.policy.elastic_gate_ready_per_cell)
        if name == "elastic":
            base.update(gate_on_ready_work=cfg.policy.elastic_gate_on_ready_work)
    return make_scheduler(name, **base)


def simulate(cfg: SimConfig, policy: str, record_timeline: bool = False, base_dir: Path | None = None) -> SimResult:
    """Run one schedule on `cfg` (same workload draws for every schedule)."""
    wl = Workload(cfg.workload, cfg.seed, base_dir)
    return Simulator(cfg, build_scheduler(policy, cfg), wl, record_timeline).run()


def compare(
    cfg: SimConfig, policies: list[str], record_timeline: bool = False, base_dir: Path | None = None
) -> list[SimResult]:
    """Each schedule on the same workload and seed."""
    return [simulate(cfg, p, record_timeline, base_dir) for p in policies]
