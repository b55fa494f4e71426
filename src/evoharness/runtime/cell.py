"""What runs in a cell: a worker that takes jobs and returns their results, and the loop around it.

A cell is a group of accelerators that either serves model calls (rollout) or trains (QwenGyre
§2). A transport (`runtime.transport`, `runtime.ray_transport`) runs one worker per cell, in a
process of its own, a Ray actor, or inline in the driver process, and feeds it jobs
``(kind, token, payload, seconds)``; the worker answers ``(kind, token, result)``.

- `ModelCell`: a real model. Its parts (`CellParts`) are built inside the cell by the job's
  factory: the model, who answers calls (``serve``) and its trainer rank (``trainer``); the
  runtime only moves payloads and weights and never looks inside a loss. Jobs run one at a
  time in arrival order; calls queued back to back are answered as one batch.

    ``call``    a model call (payload: the workload's request); consecutive calls are one batch
    ``train``   forward/backward of a streamed micro-batch's rows at weights ``version``; with
                ``grad_key`` the gradient goes to the exchange for the core (dynamic membership)
    ``step``    the step's updates (the parts' ``step``: the streamed gradient plus the gradients
                other cells left under ``grad_keys``, or the whole batch's updates; a data-parallel
                group all-reduces inside); then weights ``version + 1`` are published when asked
    ``load``    load published weights ``version``; ``switch``: change role (into rollout: newest weights)
    ``save``    write the model (and the optimizer state) into a directory (checkpoints, export)
    ``publish`` publish the current weights to the `WeightStore` (e.g. for an evaluation)
    ``rendezvous`` the core: a free ``tcp://`` address on its host for its trainer group

Weights and gradients travel through the transport's `runtime.exchange.Exchange` (files on one
machine, Ray's object store on a cluster), so nothing here depends on where the cells run.

- `TimedCell`: the synthetic replay (`runtime.synthetic`): every job completes after its
  ``seconds``, concurrently, and returns its payload.

`serve` is the loop a process or an actor runs: it drains the inbox before each job so that a
cancel catches a job not started yet, and exits on ``stop`` (closing its worker) or when the
driver process is gone.
"""

from __future__ import annotations

import heapq
import os
import queue
import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from evoharness.runtime.exchange import Exchange, FileExchange, unique_tensors
from evoharness.runtime.rendezvous import free_tcp_address

MAX_CALL_BATCH = 64  # model calls a cell answers together


class CellParts(Protocol):
    """What the job's cell factory builds inside a cell (``factory(cell, init_dir)``): the model,
    who answers its calls, and its trainer rank. The payloads of ``train`` and ``step`` jobs are
    the workload's (`runtime.cell_backend.AgentWorkload`); the runtime passes them through.

    Attributes:
        model: the cell's weights (a torch module; loaded and published by the runtime per version).
    """

    model: Any

    def serve(self, payloads: list[Any], version: int) -> list[Any]:
        """Answer a batch of model calls with weights `version`."""
        ...

    def accumulate(self, rows: Any) -> dict[str, float]:
        """Forward/backward of a streamed micro-batch; the gradient stays (or goes to `gradients`)."""
        ...

    def step(self, payload: dict[str, Any]) -> list[dict[str, float]]:
        """The step's updates (the accumulated gradient, or the batch the payload carries); per-update metrics."""
        ...

    def gradients(self) -> dict[str, Any]:
        """The accumulated gradient by parameter name, cleared here."""
        ...

    def add_gradients(self, grads: dict[str, Any]) -> None:
        """Add another cell's `gradients`."""
        ...

    def join_group(self, rank: int, world: int, init_method: str) -> None:
        """Make the trainer a rank of a data-parallel group (its gradients all-reduced at each update)."""
        ...

    def save(self, directory: str, optimizer: bool, export: bool = False) -> None:
        """Write the model (a Hugging Face directory; with `export` in its release dtype) and, with
        `optimizer`, the trainer's state."""
        ...


class WeightStore:
    """Published weights versions: key ``v<version>`` of the transport's `runtime.exchange.Exchange`.

    The core publishes ``v + 1`` after each update (dropping all but the newest two: cells only
    ever load those); another cell loads it on a sync or a switch. A model with LoRA adapters
    publishes and loads its adapter tensors alone (`sync_tensors`).

    Args:
        root: the directory of the default exchange (`FileExchange`: ``<root>/v<version>.safetensors``);
            with another `exchange`, where `path` writes a version for a reader in this process.
        exchange: where the versions travel (None: files under `root`).
    """

    def __init__(self, root: str | Path, exchange: Exchange | None = None):
        self.root = Path(root)
        self.exchange: Exchange = exchange if exchange is not None else FileExchange(self.root)

    def path(self, version: int) -> Path:
        """A safetensors file of published `version` on this machine (an evaluation reads it; with
        files the exchange's own, else fetched into `root`).

        Raises:
            KeyError: `version` is not (or no longer) published.
        """
        if isinstance(self.exchange, FileExchange):
            return self.exchange.path(f"v{version}")
        from safetensors.torch import save_file

        path = self.root / f"v{version}.safetensors"
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
        save_file(self.exchange.get(f"v{version}"), str(tmp))
        os.replace(tmp, path)
        return path

    def publish(self, model: Any, version: int) -> None:
        self.exchange.put(f"v{version}", sync_tensors(model))
        old = [k for k in self.exchange.keys() if _VERSION.fullmatch(k) and int(k[1:]) < version - 1]
        self.exchange.drop(old)

    def load(self, model: Any, version: int) -> None:
        load_sync_tensors(model, self.exchange.get(f"v{version}"), f"weights v{version}")


_VERSION = re.compile(r"v\d+")


def sync_tensors(model: Any) -> dict[str, Any]:
    """The tensors a weights sync moves: the LoRA adapters where `model` has them (the base never
    changes: `models.adapters.adapter_parameters`), else the whole state less tied aliases."""
    from evoharness.models.adapters import adapter_parameters

    adapters = adapter_parameters(model)
    if adapters:
        return {n: p.detach() for n, p in adapters.items()}
    return unique_tensors(model.state_dict())


def load_sync_tensors(model: Any, tensors: dict[str, Any], source: str) -> None:
    """Copy `sync_tensors` of another cell into `model` in place.

    Raises:
        KeyError: `tensors` are not `model`'s sync tensors (the missing and unexpected names, from `source`).
    """
    import torch

    from evoharness.models.adapters import adapter_parameters

    adapters = adapter_parameters(model)
    want = adapters or model.state_dict()
    need = set(adapters or unique_tensors(want))  # a tied alias follows its tensor
    missing, unexpected = sorted(need - tensors.keys()), sorted(tensors.keys() - want.keys())
    if missing or unexpected:
        raise KeyError(
            f"{source}: not this model's weights: missing {missing[:4]}, unexpected {unexpected[:4]} "
            "(a full-model sync into a LoRA model, or another model)"
        )
    with torch.no_grad():
        for name, t in tensors.items():
            want[name].copy_(t)


class ModelCell:
    """A cell with a model (module docstring).

    Args:
        cell: its index (0 is the core).
        factory: builds its `CellParts` from ``(cell, init_dir)`` (picklable: it travels to the cell).
        weights: the published weights versions; its exchange also carries the gradients of
            satellites (``train`` with ``grad_key``) and the checkpoint a cell starts from.
        version: the weights version it starts with (a resumed job: the checkpoint's).
        init_dir: a checkpoint directory of the driver's machine to start from (weights; the
            trainer's state on train cells); a cell elsewhere reads a copy (`Exchange.local_dir`).
    """

    def __init__(
        self,
        cell: int,
        factory: Callable[[int, str | None], CellParts],
        weights: WeightStore,
        version: int = 0,
        init_dir: str | None = None,
    ):
        self.cell, self.weights, self.version = cell, weights, version
        self.exchange = weights.exchange
        self.parts = factory(cell, self.exchange.local_dir(init_dir) if init_dir else None)
        self.pending: deque = deque()
        self.cancelled: set[int] = set()
        self._group: tuple | None = None

    def submit(self, kind: str, token: int, payload: Any, seconds: float = 0.0) -> None:
        self.pending.append((kind, token, payload))

    def close(self) -> None:
        """The cell stops: remove its local copy of the checkpoint it started from (if any)."""
        self.exchange.close()

    def cancel(self, token: int) -> None:
        self.cancelled.add(token)

    def next_due(self) -> float | None:
        return 0.0 if self.pending else None

    def _ensure(self, version: int) -> None:
        if version != self.version:
            self.weights.load(self.parts.model, version)
            self.version = version

    def ready(self) -> list[tuple[str, int, Any]]:
        """Run the next job (a batch of consecutive calls counts as one); its results."""
        while self.pending and self.pending[0][1] in self.cancelled:
            self.cancelled.discard(self.pending.popleft()[1])
        if not self.pending:
            return []
        kind, token, payload = self.pending.popleft()
        t0 = time.perf_counter()
        if kind == "call":
            batch = [(token, payload)]
            while self.pending and len(batch) < MAX_CALL_BATCH and self.pending[0][0] == "call":
                _, tok, pay = self.pending.popleft()
                if tok in self.cancelled:
                    self.cancelled.discard(tok)
                else:
                    batch.append((tok, pay))
            results = self.parts.serve([p for _, p in batch], self.version)
            share = (time.perf_counter() - t0) / len(batch)  # cell-seconds per call
            return [
                ("call", tok, {"result": r, "seconds": share, "version": self.version})
                for (tok, _), r in zip(batch, results, strict=True)
            ]
        return [(kind, token, self._run(kind, payload, t0))]

    def _run(self, kind: str, payload: Any, t0: float) -> Any:
        if kind == "train":
            self._ensure(payload["version"])
            stats = self.parts.accumulate(payload["rows"])
            if payload.get("grad_key"):  # for the core: summed into its update (dynamic membership)
                self.exchange.put(payload["grad_key"], self.parts.gradients())
            return {"stats": stats, "seconds": time.perf_counter() - t0}
        if kind == "step":
            return self._step(payload, t0)
        if kind == "load":
            self._ensure(payload)
            return self.version
        if kind == "switch":
            role, newest = payload
            if role == 0:  # Role.ROLLOUT: serve the newest weights
                self._ensure(newest)
            return role
        if kind == "save":
            self.parts.save(payload["dir"], payload.get("optimizer", False), payload.get("export", False))
            return payload["dir"]
        if kind == "publish":
            self.weights.publish(self.parts.model, self.version)
            return self.version
        if kind == "rendezvous":  # the core: where its trainer group meets (it is rank 0)
            return free_tcp_address(self.exchange.host())
        raise ValueError(f"unknown cell job {kind!r}")

    def _step(self, p: dict[str, Any], t0: float) -> dict[str, Any]:
        self._ensure(p["version"])
        if p.get("group") and p["group"] != self._group:
            self.parts.join_group(*p["group"])
            self._group = p["group"]
        for key in p.get("grad_keys", ()):  # the streamed micro-batches of other cells: exactly these, once
            self.parts.add_gradients(self.exchange.get(key))
        if p.get("drop_prefix"):  # the step's gradients, a lost satellite's unclaimed one included
            self.exchange.drop([k for k in self.exchange.keys() if k.startswith(p["drop_prefix"])])
        updates = self.parts.step(p["plan"])
        self.version = p["version"] + 1
        if p.get("publish"):
            self.weights.publish(self.parts.model, self.version)
        return {"updates": updates, "seconds": time.perf_counter() - t0}


class TimedCell:
    """A cell of the synthetic replay: each job completes after its ``seconds``, concurrently with
    the others, and returns its payload (`runtime.synthetic`)."""

    def __init__(self, cell: int):
        self.cell = cell
        self.timers: list[tuple[float, int, tuple]] = []
        self.cancelled: set[int] = set()
        self._seq = 0

    def submit(self, kind: str, token: int, payload: Any, seconds: float = 0.0) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (time.monotonic() + seconds, self._seq, (kind, token, payload)))

    def cancel(self, token: int) -> None:
        self.cancelled.add(token)

    def next_due(self) -> float | None:
        return max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else None

    def ready(self) -> list[tuple[str, int, Any]]:
        out, now = [], time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            kind, token, payload = heapq.heappop(self.timers)[2]
            if token in self.cancelled:
                self.cancelled.discard(token)
            else:
                out.append((kind, token, payload))
        return out


def serve(
    cell: int, make_worker: Callable[[int], Any], inbox: Any, reply: Callable[[tuple], None], watch_parent: bool = True
) -> None:
    """A cell's loop: build its worker, say ``ready``, then take jobs from `inbox`
    (``(kind, token, payload, seconds)``, ``("cancel", token)``, ``("stop",)``) and `reply`
    ``(cell, pid, kind, token, result)`` for each finished one, until ``stop`` (or, with
    `watch_parent`, until the driver process is gone)."""
    worker = make_worker(cell)
    pid, parent = os.getpid(), os.getppid()
    reply((cell, pid, "ready", 0, None))
    while True:
        if watch_parent and os.getppid() != parent:
            return  # the driver died (e.g. SIGKILL of the job): do not linger
        due = worker.next_due()
        msgs = []
        try:
            msgs.append(
                inbox.get(timeout=min(1.0, due) if due is not None else 1.0) if due != 0.0 else inbox.get_nowait()
            )
        except queue.Empty:
            pass
        while True:  # read what else waits, so cancels catch jobs not yet started
            try:
                msgs.append(inbox.get_nowait())
            except queue.Empty:
                break
        for m in msgs:
            if m[0] == "stop":
                if hasattr(worker, "close"):
                    worker.close()
                return
            if m[0] == "cancel":
                worker.cancel(m[1])
            else:
                worker.submit(*m)
        for kind, token, result in worker.ready():
            reply((cell, pid, kind, token, result))
