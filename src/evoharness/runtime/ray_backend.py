"""`ray` backend: the cells are Ray actors (one cluster, one or many machines).

The same worlds as `local_backend` and `alfworld_backend` (the executions'
agent loops stay in the driver); only the transport differs. Each cell is a
threaded Ray actor; every job (a call, a micro-batch, the core's optimizer
step, a weight load, a role switch) is one actor method call whose ObjectRef
the driver waits on (`ray.wait`), a cancel is another method call, and a dead
actor (`RayActorError`) is a lost cell, replaced by a new actor. Ray does the
cluster work: ``address=None`` starts a local head on 127.0.0.1, an address
joins an existing cluster (``ray start --head`` on one machine, ``ray start
--address`` on the others).

- `RayBackend`: the synthetic replay (timed jobs, `LocalBackend`'s world).
- `RayModelBackend`: real models, `LocalModelBackend`'s world.
- `RayAlfworldBackend`: the ALFWorld RL workload (``evoharness rl --backend ray``).
- `RayAllReduceAlfworldBackend`: the same with colocate/async's fixed train cells
  all-reducing gradients over torch.distributed (`runtime.replicas`; gloo, its
  ``file://`` rendezvous in ``work_dir``).

A model cell actor runs `cell_worker.cell_main` unchanged on a thread of its
own, its inbox a `queue.Queue`: the same cell logic as a cell process
(batched policy calls, micro-batch forward/backward, the core's optimizer
step, load/switch). Job arguments (prompts, a micro-batch's turns) and
results travel as Ray task arguments and returns; weights versions and
gradients go through ``work_dir`` (`cell_worker`), so on several machines
``work_dir`` must be a directory every node mounts (NFS or the like).
Needs the ``ray`` extra (``pip install -e .[ray]``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from evoharness.runtime.alfworld_backend import AlfworldBackend
from evoharness.runtime.cells import Role
from evoharness.runtime.local_backend import LocalBackend, LocalModelBackend
from evoharness.runtime.replicas import AllReduceAlfworldBackend
from evoharness.config.sim import SimConfig

MAX_JOBS = 1024      # jobs one actor holds at once (each waits on an actor thread)
_REMOTE: dict[type, Any] = {}


def _actor_class(cls: type) -> Any:
    """`ray.remote(cls)`, made once per class."""
    if cls not in _REMOTE:
        import ray
        _REMOTE[cls] = ray.remote(cls)
    return _REMOTE[cls]


class _Cell:
    """The synthetic actor: runs each timed job in its own thread, replies like a cell process."""

    def __init__(self, cell: int):
        self.cell = cell

    def ready(self) -> tuple:
        return (self.cell, os.getpid(), "ready", 0, None)

    def job(self, kind: str, token: int, payload: Any, seconds: float) -> tuple:
        time.sleep(seconds)
        return (self.cell, os.getpid(), kind, token, payload)

    def cancel(self, token: int) -> None:
        pass            # the driver drops the job's reply by its token

    def stop(self) -> None:
        pass


class _ModelCell:
    """A model cell actor: `cell_worker.cell_main` on its own thread behind a `queue.Queue`.

    ``job`` enqueues a job and blocks (on one of the actor's threads) until the
    cell replies; ``cancel`` skips a job still queued and answers its ``job``
    with None at once; ``ready`` returns when the model is loaded. If the cell
    loop raises, the actor process exits: the driver sees a lost cell, as with
    a crashed cell process.
    """

    def __init__(self, cell: int, args: tuple):
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._cancelled: set[int] = set()
        self._ready: Future = Future()
        threading.Thread(target=self._main, args=(cell, args), daemon=True).start()

    def _main(self, cell: int, args: tuple) -> None:
        from evoharness.runtime.cell_worker import cell_main

        try:
            model_dir, work_dir, lr, options = args
            cell_main(cell, model_dir, work_dir, lr, self._inbox, self, options)
        except BaseException:       # noqa: BLE001 -- a broken cell is a dead cell, as a crashed process
            import traceback
            traceback.print_exc()
            os._exit(1)

    def put(self, msg: tuple) -> None:
        """The cell loop's outbox: resolve the job the reply answers."""
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
            if token in self._cancelled:        # the cancel overtook its job
                self._cancelled.discard(token)
                return None
            self._waiting[token] = fut
        self._inbox.put((kind, token, payload))
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


class RayCells:
    """The Ray transport of a `LocalBackend` world (a mixin placed before it).

    Replaces the cell processes, their queues and pipes with actors and
    ObjectRefs; everything the world does with replies is unchanged.
    Call `_connect` before the world's ``__init__`` starts the cells.
    """

    def _connect(self, address: str | None, num_cpus: float) -> None:
        """Join the Ray cluster at `address` (None: start a local head on 127.0.0.1).

        `num_cpus` is what each cell actor reserves: fractions let many actors
        share a small machine (on 2 cores, actors of 1 CPU beyond two never start).
        """
        try:
            import ray
        except ImportError as e:
            raise ValueError("the ray backend needs Ray: pip install -e '.[ray]'") from e
        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=os.cpu_count() or 1,
                         log_to_driver=False)
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self._num_cpus = num_cpus

    def _make_actor(self, c: int) -> Any:
        return (_actor_class(_ModelCell).options(num_cpus=self._num_cpus, max_concurrency=MAX_JOBS)
                .remote(c, self._cell_args(c)))

    # ---- transport (see `LocalBackend`) --------------------------------------------
    def _start_cells(self, k: int) -> None:
        self.actors: list[Any] = [None] * k
        self._refs: dict[Any, tuple[int, int]] = {}       # ObjectRef -> (cell, token)
        self._ref_of: dict[int, Any] = {}                 # token -> its ObjectRef
        self._dead: set[int] = set()
        for c in range(k):
            self._spawn(c)

    def _spawn(self, c: int) -> None:
        self.actors[c] = self._make_actor(c)
        self._refs[self.actors[c].ready.remote()] = (c, 0)   # the "ready" reply, as a cell process sends it

    def _post(self, cell: int, msg: tuple) -> None:
        actor = self.actors[cell]
        if msg[0] == "stop":
            actor.stop.remote()
        elif msg[0] == "cancel":
            self._refs.pop(self._ref_of.pop(msg[1], None), None)
            actor.cancel.remote(msg[1])
        else:
            ref = actor.job.remote(*msg)
            self._refs[ref], self._ref_of[msg[1]] = (cell, msg[1]), ref

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
        cell, token = self._refs.pop(ready[0])
        self._ref_of.pop(token, None)
        try:
            return self._ray.get(ready[0])      # None: a cancelled job
        except self._ray.exceptions.RayActorError:
            self._dead.add(cell)      # reported as CellLost by the next poll
            for ref, (c, tok) in list(self._refs.items()):
                if c == cell:
                    del self._refs[ref]
                    self._ref_of.pop(tok, None)
            return None

    def _respawn(self, c: int) -> None:
        self._spawn(c)

    def cell_pid(self, c: int) -> int:
        """The process id of cell c's actor (it may live on another machine)."""
        return self._ray.get(self.actors[c].ready.remote())[1]

    def kill_cell(self, c: int) -> None:
        """Kill cell c's actor (fault injection; the next poll reports it lost)."""
        self._ray.kill(self.actors[c], no_restart=True)

    def _close_cells(self) -> None:
        for a in self.actors:
            self._ray.kill(a, no_restart=True)
        self._refs.clear()


class RayBackend(RayCells, LocalBackend):
    """K cells as Ray actors replaying a synthetic workload (`LocalBackend`).

    Args (beyond `LocalBackend`'s): address: a Ray cluster to join (None: start
    a local one on 127.0.0.1); num_cpus: what each actor reserves (fractions let
    many actors share a small machine)."""

    def __init__(self, cfg: SimConfig, roles: list[Role], time_scale: float = 1e-3, address: str | None = None,
                 num_cpus: float = 0.25, state: dict[str, Any] | None = None):
        self._connect(address, num_cpus)
        super().__init__(cfg, roles, time_scale, state)

    def _make_actor(self, c: int) -> Any:
        return _actor_class(_Cell).options(num_cpus=self._num_cpus, max_concurrency=MAX_JOBS).remote(c)


class RayModelBackend(RayCells, LocalModelBackend):
    """`LocalModelBackend` (synthetic agents, a real model) on Ray actors.

    Args: `LocalModelBackend`'s, plus ``address`` and ``num_cpus`` as `RayBackend`'s."""

    def __init__(self, *args: Any, address: str | None = None, num_cpus: float = 0.25, **kw: Any):
        self._connect(address, num_cpus)
        super().__init__(*args, **kw)


class RayAlfworldBackend(RayCells, AlfworldBackend):
    """`AlfworldBackend` (the ALFWorld RL workload) on Ray actors: ``evoharness rl --backend ray``.

    Args: `AlfworldBackend`'s, plus ``address`` (``runtime.ray_address``) and
    ``num_cpus`` as `RayBackend`'s."""

    def __init__(self, *args: Any, address: str | None = None, num_cpus: float = 0.25, **kw: Any):
        self._connect(address, num_cpus)
        super().__init__(*args, **kw)


class RayAllReduceAlfworldBackend(RayCells, AllReduceAlfworldBackend):
    """`replicas.AllReduceAlfworldBackend` on Ray actors: each train actor is a rank of a
    torch.distributed group (``evoharness rl --backend ray --schedule colocate|async``).

    Args: `AllReduceAlfworldBackend`'s, plus ``address`` and ``num_cpus`` as `RayBackend`'s."""

    def __init__(self, *args: Any, address: str | None = None, num_cpus: float = 0.25, **kw: Any):
        self._connect(address, num_cpus)
        super().__init__(*args, **kw)
