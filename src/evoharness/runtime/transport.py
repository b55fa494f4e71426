"""How the driver reaches its K cells: start their workers, post jobs, read replies, notice deaths.

A transport knows nothing of what a job does (`runtime.cell`); the cell backend
(`runtime.cell_backend`) knows nothing of where a cell runs. Three transports, one interface:

- `InProcessTransport`: one worker in the driver process (``runtime.backend = "inprocess"``). Jobs
  run when the driver asks for a reply, so every call issued meanwhile is answered in one batch:
  the lock-step of a plain GRPO loop, with no process, pickling or weight file in between.
- `ProcessTransport`: a process per cell (multiprocessing, spawn), its inbox a queue and its
  replies a pipe of its own (``runtime.backend = "local"``); with ``gpus_per_cell`` each cell sees
  its own slice of this machine's GPUs (``CUDA_VISIBLE_DEVICES``).
- `runtime.ray_transport.RayTransport`: a Ray actor per cell, on one machine or a cluster.

A reply is ``(cell, pid, kind, token, result)``; ``ready`` (token 0) comes once per started worker.
Each transport also chooses how its cells hand each other weights and gradients (`exchange`):
files on this machine for the first two, Ray's object store for Ray.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from evoharness.runtime.cell import serve
from evoharness.runtime.exchange import Exchange, FileExchange

Reply = tuple[int, int, str, int, Any]


class Transport(Protocol):
    """Where the cells' workers run (module docstring)."""

    def start(self, k: int, make_worker: Callable[[int], Any]) -> None:
        """Start workers 0..k-1 (`make_worker(cell)` is called where the cell runs: picklable)."""
        ...

    def post(self, cell: int, msg: tuple) -> None:
        """``(kind, token, payload, seconds)`` or ``("cancel", token)``."""
        ...

    def next_reply(self, timeout: float) -> Reply | None:
        """One reply from any cell (cells take turns), or None after `timeout` seconds."""
        ...

    def dead_cells(self) -> list[int]:
        """Cells whose worker died since the last call (each reported once)."""
        ...

    def respawn(self, cell: int) -> None:
        """Start a new worker for a dead cell."""
        ...

    def pid(self, cell: int) -> int | None:
        """The process id of cell's worker (for tests and fault injection)."""
        ...

    def kill(self, cell: int) -> None:
        """Kill cell's worker now (fault injection); the next `dead_cells` reports it."""
        ...

    def exchange(self, root: str | Path) -> Exchange:
        """How this transport's cells hand each other tensors (`runtime.exchange`); `root`: a
        directory of the driver's machine it may use (files under it for cells on this machine)."""
        ...

    def close(self) -> None: ...


class InProcessTransport:
    """One cell whose worker lives in this process (module docstring)."""

    def __init__(self) -> None:
        self.worker: Any = None
        self._replies: deque[Reply] = deque()

    def start(self, k: int, make_worker: Callable[[int], Any]) -> None:
        if k != 1:
            raise ValueError(f"an in-process transport hosts one cell, not {k}")
        self.worker = make_worker(0)
        self._replies.append((0, os.getpid(), "ready", 0, None))

    def post(self, cell: int, msg: tuple) -> None:
        if msg[0] == "cancel":
            self.worker.cancel(msg[1])
        elif msg[0] != "stop":
            self.worker.submit(*msg)

    def next_reply(self, timeout: float) -> Reply | None:
        if not self._replies:
            due = self.worker.next_due()
            if due is None:
                time.sleep(min(timeout, 0.001))  # nothing to run: the driver's tools and threads move on
                return None
            if due > 0:
                time.sleep(min(due, timeout))
            pid = os.getpid()
            self._replies.extend((0, pid, kind, token, result) for kind, token, result in self.worker.ready())
        return self._replies.popleft() if self._replies else None

    def dead_cells(self) -> list[int]:
        return []

    def respawn(self, cell: int) -> None:
        raise RuntimeError("the in-process cell cannot be lost")

    def pid(self, cell: int) -> int:
        return os.getpid()

    def kill(self, cell: int) -> None:
        raise RuntimeError("the in-process cell is the driver itself")

    def exchange(self, root: str | Path) -> Exchange:
        return FileExchange(root)

    def close(self) -> None:
        if self.worker is not None and hasattr(self.worker, "close"):
            self.worker.close()
        self.worker = None


class _Outbox:
    """A cell's reply channel: the write end of a pipe of its own, read by the driver. One pipe per
    cell rather than one shared queue: a shared queue's writers share a lock, and a cell killed
    (SIGKILL, OOM) while its feeder thread held it silenced every other cell for good. A dead cell
    can only break its own pipe, which the driver reads as end-of-file."""

    def __init__(self, conn: Any):
        self._conn, self._lock = conn, threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self._conn}  # pickled into the spawned cell (a lock does not travel)

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(st["conn"])

    def __call__(self, msg: tuple) -> None:
        with self._lock:
            self._conn.send(msg)


def gpu_slices(cells: int, gpus_per_cell: int) -> list[str]:
    """Each cell's ``CUDA_VISIBLE_DEVICES``: cell c gets GPUs ``c*g .. c*g+g-1`` of those this
    process sees (its own ``CUDA_VISIBLE_DEVICES`` when set, else all of the machine's).

    Raises:
        ValueError: ``cells * gpus_per_cell`` exceeds ``torch.cuda.device_count()``.
    """
    import torch

    have = torch.cuda.device_count()  # the cells are spawned (fresh processes): counting here is harmless
    if cells * gpus_per_cell > have:
        raise ValueError(
            f"{cells} cells x runtime.gpus_per_cell = {gpus_per_cell} need {cells * gpus_per_cell} GPUs; "
            f"this machine has {have} visible (lower runtime.cells or gpus_per_cell, or use the ray backend)"
        )
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in seen.split(",") if d.strip()][:have] if seen else [str(i) for i in range(have)]
    return [",".join(ids[c * gpus_per_cell : (c + 1) * gpus_per_cell]) for c in range(cells)]


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _child_env(**env: str) -> Iterator[None]:
    """Set environment variables while a child process starts (a spawned child copies the
    environment at its start, before it imports torch), then restore them."""
    with _ENV_LOCK:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class ProcessTransport:
    """A process per cell on this machine (module docstring).

    Args:
        gpus_per_cell: GPUs each cell process sees (``CUDA_VISIBLE_DEVICES``, `gpu_slices`; its
            ``cuda`` is its first); 0: the cells see what this process sees.

    Raises:
        ValueError (at `start`): more GPUs asked for than this machine has.
    """

    def __init__(self, gpus_per_cell: int = 0) -> None:
        if gpus_per_cell < 0:
            raise ValueError(f"gpus_per_cell must be >= 0, not {gpus_per_cell}")
        self.gpus_per_cell = gpus_per_cell
        self._gpus: list[str] = []
        self._ctx = mp.get_context("spawn")
        self.inboxes: list[Any] = []
        self.procs: list[Any] = []
        self._replies: list[Any] = []  # cell c's read end (None once it read EOF)
        self._make: Callable[[int], Any] | None = None
        self._next = 0  # where `next_reply` starts looking

    def start(self, k: int, make_worker: Callable[[int], Any]) -> None:
        self._gpus = gpu_slices(k, self.gpus_per_cell) if self.gpus_per_cell else []
        self._make = make_worker
        self.inboxes, self.procs, self._replies = [None] * k, [None] * k, [None] * k
        for c in range(k):
            self._spawn(c)

    def _spawn(self, c: int) -> None:
        self.inboxes[c] = self._ctx.Queue()
        reader, writer = self._ctx.Pipe(duplex=False)
        self._replies[c] = reader
        self.procs[c] = self._ctx.Process(
            target=serve, args=(c, self._make, self.inboxes[c], _Outbox(writer)), daemon=True
        )
        with _child_env(**({"CUDA_VISIBLE_DEVICES": self._gpus[c]} if self._gpus else {})):
            self.procs[c].start()
        writer.close()  # only the cell holds its write end now: its death reads as EOF

    def post(self, cell: int, msg: tuple) -> None:
        self.inboxes[cell].put(msg)

    def next_reply(self, timeout: float) -> Reply | None:
        k = len(self._replies)
        order = [(self._next + i) % k for i in range(k)]
        live = [self._replies[c] for c in order if self._replies[c] is not None]
        for r in multiprocessing.connection.wait(live, timeout) if live else []:
            c = self._replies.index(r)
            self._next = (c + 1) % k
            try:
                return r.recv()
            except (EOFError, OSError):
                r.close()  # the cell died (`dead_cells` reports it); drop a half-written reply
                self._replies[c] = None
        if not live:
            time.sleep(timeout)
        return None

    def dead_cells(self) -> list[int]:
        return [c for c, p in enumerate(self.procs) if not p.is_alive()]

    def respawn(self, cell: int) -> None:
        self.procs[cell].join(timeout=1)
        if self._replies[cell] is not None:
            self._replies[cell].close()  # the dead cell's replies: its jobs were dropped with it
        self._spawn(cell)

    def pid(self, cell: int) -> int:
        return self.procs[cell].pid

    def kill(self, cell: int) -> None:
        import signal

        os.kill(self.procs[cell].pid, signal.SIGKILL)
        self.procs[cell].join()

    def exchange(self, root: str | Path) -> Exchange:
        return FileExchange(root)

    def close(self) -> None:
        for q in self.inboxes:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for r in self._replies:
            if r is not None:
                r.close()


def make_transport(backend: str, gpus_per_cell: int = 0, **ray: Any) -> Transport:
    """The transport named by ``runtime.backend``: ``inprocess``, ``local`` (processes) or ``ray``
    (`ray`: ``address`` and ``num_cpus``, see `runtime.ray_transport.RayTransport`), its cells on
    `gpus_per_cell` GPUs each (``runtime.gpus_per_cell``; 0: CPU cells).

    Raises:
        ValueError: an unknown backend; more GPUs than this machine has for the in-process cell
            (the driver process itself: it sees what the driver sees).
    """
    if backend == "ray":
        from evoharness.runtime.ray_transport import RayTransport

        return RayTransport(gpus_per_cell=gpus_per_cell, **ray)
    if backend == "local":
        return ProcessTransport(gpus_per_cell)
    if backend == "inprocess":
        if gpus_per_cell:
            gpu_slices(1, gpus_per_cell)  # the driver's own GPUs: only checked
        return InProcessTransport()
    raise ValueError(f"unknown runtime backend {backend!r}; expected one of ['inprocess', 'local', 'ray']")
