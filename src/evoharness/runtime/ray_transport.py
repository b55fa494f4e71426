"""The Ray transport: each cell a Ray actor, on one machine or a cluster (``runtime.backend = "ray"``).

An actor runs the same cell loop as a cell process (`runtime.cell.serve`) on a thread of its
own, its inbox a `queue.Queue`; each job is one actor method call whose ObjectRef the driver
waits on (`ray.wait`), a cancel another method call, and a dead actor (`RayActorError`) a lost
cell, replaced by a new actor. ``address=None`` starts a local head on 127.0.0.1; an address joins
an existing cluster (``ray start --head`` on one machine, ``ray start --address`` on the others).
Needs the ``ray`` extra (``pip install -e .[ray]``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from evoharness.runtime.cell import serve
from evoharness.runtime.transport import Reply

MAX_JOBS = 1024  # jobs one actor holds at once (each waits on an actor thread)
_REMOTE: dict[type, Any] = {}


class _CellActor:
    """A cell as an actor: `runtime.cell.serve` on a thread behind a queue. ``job`` enqueues a job
    and blocks (on one of the actor's threads) until the cell answers it; ``cancel`` skips a job
    still queued and answers its ``job`` with None at once. If the cell loop raises, the actor
    process exits: the driver sees a lost cell, as with a crashed cell process."""

    def __init__(self, cell: int, make_worker: Callable[[int], Any]):
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._cancelled: set[int] = set()
        self._ready: Future = Future()
        threading.Thread(target=self._main, args=(cell, make_worker), daemon=True).start()

    def _main(self, cell: int, make_worker: Callable[[int], Any]) -> None:
        try:
            serve(cell, make_worker, self._inbox, self._reply, watch_parent=False)
        except BaseException:  # noqa: BLE001 -- a broken cell is a dead cell, as a crashed process
            traceback.print_exc()
            os._exit(1)

    def _reply(self, msg: tuple) -> None:
        if msg[2] == "ready":
            self._ready.set_result(msg)
            return
        with self._lock:
            fut = self._waiting.pop(msg[3], None)
        if fut is not None:
            fut.set_result(msg)

    def ready(self) -> tuple:
        return self._ready.result()

    def job(self, kind: str, token: int, payload: Any, seconds: float = 0.0) -> tuple | None:
        fut: Future = Future()
        with self._lock:
            if token in self._cancelled:  # the cancel overtook its job
                self._cancelled.discard(token)
                return None
            self._waiting[token] = fut
        self._inbox.put((kind, token, payload, seconds))
        return fut.result()

    def cancel(self, token: int) -> None:
        with self._lock:
            fut = self._waiting.pop(token, None)
            if fut is None:
                self._cancelled.add(token)
        self._inbox.put(("cancel", token))
        if fut is not None:
            fut.set_result(None)

    def stop(self) -> None:
        self._inbox.put(("stop",))


def _actor_class() -> Any:
    """`ray.remote(_CellActor)`, made once."""
    if _CellActor not in _REMOTE:
        import ray

        _REMOTE[_CellActor] = ray.remote(_CellActor)
    return _REMOTE[_CellActor]


class RayTransport:
    """A Ray actor per cell (module docstring).

    Args:
        address: a Ray cluster to join (None: start a local head on 127.0.0.1).
        num_cpus: what each cell actor reserves (fractions let many actors share a small machine:
            on 2 cores, actors of 1 CPU beyond two never start).

    Raises:
        ValueError: Ray is not installed.
    """

    def __init__(self, address: str | None = None, num_cpus: float = 0.25):
        try:
            import ray
        except ImportError as e:
            raise ValueError("the ray backend needs Ray: pip install -e '.[ray]'") from e
        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    num_cpus=os.cpu_count() or 1,
                    log_to_driver=False,
                )
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.num_cpus = num_cpus
        self.actors: list[Any] = []
        self._refs: dict[Any, tuple[int, int]] = {}  # ObjectRef -> (cell, token)
        self._ref_of: dict[int, Any] = {}  # token -> its ObjectRef
        self._dead: set[int] = set()
        self._pids: dict[int, int] = {}
        self._make: Callable[[int], Any] | None = None

    def start(self, k: int, make_worker: Callable[[int], Any]) -> None:
        self._make = make_worker
        self.actors = [None] * k
        for c in range(k):
            self._spawn(c)

    def _spawn(self, c: int) -> None:
        self.actors[c] = _actor_class().options(num_cpus=self.num_cpus, max_concurrency=MAX_JOBS).remote(c, self._make)
        self._refs[self.actors[c].ready.remote()] = (c, 0)  # the "ready" reply, as a cell process sends it

    def post(self, cell: int, msg: tuple) -> None:
        actor = self.actors[cell]
        if msg[0] == "cancel":
            self._refs.pop(self._ref_of.pop(msg[1], None), None)
            actor.cancel.remote(msg[1])
        else:
            ref = actor.job.remote(*msg)
            self._refs[ref], self._ref_of[msg[1]] = (cell, msg[1]), ref

    def next_reply(self, timeout: float) -> Reply | None:
        if not self._refs:
            time.sleep(timeout)
            return None
        ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if not ready:
            return None
        cell, token = self._refs.pop(ready[0])
        self._ref_of.pop(token, None)
        try:
            msg = self._ray.get(ready[0])  # None: a cancelled job
        except self._ray.exceptions.RayActorError:
            self._dead.add(cell)  # reported as lost by the next `dead_cells`
            for ref, (c, tok) in list(self._refs.items()):
                if c == cell:
                    del self._refs[ref]
                    self._ref_of.pop(tok, None)
            return None
        if msg is not None and msg[2] == "ready":
            self._pids[cell] = msg[1]
        return msg

    def dead_cells(self) -> list[int]:
        dead, self._dead = sorted(self._dead), set()
        return dead

    def respawn(self, cell: int) -> None:
        self._spawn(cell)

    def pid(self, cell: int) -> int | None:
        return self._pids.get(cell)

    def kill(self, cell: int) -> None:
        self._ray.kill(self.actors[cell], no_restart=True)

    def close(self) -> None:
        for a in self.actors:
            if a is not None:
                self._ray.kill(a, no_restart=True)
        self._refs.clear()
