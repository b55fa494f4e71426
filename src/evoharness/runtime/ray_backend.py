"""`ray` backend: the cells are Ray actors (one cluster, one or many machines).

The same world as `local_backend.LocalBackend` (the executions' agent loops
stay in the driver; the cells replay the workload's calls, micro-batches,
role switches and weight syncs in real time); only the transport differs:
each cell is a threaded Ray actor whose jobs run concurrently, a job's result
is an ObjectRef the driver waits on (`ray.wait`), and a dead actor
(`RayActorError`) is a lost cell, replaced by a new actor. Ray does the
cluster work: ``address=None`` starts a local head, an address joins an
existing cluster (``ray start --head`` on one machine, ``ray start
--address`` on the others). Needs the ``ray`` extra
(``pip install -e .[ray]``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from evoharness.runtime.cells import Role
from evoharness.runtime.local_backend import LocalBackend
from evoharness.runtime.workload import SimConfig


class _Cell:
    """The actor: runs each timed job in its own thread, replies like a cell process."""

    def __init__(self, cell: int):
        self.cell = cell

    def job(self, kind: str, token: int, payload: Any, seconds: float) -> tuple:
        time.sleep(seconds)
        return (self.cell, os.getpid(), kind, token, payload)

    def pid(self) -> int:
        return os.getpid()


class RayBackend(LocalBackend):
    """K cells as Ray actors. Args (beyond `LocalBackend`'s): address: a Ray
    cluster to join (None: start a local one on 127.0.0.1); num_cpus: what
    each actor reserves (fractions let many actors share a small machine)."""

    def __init__(self, cfg: SimConfig, roles: list[Role], time_scale: float = 1e-3, address: str | None = None,
                 num_cpus: float = 0.25, state: dict[str, Any] | None = None):
        import ray

        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=os.cpu_count() or 1,
                         log_to_driver=False)
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self._actor_cls = ray.remote(num_cpus=num_cpus, max_concurrency=1024)(_Cell)
        self._refs: dict[Any, int] = {}          # ObjectRef -> cell
        super().__init__(cfg, roles, time_scale, state)

    # ---- transport ------------------------------------------------------------
    def _start_cells(self, k: int) -> None:
        self.actors = [self._actor_cls.remote(c) for c in range(k)]
        self._ray.get([a.pid.remote() for a in self.actors])   # up before the first command
        self._dead: set[int] = set()

    def _post(self, cell: int, msg: tuple) -> None:
        if msg[0] in ("cancel", "stop"):
            return   # a cancelled job's reply is dropped by its token (`_jobs`)
        self._refs[self.actors[cell].job.remote(*msg)] = cell

    def _dead_cells(self) -> list[int]:
        dead, self._dead = sorted(self._dead), set()
        return dead

    def _next_reply(self, timeout: float) -> tuple | None:
        if not self._refs:
            time.sleep(timeout)
            return None
        ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if not ready:
            return None
        cell = self._refs.pop(ready[0])
        try:
            return self._ray.get(ready[0])
        except self._ray.exceptions.RayActorError:
            self._dead.add(cell)      # reported as CellLost by the next poll
            for ref in [r for r, c in self._refs.items() if c == cell]:
                del self._refs[ref]
            return None

    def _respawn(self, c: int) -> None:
        self.actors[c] = self._actor_cls.remote(c)

    def kill_cell(self, c: int) -> None:
        """Kill cell c's actor (fault injection)."""
        self._ray.kill(self.actors[c], no_restart=True)

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a, no_restart=True)
