"""The Ray transport: each cell a Ray actor, on one machine or a cluster (``runtime.backend = "ray"``).

An actor runs the same cell loop as a cell process (`runtime.cell.serve`) on a thread of its
own, its inbox a `queue.Queue`; each job is one actor method call whose ObjectRef the driver
waits on (`ray.wait`), a cancel another method call, and a dead actor (`RayActorError`) a lost
cell, replaced by a new actor. ``address=None`` starts a local head on 127.0.0.1; an address joins
an existing cluster (``ray start --head`` on one machine, ``ray start --address`` on the others).
Needs the ``ray`` extra (``pip install -e .[ray]``).

The cells are the bundles of one placement group, ``{"CPU": num_cpus, "GPU": gpus_per_cell}``
each, packed onto as few nodes as possible; cell 0 (the core, which writes the checkpoints the
driver reads) is held to the driver's node. Ray gives each actor its GPUs
(``CUDA_VISIBLE_DEVICES``). The cells share no filesystem: weights and gradients travel through
the object store (`runtime.ray_exchange.RayExchange`), a trainer group meets over TCP.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from evoharness.runtime.cell import serve
from evoharness.runtime.transport import Reply

MAX_JOBS = 1024  # jobs one actor holds at once (each waits on an actor thread)
STOP_S = 10.0  # how long `close` lets the cells stop (and remove their local copies) before killing them
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
        self._thread = threading.Thread(target=self._main, args=(cell, make_worker), daemon=True)
        self._thread.start()

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
        """The cell's ``ready`` reply, its result the node it runs on (`RayTransport.nodes`)."""
        import ray

        cell, pid, kind, token, _ = self._ready.result()
        return (cell, pid, kind, token, {"node": ray.get_runtime_context().get_node_id()})

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

    def stop(self, timeout_s: float = STOP_S) -> None:
        """Stop the cell loop (its worker closes) and wait for it, at most `timeout_s`."""
        self._inbox.put(("stop",))
        self._thread.join(timeout_s)


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
        gpus_per_cell: the GPUs each cell actor reserves (``runtime.gpus_per_cell``; 0: CPU cells).
        place_timeout_s: how long `start` waits for the cluster to place every cell.

    Raises:
        ValueError: Ray is not installed; a negative `gpus_per_cell`.
        RuntimeError (at `start`): the cluster cannot place the cells within `place_timeout_s`.
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float = 0.25,
        gpus_per_cell: int = 0,
        place_timeout_s: float = 120.0,
    ):
        try:
            import ray
        except ImportError as e:
            raise ValueError("the ray backend needs Ray: pip install -e '.[ray]'") from e
        if gpus_per_cell < 0:
            raise ValueError(f"gpus_per_cell must be >= 0, not {gpus_per_cell}")
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
        self.num_cpus, self.gpus_per_cell, self.place_timeout_s = num_cpus, gpus_per_cell, place_timeout_s
        self.nodes: dict[int, str] = {}  # cell -> the Ray node id its actor runs on (each ready)
        self._pg: Any = None
        self._exchange: Any = None
        self.actors: list[Any] = []
        self._refs: dict[Any, tuple[int, int]] = {}  # ObjectRef -> (cell, token)
        self._ref_of: dict[int, Any] = {}  # token -> its ObjectRef
        self._dead: set[int] = set()
        self._pids: dict[int, int] = {}
        self._make: Callable[[int], Any] | None = None

    def start(self, k: int, make_worker: Callable[[int], Any]) -> None:
        self._make = make_worker
        self._pg = self._place(k)
        self.actors = [None] * k
        for c in range(k):
            self._spawn(c)

    def _place(self, k: int) -> Any:
        """A placement group of `k` cell bundles (PACK), bundle 0 on the driver's node.

        Raises:
            RuntimeError: not placed within `place_timeout_s` (the message names the bundles and
                what the cluster has).
        """
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group, remove_placement_group

        bundle = {"CPU": self.num_cpus, **({"GPU": float(self.gpus_per_cell)} if self.gpus_per_cell else {})}
        here = self._ray.get_runtime_context().get_node_id()
        pg = placement_group(
            [dict(bundle) for _ in range(k)],
            strategy="PACK",
            bundle_label_selector=[{NODE_ID_LABEL_KEY: here}] + [{}] * (k - 1),  # the core beside the driver
        )
        ready, _ = self._ray.wait([pg.ready()], timeout=self.place_timeout_s)
        if not ready:
            remove_placement_group(pg)
            raise RuntimeError(
                f"the Ray cluster cannot place {k} cells of {bundle} each (cell 0 on the driver's node "
                f"{here[:12]}) within {self.place_timeout_s:.0f} s; it has {self._ray.cluster_resources()} "
                f"({self._ray.available_resources()} free): lower runtime.cells, ray_num_cpus or gpus_per_cell, "
                "or add nodes"
            )
        return pg

    def _spawn(self, c: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.actors[c] = (
            _actor_class()
            .options(
                num_cpus=self.num_cpus,
                num_gpus=self.gpus_per_cell,
                max_concurrency=MAX_JOBS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=c),
            )
            .remote(c, self._make)
        )
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
            self._pids[cell], self.nodes[cell] = msg[1], msg[4]["node"]
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

    def exchange(self, root: str | Path) -> Any:
        """The object store (`runtime.ray_exchange.RayExchange`; `root` unused): the cells may be on
        nodes that share no filesystem with the driver. One per transport, its keeper ended by `close`."""
        if self._exchange is None:
            from evoharness.runtime.ray_exchange import RayExchange

            self._exchange = RayExchange()
        return self._exchange

    def close(self) -> None:
        """Stop the cells (each removes what it copied to its node), then kill them, the exchange's
        keeper and the placement group."""
        live = [a for a in self.actors if a is not None]
        if live:
            with contextlib.suppress(Exception):  # a dead actor cannot stop: it is killed below anyway
                self._ray.wait([a.stop.remote() for a in live], num_returns=len(live), timeout=STOP_S)
        for a in live:
            self._ray.kill(a, no_restart=True)
        self._refs.clear()
        if self._exchange is not None:
            self._exchange.shutdown()
            self._exchange = None
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
