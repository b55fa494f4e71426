"""The synthetic replay: a simulator workload played in real time on K cells, as composition.

The simulator (`runtime.sim`) and a real run share the schedulers; the replay runs the same
workload draw (`runtime.workload.Workload`) through the real control plane (a `CellBackend`, its
transport, its cells) with every cost turned into a timed job, so the two can be compared
(``benchmarks/sim_vs_local.py``) and the runtime tested without a model:

    workload    `ReplayWorkload`: execution e plays its draw's turns; a turn is one model call
                lasting its decode work at ``gen_tps_single`` (prompt tokens at
                ``prefill_speedup``), then its tool delay; nothing to train
    training    `TimedTraining`: a micro-batch lasts ``cluster.micro_batch_s`` of its executions'
                tokens, a weight sync ``weight_sync_s`` on each cell of the sync, a role switch
                ``switch_to_train_s`` / ``switch_to_rollout_s``
    cells       `runtime.cell.TimedCell`: each job completes after its seconds, concurrently
                (a cell serves its calls in parallel: no processor sharing, as a simulator with
                ``gen_concurrency_exponent = 1``)

All durations are the workload's simulated seconds times ``time_scale`` (real seconds per
simulated second). `replay_backend` assembles the whole world on any transport::

    be = replay_backend(cfg, sched.initial_roles(), time_scale=2e-3, backend="local")
    stats = Driver(sched, be).run()

It measures what the simulator measures (idle ratios, switches, aborted turns, migrations) and
loses and replaces cells like any run (`runtime.cell_backend`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from evoharness.config.sim import SimConfig
from evoharness.runtime.cells import Role
from evoharness.runtime.events import MicroBatchDone, RunMicroBatch, SyncWeights, WeightSyncDone
from evoharness.runtime.workload import StepBatch, Workload


class WorkloadDraw:
    """The executions of a workload draw: execution ``e`` is execution ``e % N`` of step
    ``e // N``'s `StepBatch` (each step drawn once, from (seed, step) only).

    Args:
        cfg: the workload and its seed.
    """

    def __init__(self, cfg: SimConfig):
        self.wl = Workload(cfg.workload, cfg.seed)
        self.N = cfg.workload.groups_per_step * cfg.workload.group_size
        self._steps: dict[int, StepBatch] = {}

    def turns(self, e: int) -> tuple[StepBatch, int, int]:
        """(the step's batch, e's first turn index in it, e's turn count)."""
        step, i = divmod(e, self.N)
        if step not in self._steps:
            self._steps[step] = self.wl.sample_step(step)
        b = self._steps[step]
        return b, int(b.offsets[i]), int(b.n_turns[i])

    def forget(self, before_step: int) -> None:
        """Drop the draws of steps before `before_step` (they are drawn again if asked for)."""
        for s in [s for s in self._steps if s < before_step]:
            del self._steps[s]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_steps": {}}  # a draw is a function of (seed, step): not kept


class ReplayWorkload:
    """The replay's agents (`runtime.cell_backend.AgentWorkload`; module docstring).

    A call's payload is shaped like a model cell's answer (``{"result": {"execution", "turn"},
    "seconds", "version"}``) because a `TimedCell` answers with the payload itself; its duration
    goes in the job (`call_seconds`). Weights versions are what the steps recorded so far (the
    replay has no weights).

    Args:
        cfg: the workload draw and the cluster's decode speeds.
        time_scale: real seconds per simulated second.
    """

    def __init__(self, cfg: SimConfig, time_scale: float = 1e-3):
        self.cfg, self.scale = cfg, time_scale
        self.draw = WorkloadDraw(cfg)
        self.N, self.G = self.draw.N, cfg.workload.group_size
        self.x_k: dict[int, int] = {}  # execution -> turns answered
        self.x_ver: dict[int, list[int]] = {}  # execution -> the version each answered call saw
        self.x_t: dict[int, list[float]] = {}  # execution -> [start, end] (monotonic seconds)
        self.newest = 0

    # ---- executions ------------------------------------------------------------------------
    def start(self, e: int) -> None:
        self.x_k[e], self.x_ver[e], self.x_t[e] = 0, [], [time.monotonic(), 0.0]

    def request(self, e: int) -> dict[str, Any] | None:
        if self.finished(e):
            return None
        return {
            "result": {"execution": e, "turn": self.x_k[e]},
            "seconds": self.call_seconds(e),
            "version": self.newest,
        }

    def call_seconds(self, e: int) -> float:
        """Real seconds e's pending call runs on its cell: its decode work (prompt tokens at
        ``prefill_speedup`` x the decode speed) at ``gen_tps_single``, scaled."""
        b, off, _ = self.draw.turns(e)
        i, cl = off + self.x_k[e], self.cfg.cluster
        work = float(b.completion[i]) + float(b.prompt[i]) / cl.prefill_speedup
        return work / cl.gen_tps_single * self.scale

    def reply(self, e: int, result: dict[str, Any]) -> None:
        turn = result["result"]["turn"]
        if turn != self.x_k[e]:
            raise RuntimeError(f"execution {e}: the answer of turn {turn} arrived in turn {self.x_k[e]}")
        self.x_ver[e].append(int(result["version"]))
        self.x_k[e] += 1
        if self.finished(e):
            self.x_t[e][1] = time.monotonic() + self.tool_delay(e)

    def tool_delay(self, e: int) -> float:
        """The scaled tool delay after e's last answered turn."""
        b, off, _ = self.draw.turns(e)
        return float(b.tool_s[off + self.x_k[e] - 1]) * self.scale

    def finished(self, e: int) -> bool:
        return e in self.x_k and self.x_k[e] >= self.draw.turns(e)[2]

    def woken(self) -> list[int]:
        return []

    def tokens(self, e: int) -> int:
        """Trajectory tokens of e's turns played so far (its draw's total once finished)."""
        b, off, _ = self.draw.turns(e)
        k = self.x_k.get(e, 0)
        return int(round(float((b.prompt[off : off + k] + b.completion[off : off + k]).sum())))

    def calls(self, e: int) -> list[dict[str, Any]]:
        """e's answered calls for the trace: full prompts (the new tokens on top of the context so
        far, as the simulator's trace format counts them), completions, versions."""
        b, off, _ = self.draw.turns(e)
        out, ctx = [], 0.0
        for k, v in enumerate(self.x_ver.get(e, [])):
            p, c = float(b.prompt[off + k]), float(b.completion[off + k])
            out.append({"prompt_tokens": int(round(ctx + p)), "completion_tokens": int(round(c)), "policy_version": v})
            ctx += p + c
        return out

    def trace_key(self, e: int) -> tuple[str, str, float]:
        t0, t1 = self.x_t[e]
        return f"replay-g{(e % self.N) // self.G}", f"e{e}", round(max(0.0, t1 - t0), 4)

    # ---- training: nothing to train (`TimedTraining` times it) ------------------------------------
    def micro_batch(self, executions: tuple[int, ...], version: int) -> None:
        return None

    def sync(self, version: int, executions: list[int], ranks: int) -> list[dict[str, Any]]:
        return [{"updates": [], "lr": 0.0, "step": version - 1, "scale": 1.0} for _ in range(ranks)]

    def step_done(
        self, version: int, executions: list[int], stats: dict[str, Any], timing: dict[str, float]
    ) -> dict[str, Any]:
        """The step's record (executions and tokens trained); its executions' books dropped."""
        rec = {
            "step": version,
            "policy_version": version,
            "executions": len(executions),
            "tokens": sum(self.tokens(e) for e in executions),
            **{f"timing_s/{k}": v for k, v in timing.items()},
        }
        self.newest = max(self.newest, version)
        for e in executions:
            for books in (self.x_k, self.x_ver, self.x_t):
                books.pop(e, None)
        self.draw.forget(min((e // self.N for e in self.x_k), default=version - 1))
        return rec

    # ---- job checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "x_k": dict(self.x_k),
            "x_ver": {e: list(v) for e, v in self.x_ver.items()},
            "x_age": {e: [now - t0, (t1 - now) if t1 else None] for e, (t0, t1) in self.x_t.items()},
            "newest": self.newest,
        }

    def restore(self, st: dict[str, Any]) -> None:
        now = time.monotonic()
        self.x_k, self.x_ver, self.newest = dict(st["x_k"]), {e: list(v) for e, v in st["x_ver"].items()}, st["newest"]
        self.x_t = {e: [now - age, (now + left) if left is not None else 0.0] for e, (age, left) in st["x_age"].items()}

    def close(self) -> None:
        pass


class TimedTraining:
    """The replay's training coordinator (what `runtime.cell_backend.ModelTraining` is for models):
    every training cost is a `TimedCell` job of the cluster's duration, times `time_scale`.

    - a micro-batch: a ``train`` job on its cell lasting ``cluster.micro_batch_s`` of its
      executions' trajectory tokens; its answer is the `MicroBatchDone`;
    - a weight sync: a ``load`` job on each cell of the sync lasting ``weight_sync_s``; the last
      one done is the `WeightSyncDone` (the step is recorded when the sync is commanded: the
      replay's optimizer step costs nothing beyond the sync);
    - a role switch: a ``switch`` job lasting ``switch_to_train_s`` or ``switch_to_rollout_s``.

    A micro-batch lost with its cell is re-claimed by the scheduler; a lost weight load counts as
    done (the replacement starts from the newest weights).

    Args:
        cfg: the cluster's costs.
        time_scale: real seconds per simulated second.
    """

    def __init__(self, cfg: SimConfig, time_scale: float = 1e-3):
        self.cluster, self.scale = cfg.cluster, time_scale
        self.be: Any = None
        self._trained: dict[int, set[int]] = {}  # version -> executions trained on it
        self._left: dict[int, int] = {}  # version -> weight loads outstanding

    def attach(self, backend: Any, state: dict[str, Any] | None) -> None:
        self.be = backend
        if state:
            self._trained = {v: set(x) for v, x in state["trained"].items()}

    def state(self) -> dict[str, Any]:
        return {"trained": {v: sorted(x) for v, x in self._trained.items()}}

    def switch(self, cell: int, role: Role) -> None:
        cl = self.cluster
        seconds = cl.switch_to_train_s if role == Role.TRAIN else cl.switch_to_rollout_s
        self.be.send(cell, "switch", int(role), seconds * self.scale, key=int(role))

    def micro_batch(self, c: RunMicroBatch) -> None:
        self._trained.setdefault(c.version, set()).update(c.executions)
        tokens = [float(self.be.workload.tokens(e)) for e in c.executions]
        self.be.send(
            c.cell,
            "train",
            tuple(c.executions),
            self.cluster.micro_batch_s(tokens) * self.scale,
            key=("train", c.version, tuple(c.executions)),
        )

    def sync(self, c: SyncWeights) -> None:
        be = self.be
        be.record_step(
            c.version, sorted(self._trained.pop(c.version - 1, set())), {"micro": [], "ranks": []}, {"train": 0.0}
        )
        self._left[c.version] = len(c.cells)
        for cell in c.cells:
            be.send(cell, "load", c.version, self.cluster.weight_sync_s * self.scale, key=("load", c.version))
        if not c.cells:
            self._loaded(c.version, 0)

    def on_reply(self, cell: int, kind: str, key: Any, result: Any) -> None:
        if kind == "train":
            self.be.emit(MicroBatchDone(cell, key[2]))
        elif kind == "load":
            self._loaded(key[1])

    def _loaded(self, version: int, n: int = 1) -> None:
        self._left[version] -= n
        if self._left[version] <= 0:
            del self._left[version]
            self.be.emit(WeightSyncDone(version))

    def cell_lost(self, cell: int) -> None:
        """A lost cell is the scheduler's business (the core's loss fails the job there)."""

    def job_lost(self, cell: int, kind: str, key: Any, token: int) -> None:
        if kind == "train":
            _, version, executions = key
            self._trained.get(version, set()).difference_update(executions)
        elif kind == "load":
            self._loaded(key[1])


def replay_backend(
    cfg: SimConfig,
    roles: list,
    time_scale: float = 1e-3,
    backend: str = "local",
    work_dir: str | Path | None = None,
    state: dict[str, Any] | None = None,
    gateway: Any = None,
    ready_timeout_s: float = 300.0,
    **ray: Any,
) -> Any:
    """The replay of `cfg`'s workload on K timed cells (module docstring): a `CellBackend` with
    the transport named by `backend` (``local``: processes, ``ray``: actors, `ray` its
    ``address`` / ``num_cpus``; ``inprocess``: one cell).

    Args:
        roles: the scheduler's initial roles.
        time_scale: real seconds per simulated second.
        work_dir: where the call trace goes (None: a temporary directory, removed with the backend).
        state: a job checkpoint's backend state to carry on from (`Driver.resume`).
        gateway: a `runtime.gateway_cells.CellGateway` the calls go through.
    """
    from evoharness.runtime.cell import TimedCell
    from evoharness.runtime.cell_backend import CellBackend
    from evoharness.runtime.transport import make_transport

    tmp = None
    if work_dir is None:
        work_dir = tmp = tempfile.mkdtemp(prefix="evoharness-replay-")
    try:
        be = CellBackend(
            cfg,
            roles,
            make_transport(backend, **ray),
            TimedCell,
            ReplayWorkload(cfg, time_scale),
            TimedTraining(cfg, time_scale),
            work_dir,
            gateway=gateway,
            state=state,
            ready_timeout_s=ready_timeout_s,
        )
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tmp is not None:
        weakref.finalize(be, shutil.rmtree, tmp, True)
    return be
