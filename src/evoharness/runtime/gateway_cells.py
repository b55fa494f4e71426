"""Rollout cells behind the gateway (``runtime.via_gateway``): the executions' model calls
go through `gateway.Gateway`, routed by execution id to the cell the scheduler bound it to.

`CellGateway` runs a `Gateway` on an event loop of its own thread, with one
`CellBackend` per cell. A backend does not own its cell: the runtime's driver
thread is the only one that talks to cells (processes or Ray actors), so a
call the gateway routes to a cell is queued (`pending`) for that thread to
post, and the cell's reply is handed back (`resolve`) to the waiting call.

What the gateway adds over the direct path is QwenGyre's harness-preserving
role transfer: a rollout -> train switch *drains* the cell. It takes no new
calls; its in-flight calls fail over (`BackendError`) and the gateway
re-issues them, with the full prompt (re-prefill; KV migration is out of
scope), on the cell the execution is bound to next, waiting for that bind
if the scheduler has not placed it yet. The agent turn is never aborted: the
harness sees one answer. A migrated execution's call in flight is evicted
from its old cell the same way, and a lost cell's calls are re-issued like a
drained one's. Counted: calls re-issued (`reissued`), drains and their
latency (drain start until the last call that was in flight on the cell has
its answer from another cell).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from evoharness.runtime.backends import Backend, BackendError, GenOutput, GenParams
from evoharness.runtime.gateway import Gateway


def cell_name(cell: int) -> str:
    """The gateway backend name of cell `cell`."""
    return f"cell{cell}"


class CellBackend(Backend):
    """Cell `cell` as a gateway backend: a call becomes a ``call`` job on the cell.

    ``params.passthrough`` carries ``execution`` (the runtime's execution index)
    and ``cell_payload`` (the cell job's payload: the workload's request); the answer's
    `GenOutput.detail` is the cell's reply ``{"result", "seconds", "version"}`` (`runtime.cell`;
    the result a `Completion` as a dict, or an engine cell's ``(ids, logprobs, version)``).
    """

    kind = "cell"

    def __init__(self, cell: int, owner: CellGateway):
        super().__init__(cell_name(cell), capacity=1 << 20)
        self.cell, self.owner = cell, owner
        self._calls: dict[int, asyncio.Future] = {}  # execution -> its call waiting on this cell

    async def _generate(self, params: GenParams) -> GenOutput:
        e = params.passthrough["execution"]
        if self.state != "active":  # drained between the pick and this task's first step
            raise BackendError(f"backend {self.name} is {self.state}")
        fut = asyncio.get_running_loop().create_future()
        self._calls[e] = fut
        self.owner.pending.put(("call", self.cell, e, params.passthrough["cell_payload"], fut))
        try:
            reply = await fut
        except (asyncio.CancelledError, BackendError):
            self.owner.pending.put(("cancel", self.cell, e, None, fut))  # stop the job on the cell
            raise
        finally:
            if self._calls.get(e) is fut:
                del self._calls[e]
        result = reply["result"]  # the cell's answer, with its seconds and weights version
        if not isinstance(result, dict):  # the bare engine's (ids, logprobs, version) of a synthetic agent
            ids, logprobs, version = result
            return GenOutput(
                prompt_ids=list(params.passthrough["cell_payload"][0]),
                completion_ids=list(ids),
                logprobs=list(logprobs),
                content=None,
                tool_calls=[],
                finish_reason="length",
                policy_version=version,
                detail=reply,
            )
        return GenOutput(
            prompt_ids=list(result.get("prompt_token_ids") or []),
            completion_ids=list(result.get("completion_token_ids") or []),
            logprobs=list(result.get("logprobs") or []),
            content=result.get("text"),
            tool_calls=[],
            finish_reason=result.get("finish_reason", "stop"),
            policy_version=result.get("policy_version"),
            detail=reply,
        )

    def evict(self, e: int, why: str) -> bool:
        """Fail execution `e`'s call on this cell (the gateway re-issues it); False if none runs here."""
        fut = self._calls.pop(e, None)
        if fut is None or fut.done():
            return False
        fut.set_exception(BackendError(f"{self.name}: {why}"))
        return True


class CellGateway:
    """A `Gateway` over K `CellBackend`s on its own event-loop thread.

    Thread contract: `call`, `bind`, `hold`, `migrate`, `drain`, `resume`, `lost`
    are called from the driver thread; the driver thread also drains `pending`
    (``("call" | "cancel", cell, execution, payload, future)``: jobs to post or
    cancel on a cell) and reports each cell reply with `resolve`.

    Args:
        cells: K.
        on_done: ``on_done(execution, call_id, out_or_exc, attempts)``, called on the
            loop thread when a call has its answer (or failed for good); the runtime sets it.
        wait_s: how long a held call may wait for a bind before it fails.
        records: where the gateway writes its token-in/token-out records (None: none kept).
    """

    def __init__(
        self,
        cells: int,
        on_done: Callable[..., None] | None = None,
        wait_s: float = 3600.0,
        records: str | Path | None = None,
    ):
        self.pending: queue.Queue = queue.Queue()
        self.on_done = on_done
        self.loop = asyncio.new_event_loop()
        self.cells = [CellBackend(c, self) for c in range(cells)]
        # a call is re-issued as often as its execution moves: attempts are not capped
        self.gw = Gateway(
            self.cells,
            records=records if records is not None else False,
            max_attempts=1 << 30,
            wait_for_backend_s=wait_s,
        )
        self.counts = {"gateway_calls": 0, "reissued_calls": 0, "drains": 0, "drain_s_total": 0.0, "drain_s_max": 0.0}
        self._drains: dict[int, tuple[float, set[int]]] = {}  # cell -> (start, executions it had in flight)
        self._names: dict[int, str] = {}  # execution -> its id in the gateway
        self._thread = threading.Thread(target=self.loop.run_forever, name="cell-gateway", daemon=True)
        self._thread.start()

    def _soon(self, fn: Callable, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    # ---- driver thread -----------------------------------------------------------------
    def _id(self, e: int) -> str:
        return self._names.get(e, str(e))

    def name(self, e: int, name: str) -> None:
        """Execution `e`'s calls go under the id `name` from now on (e.g. its episode id, so its
        records read as the trajectory's; default ``str(e)``); bind it again after this."""
        if self._names.get(e) != name:
            self._soon(self.gw.release, self._id(e))
            self._names[e] = name

    def call(self, e: int, call_id: int, payload: Any) -> None:
        """Issue execution `e`'s model call through the gateway (routed by its binding)."""
        params = GenParams(
            messages=payload.get("messages", []) if isinstance(payload, dict) else [],
            passthrough={"execution": e, "cell_payload": payload},
        )
        fut = asyncio.run_coroutine_threadsafe(self.gw.generate(params, self._id(e)), self.loop)

        def done(f: Future) -> None:
            try:
                out, attempts = f.result()
            except BaseException as exc:  # noqa: BLE001 -- reported to the driver thread as a failed call
                self.on_done(e, call_id, exc, [])
                return
            self.counts["gateway_calls"] += 1
            self.counts["reissued_calls"] += max(0, len(attempts) - 1)
            self._drained(e)
            self.on_done(e, call_id, out, attempts)

        fut.add_done_callback(done)

    def bind(self, e: int, cell: int) -> None:
        self._soon(self.gw.bind, self._id(e), cell_name(cell))

    def hold(self, e: int) -> None:
        """Unplaced: `e`'s calls wait in the gateway for its next bind."""
        self._soon(self.gw.bind, self._id(e), None)

    def release(self, e: int) -> None:
        self._soon(self.gw.release, self._id(e))
        self._names.pop(e, None)

    def migrate(self, e: int, old: int, new: int) -> None:
        """Bind `e` to `new`; a call of it in flight on `old` is re-issued there."""

        def go() -> None:
            self.gw.bind(self._id(e), cell_name(new))
            self.cells[old].evict(e, f"execution {e} migrated to cell {new}")

        self._soon(go)

    def drain(self, cell: int, held: list[int]) -> None:
        """Cell `cell` leaves rollout: hold its executions `held`, take no new calls, and
        re-issue its in-flight calls where they are bound next."""

        def go() -> None:
            b = self.cells[cell]
            for e in held:
                self.gw.bind(self._id(e), None)
            inflight = set(b._calls)
            if inflight:
                self._drains[cell] = (time.monotonic(), inflight)
            self.counts["drains"] += 1
            b.drain(cancel_inflight=False)
            for e in list(inflight):
                b.evict(e, "cell drained for training")

        self._soon(go)

    def resume(self, cell: int) -> None:
        """Cell `cell` serves rollout again."""
        self._soon(self.cells[cell].resume)

    def lost(self, cell: int, held: list[int]) -> None:
        """Cell `cell` died: as a drain (its calls are re-issued where their executions go next)."""
        self.drain(cell, held)

    def resolve(self, fut: asyncio.Future, result: Any) -> None:
        """A cell replied to a gateway call (None: the job was cancelled)."""

        def go() -> None:
            if not fut.done() and result is not None:
                fut.set_result(result)

        self._soon(go)

    def fail(self, fut: asyncio.Future, why: str) -> None:
        """A gateway call's job was lost with its cell."""

        def go() -> None:
            if not fut.done():
                fut.set_exception(BackendError(why))

        self._soon(go)

    def close(self) -> None:
        async def stop() -> None:
            await self.gw.close()
            for t in asyncio.all_tasks(self.loop):
                if t is not asyncio.current_task():
                    t.cancel()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=5)
        except Exception:  # noqa: BLE001 -- closing anyway
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    # ---- loop thread ---------------------------------------------------------------------
    def _drained(self, e: int) -> None:
        for cell, (t0, waiting) in list(self._drains.items()):
            waiting.discard(e)
            if not waiting:
                dt = time.monotonic() - t0
                self.counts["drain_s_total"] += dt
                self.counts["drain_s_max"] = max(self.counts["drain_s_max"], dt)
                del self._drains[cell]
