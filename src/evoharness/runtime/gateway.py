"""The OpenAI-compatible gateway (QwenGyre's black-box proxy): routing, TITO records, transparent retry.

An agent knows only a base URL. Each call is tied to an execution by, in order:
the path prefix ``/x/<execution id>/v1/…`` (for agents that cannot set
headers), the header ``X-Execution-Id``, the request's ``user`` field, else
``default``; its role by the header ``X-Agent-Role`` (`AGENT_ROLES`, default
``main``).

Per call the gateway

1. validates the request (`wire.ChatRequest`); malformed JSON, an oversized
   body, an unknown model or a bad field get an OpenAI-style 4xx and no record;
2. restores raw tool-call payloads the execution received earlier, by call id,
   so a harness that re-serialises history still sends the model its own tokens;
3. routes to the backend a scheduler bound the execution to (`Gateway.bind`, ``POST
   /admin/routes``; held executions wait for their bind), else to the least-loaded
   routable backend (in flight / capacity);
4. retries transparently: if the backend drops the connection, dies, answers
   5xx, or is drained mid-request, the call is re-issued on another backend
   (up to ``max_attempts``; while no backend is routable it waits up to
   ``wait_for_backend_s``). The client gets one normal answer;
5. appends one `CallRecord` per choice (``n > 1``: n independent samples, seeds
   ``seed + i``, each routed and retried on its own) (prompt ids as the engine tokenised them,
   completion ids, behaviour log-probs, policy version, timestamps, finish
   reason, every attempt) to the `RecordStore` (`record_store`: one JSONL per
   execution). A backend that reports no token ids (a server without
   ``return_token_ids``) leaves them empty; an unknown policy version is -1.

Streaming (``stream: true``) is served from the finished answer, as SSE
chunks with keep-alive comments while waiting: a retried call must reach the
client as one answer, never as two half-streams. A call that fails within the
first keep-alive period gets its error status, not a 200 stream. A client that
disconnects before its answer cancels the call (streaming or not, as vLLM
aborts it): nothing is recorded, a queued call never runs and an HTTP
backend sees its connection close (a batch already generating finishes).

HTTP surface:
    POST /v1/chat/completions, POST /x/{execution}/v1/chat/completions
    GET  /v1/models, GET /health
    GET  /v1/executions, GET /v1/executions/{id}/records?offset=N
    GET  /admin/backends, POST /admin/backends {"url": …, "grammar": "regex"|"xargs"?} | {"worker": true}
    DELETE /admin/backends/{name}
    POST /admin/backends/{name}/drain {"cancel_inflight": true}, POST /admin/backends/{name}/resume
    POST /admin/routes {"execution": id, "backend": name | null}   (bind an execution to a backend; null: hold
         its calls until the next bind), DELETE /admin/routes/{execution}   (load-balanced again)
    POST /admin/backends/{name}/weights {"path": dir, "version": n?}, POST /admin/weights (every backend)
    POST /admin/backends/{name}/version {"version": n}   (after syncing an external server yourself)
    GET  /admin/stats

Hardening (issue 49). Admin endpoints take ``Authorization: Bearer <token>``
where the gateway has an ``admin_token`` (`build_gateway`, hence ``evoharness
serve``, always has one: ``$EVOHARNESS_ADMIN_TOKEN`` or a generated one it
prints), accept only ``Content-Type: application/json`` bodies on POST, and
refuse any request a browser marks as cross-site (an ``Origin`` or
``Sec-Fetch-Site`` header): a web page cannot drive them. A connection must
send a complete request head within ``header_timeout_s`` (also between two
requests on a kept-alive one) and its body within ``body_timeout_s`` (408),
at most ``max_connections`` connections are held (beyond: closed at once)
and at most ``max_concurrency`` requests run (beyond: 503), so idle or
trickling clients cannot exhaust descriptors. Every malformed request is a
4xx: invalid UTF-8, JSON nested deeper than `MAX_JSON_DEPTH`, lone surrogates,
non-string tool-call ids, an execution id that is not valid Unicode or longer
than `MAX_EXECUTION_ID`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from evoharness.rollout.records import AGENT_ROLES, CallAttempt, CallRecord
from evoharness.runtime.backends import (
    GRAMMAR_FORMATS,
    Backend,
    BackendError,
    BackendRejected,
    GenOutput,
    GenParams,
    HTTPBackend,
    WorkerBackend,
)
from evoharness.runtime.record_store import RecordStore
from evoharness.runtime.wire import (
    ChatRequest,
    GatewayError,
    choice_body,
    completion_body,
    new_call_id,
    stream_chunks,
)

MAX_BODY_BYTES = 8 << 20
STREAM_KEEPALIVE_S = 5.0  # a waiting stream sends an SSE comment this often
MAX_JSON_DEPTH = 64  # nesting of a request body (a chat request needs about 8)
MAX_EXECUTION_ID = 1024  # characters of an execution id
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
MAX_CONNECTIONS = 512  # below the usual 1024 descriptors: the gateway keeps room for its backends and files
MAX_CONCURRENCY = 1024


def check_json(data: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Reject what `json.loads` accepts but no request may hold: nesting past `max_depth`
    and strings that are not valid Unicode (lone surrogates). Iterative.

    Raises:
        GatewayError: 400 with code ``invalid_json``.
    """
    stack = [(data, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            items: Any = ()
            strings = (v,)
        elif isinstance(v, dict):
            if depth > max_depth:
                raise GatewayError(400, f"request body is nested deeper than {max_depth}", code="invalid_json")
            strings = v.keys()
            items = v.values()
        elif isinstance(v, list):
            if depth > max_depth:
                raise GatewayError(400, f"request body is nested deeper than {max_depth}", code="invalid_json")
            strings, items = (), v
        else:
            continue
        for k in strings:
            try:
                k.encode("utf-8")
            except UnicodeEncodeError as e:
                raise GatewayError(
                    400, f"request body holds a string that is not valid Unicode ({e.reason})", code="invalid_json"
                ) from None
        stack.extend((x, depth + 1) for x in items)


def check_execution_id(eid: str) -> str:
    """`eid` if usable as an execution id (valid Unicode, at most `MAX_EXECUTION_ID` characters).

    Raises:
        GatewayError: 400.
    """
    if len(eid) > MAX_EXECUTION_ID:
        raise GatewayError(400, f"execution id longer than {MAX_EXECUTION_ID} characters", param="execution_id")
    try:
        eid.encode("utf-8")
    except UnicodeEncodeError:
        raise GatewayError(400, "execution id is not valid Unicode", param="execution_id") from None
    return eid


class Gateway:
    """Backends, routing, retry and records, independent of the HTTP layer.

    Args:
        backends: initial backends (started by `start`).
        served_model: the model name clients ask for (also listed by ``/v1/models``).
        records: a `RecordStore`, a directory for one, or None (in memory); False records nothing.
        max_attempts: tries per call across backends.
        wait_for_backend_s: how long a call waits for a routable backend before 503.
        worker_args: `WorkerBackend` settings for ``POST /admin/backends {"worker": true}``
            (``model_path`` and extra ``args``).
        max_tool_cache: executions whose tool-call payloads are kept (least recently used dropped).
        max_body_bytes: largest request body (413 beyond).
        admin_token: the bearer token admin endpoints require (None: none, loopback use).
        header_timeout_s / body_timeout_s: seconds a connection may take to send a request's
            head / body (served by `GatewayServer` and `serve`).
        max_connections / max_concurrency: connections held / requests running at most.
    """

    def __init__(
        self,
        backends: list[Backend] | None = None,
        served_model: str = "evoharness",
        records: RecordStore | str | Path | None | bool = None,
        max_attempts: int = 5,
        wait_for_backend_s: float = 30.0,
        worker_args: dict[str, Any] | None = None,
        max_tool_cache: int = 10_000,
        max_body_bytes: int = MAX_BODY_BYTES,
        admin_token: str | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_concurrency: int = MAX_CONCURRENCY,
    ):
        self.backends: dict[str, Backend] = {}
        for b in backends or []:
            if b.name in self.backends:
                raise ValueError(f"duplicate backend name {b.name!r}")
            self.backends[b.name] = b
        self.served_model = served_model
        if records is False:
            self.records = None
        else:
            self.records = records if isinstance(records, RecordStore) else RecordStore(records or None)
        self.max_attempts, self.wait_for_backend_s = max_attempts, wait_for_backend_s
        self.worker_args = worker_args or {}
        self.max_body_bytes = max_body_bytes
        self.admin_token = admin_token
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.max_connections, self.max_concurrency = max_connections, max_concurrency
        self._tool_cache: OrderedDict[str, dict[str, dict]] = OrderedDict()
        self.max_tool_cache = max_tool_cache
        self.stats = {"calls": 0, "retries": 0, "rejected": 0, "failed": 0, "cancelled": 0}
        self._n_added = 0
        # execution -> backend a scheduler bound it to (None: held, its calls wait for a bind)
        self.routes: dict[str, str | None] = {}

    # -- lifecycle / admin -------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.gather(*(b.start() for b in self.backends.values()))

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b in self.backends.values()), return_exceptions=True)

    async def add_backend(self, backend: Backend) -> Backend:
        if backend.name in self.backends:
            raise GatewayError(409, f"backend {backend.name!r} exists", code="backend_exists")
        try:
            await backend.start()
        except BackendError as e:
            raise GatewayError(502, str(e), "backend_error", "backend_unreachable") from e
        self.backends[backend.name] = backend
        return backend

    async def remove_backend(self, name: str) -> None:
        b = self._backend(name)
        b.drain(cancel_inflight=True)  # in-flight calls are retried elsewhere
        del self.backends[name]
        await b.close()

    def _backend(self, name: str) -> Backend:
        if name not in self.backends:
            raise GatewayError(404, f"no backend {name!r}", code="backend_not_found")
        return self.backends[name]

    def new_backend_name(self, prefix: str) -> str:
        while True:
            self._n_added += 1
            name = f"{prefix}{self._n_added}"
            if name not in self.backends:
                return name

    # -- calls ---------------------------------------------------------------------------

    def bind(self, execution_id: str, backend: str | None) -> None:
        """Route `execution_id`'s calls to `backend` only (a scheduler's placement; QwenGyre
        binds an execution to a rollout cell). None holds them: they wait for the next bind.
        A call of it in flight elsewhere finishes there unless that backend is drained or
        the call `evict`ed."""
        self.routes[execution_id] = backend

    def release(self, execution_id: str) -> None:
        """Forget `execution_id`'s binding: its calls go to the least-loaded backend again."""
        self.routes.pop(execution_id, None)

    def pick(self, exclude: set[str], execution_id: str | None = None) -> Backend | None:
        """The backend `execution_id` is bound to (`bind`) if routable, else None; for an
        unbound execution the least-loaded routable backend, preferring ones not yet tried."""
        if execution_id is not None and execution_id in self.routes:
            name = self.routes[execution_id]
            b = self.backends.get(name) if name is not None else None
            return b if b is not None and b.routable else None
        live = [b for b in self.backends.values() if b.routable]
        fresh = [b for b in live if b.name not in exclude] or live
        return min(fresh, key=lambda b: (b.load, b.in_flight, b.served), default=None)

    async def _wait_pick(self, exclude: set[str], execution_id: str | None = None) -> Backend | None:
        deadline = time.monotonic() + self.wait_for_backend_s
        while True:
            b = self.pick(exclude, execution_id)
            if b is not None or time.monotonic() >= deadline:
                return b
            await asyncio.sleep(0.05)

    def _restore_tool_calls(self, execution_id: str, messages: list[dict]) -> list[dict]:
        cache = self._tool_cache.get(execution_id)
        if not cache:
            return messages
        self._tool_cache.move_to_end(execution_id)
        out = []
        for m in messages:
            if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
                m = {
                    **m,
                    "tool_calls": [
                        cache.get(tc["id"], tc) if isinstance(tc, dict) and isinstance(tc.get("id"), str) else tc
                        for tc in m["tool_calls"]
                    ],
                }
            out.append(m)
        return out

    def _cache_tool_calls(self, execution_id: str, calls: list[dict]) -> None:
        if not calls:
            return
        cache = self._tool_cache.setdefault(execution_id, {})
        self._tool_cache.move_to_end(execution_id)
        for tc in calls:
            if isinstance(tc, dict) and isinstance(tc.get("id"), str) and tc["id"]:
                cache[tc["id"]] = tc
        while len(self._tool_cache) > self.max_tool_cache:
            self._tool_cache.popitem(last=False)

    def check_model(self, req: ChatRequest) -> None:
        if req.model != self.served_model:
            raise GatewayError(
                404,
                f"The model `{req.model}` does not exist; this gateway serves `{self.served_model}`.",
                code="model_not_found",
                param="model",
            )

    async def complete(self, req: ChatRequest, execution_id: str, role: str) -> dict[str, Any]:
        """Answer one validated request; returns the ``chat.completion`` body.

        Raises:
            GatewayError: 4xx passed on from a backend, or 503 when every attempt failed.
        """
        self.check_model(req)
        t_start = time.time()
        call_id = new_call_id()
        messages = self._restore_tool_calls(execution_id, [m.model_dump(exclude_none=True) for m in req.messages])
        params = GenParams(
            messages=messages,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=req.max_new_tokens,
            seed=req.seed,
            stops=req.stops,
            grammar=req.action_grammar,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
            chat_template_kwargs=req.chat_template_kwargs,
            tools=req.tools,
            tool_choice=req.tool_choice,
            want_token_text=req.logprobs,
            top_logprobs=req.top_logprobs if req.logprobs else None,
            passthrough=dict(req.model_extra or {}),
        )
        # n > 1: n independent calls (each routed and retried on its own; seeds seed, seed+1, ...),
        # one record each, so every sample is a branch of the execution's tree
        ps = (
            [params]
            if req.n == 1
            else [
                replace(params, seed=None if req.seed is None else (req.seed + i + 2**63) % 2**64 - 2**63)
                for i in range(req.n)
            ]
        )
        tasks = [asyncio.ensure_future(self._run_one(p, execution_id)) for p in ps]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            # a sibling failed, or the client went away (gather then cancelled them: a second cancel
            # would cut their unwinding short); the call ends once every sample has unwound
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                if not t.cancelling():
                    t.cancel()
            if pending:
                await asyncio.wait(pending)
        choices, n_completion = [], 0
        for i, (out, attempts) in enumerate(results):
            rec = CallRecord(
                execution_id=execution_id,
                call_id=call_id if req.n == 1 else f"{call_id}-{i}",
                role=role,
                model=req.model,
                prompt_token_ids=out.prompt_ids,
                completion_token_ids=out.completion_ids,
                logprobs=out.logprobs,
                policy_version=out.policy_version if out.policy_version is not None else -1,
                finish_reason=out.finish_reason,
                t_start=t_start,
                t_end=time.time(),
                attempts=attempts,
                tool_calls=out.tool_calls,
                messages=messages,
                constraint=None
                if req.action_grammar is None
                else {
                    "commands": list(req.action_grammar.commands),
                    "meta_verbs": list(req.action_grammar.meta_verbs),
                    "max_new_tokens": out.max_new_tokens,
                },
            )
            if self.records is not None:
                self.records.append(rec)
            self._cache_tool_calls(execution_id, out.tool_calls)
            choices.append(
                choice_body(
                    i,
                    out.content,
                    out.tool_calls,
                    out.finish_reason,
                    out.completion_ids,
                    out.logprobs,
                    req,
                    out.tokens,
                    out.top_logprobs,
                )
            )
            n_completion += len(out.completion_ids)
        first = results[0][0]
        return completion_body(
            call_id, req.model, choices, first.prompt_ids, n_completion, first.policy_version, req, first.prompt_fit
        )

    async def generate(
        self, params: GenParams, execution_id: str, role: str = "main"
    ) -> tuple[GenOutput, list[CallAttempt]]:
        """One call of `execution_id` without the HTTP layer (an in-process harness, the
        runtime's agent loops): routed, retried and recorded as `complete` does.

        Raises:
            GatewayError: 4xx passed on from a backend, or 503 when every attempt failed.
        """
        t_start = time.time()
        out, attempts = await self._run_one(params, execution_id)
        if self.records is not None:
            self.records.append(
                CallRecord(
                    execution_id=execution_id,
                    call_id=new_call_id(),
                    role=role,
                    model=self.served_model,
                    prompt_token_ids=out.prompt_ids,
                    completion_token_ids=out.completion_ids,
                    logprobs=out.logprobs,
                    policy_version=out.policy_version if out.policy_version is not None else -1,
                    finish_reason=out.finish_reason,
                    t_start=t_start,
                    t_end=time.time(),
                    attempts=attempts,
                    tool_calls=out.tool_calls,
                    messages=params.messages,
                )
            )
        return out, attempts

    async def _run_one(self, params: GenParams, execution_id: str | None = None) -> tuple[GenOutput, list[CallAttempt]]:
        """One completion, retried across backends (only the bound one for a bound
        execution); its answer and every attempt."""
        attempts: list[CallAttempt] = []
        tried: set[str] = set()
        out: GenOutput | None = None
        for _ in range(self.max_attempts):
            backend = await self._wait_pick(tried, execution_id)
            if backend is None:
                break
            tried.add(backend.name)
            a0 = time.time()
            try:
                out = await backend.run(params)
            except BackendError as e:
                attempts.append(CallAttempt(backend.name, a0, time.time(), str(e)[:500]))
                continue
            except BackendRejected as e:
                self.stats["rejected"] += 1
                raise GatewayError(e.status, e.message, code=e.code) from e
            attempts.append(CallAttempt(backend.name, a0, time.time(), None))
            break
        self.stats["calls"] += 1
        self.stats["retries"] += max(0, len(attempts) - 1)
        if out is None:
            self.stats["failed"] += 1
            why = attempts[-1].error if attempts else "no backend is available"
            raise GatewayError(
                503,
                f"no backend answered after {len(attempts)} attempt(s): {why}",
                "service_unavailable",
                "backend_unavailable",
            )
        return out, attempts

    def health(self) -> dict[str, Any]:
        live = sum(b.routable for b in self.backends.values())
        return {"status": "ok" if live else "no_backend", "backends": len(self.backends), "routable": live}


# ---------------------------------------------------------------- hardening of the HTTP layer


class AdminGuard:
    """ASGI middleware in front of ``/admin/*``: the gateway's bearer token (where it has
    one), no cross-site request (a browser's ``Origin`` / ``Sec-Fetch-Site: cross-site``),
    and a JSON content type on every POST (a page's form or ``text/plain`` POST needs no
    CORS preflight; a JSON one does, and the gateway answers none)."""

    def __init__(self, app, gateway: Gateway) -> None:
        self.app, self.gw = app, gateway

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/admin"):
            refusal = self.refusal(scope)
            if refusal is not None:
                status, code, message = refusal
                body = json.dumps(
                    {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
                ).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                if status == 401:
                    headers.append((b"www-authenticate", b"Bearer"))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> tuple[int, str, str] | None:
        h: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            h.setdefault(k.lower(), v)
        if self.gw.admin_token is not None:
            got = h.get(b"authorization", b"")
            want = b"Bearer " + self.gw.admin_token.encode()
            if not hmac.compare_digest(got, want):
                return 401, "unauthorized", "admin endpoints need 'Authorization: Bearer <admin token>'"
        if b"origin" in h or h.get(b"sec-fetch-site", b"none") not in (b"none", b"same-origin"):
            return 403, "cross_site", "admin endpoints refuse requests made by a web page"
        if scope["method"] == "POST":
            ctype = h.get(b"content-type", b"").split(b";")[0].strip().lower()
            if ctype != b"application/json":
                return 415, "unsupported_media_type", "admin POST bodies must be 'Content-Type: application/json'"
        return None


def guarded_protocol(header_timeout_s: float, max_connections: int):
    """uvicorn's h11 protocol with a deadline on each request head and a cap on connections.

    A connection that has not sent a complete request head `header_timeout_s` after it
    opened, or after its last response (a kept-alive one: then ``max(header_timeout_s,
    keep-alive)``), is closed. Past `max_connections`, a new connection evicts the
    connection that has waited longest for a request head (an idle or trickling one), so
    a flood of silent connections cannot lock real clients out; with none waiting, the
    new connection is closed.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _head_timer = None
        _waiting_since = 0.0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                idle = [c for c in self.connections if c is not self and getattr(c, "_head_timer", None) is not None]
                if not idle:
                    transport.close()
                    return
                oldest = min(idle, key=lambda c: c._waiting_since)
                oldest._disarm()
                oldest.transport.close()
            self._arm(header_timeout_s)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._waiting_since = self.loop.time()
            self._head_timer = self.loop.call_later(seconds, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a complete request head arrived
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm(max(header_timeout_s, float(self.timeout_keep_alive)))

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def uvicorn_config(app, gateway: Gateway, **kw):
    """A uvicorn ``Config`` serving `app` with `gateway`'s connection limits and timeouts."""
    import uvicorn

    return uvicorn.Config(
        app,
        http=guarded_protocol(gateway.header_timeout_s, gateway.max_connections),
        limit_concurrency=gateway.max_concurrency,
        timeout_keep_alive=30,
        backlog=2048,
        **kw,
    )


# ---------------------------------------------------------------- HTTP layer


def create_app(gw: Gateway):
    """The FastAPI application serving `gw` (starts and closes its backends with the app)."""

    @asynccontextmanager
    async def lifespan(app):
        await gw.start()
        try:
            yield
        finally:
            await gw.close()

    app = FastAPI(title="evoharness gateway", lifespan=lifespan)
    app.add_middleware(AdminGuard, gateway=gw)

    @app.exception_handler(GatewayError)
    async def _gw_error(request, exc: GatewayError):
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > gw.max_body_bytes:
            raise GatewayError(
                413,
                f"request body of {length} bytes exceeds the limit of {gw.max_body_bytes}",
                code="request_too_large",
            )
        buf = bytearray()
        try:
            async with asyncio.timeout(gw.body_timeout_s):  # a client trickling its body holds a request slot
                async for chunk in request.stream():
                    buf += chunk
                    if len(buf) > gw.max_body_bytes:
                        raise GatewayError(
                            413,
                            f"request body exceeds the limit of {gw.max_body_bytes} bytes",
                            code="request_too_large",
                        )
        except TimeoutError:
            raise GatewayError(
                408, f"request body not received within {gw.body_timeout_s:g} s", code="request_timeout"
            ) from None
        try:
            text = buf.decode("utf-8")  # strict: encoded surrogates (CESU-8) are refused, not decoded
            data = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: nesting past the C parser's limit
            raise GatewayError(
                400, f"request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}", code="invalid_json"
            ) from None
        check_json(data)
        return data

    def parse_chat(data: Any) -> ChatRequest:
        from pydantic import ValidationError

        if not isinstance(data, dict):
            raise GatewayError(400, "request body must be a JSON object", code="invalid_request")
        try:
            return ChatRequest.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"])
            raise GatewayError(
                400,
                f"invalid field `{loc}`: {first['msg']} ({e.error_count()} error(s))",
                code="invalid_value",
                param=loc,
            ) from e
        except (ValueError, TypeError, RecursionError) as e:  # a validator's own failure is still the request's
            raise GatewayError(
                400, f"invalid request: {type(e).__name__}: {str(e)[:200]}", code="invalid_value"
            ) from None

    async def until_done_or_gone(request: Request, task: asyncio.Future, timeout: float | None = None) -> str:
        """Wait for `task`: ``done``; or the client disconnected first: the task is cancelled (no record:
        the agent never saw the answer, as vLLM aborts such requests), ``gone``; or ``timeout``."""

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        listener = asyncio.ensure_future(gone())
        try:
            done, _ = await asyncio.wait({task, listener}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            listener.cancel()
        if task in done:
            return "done"
        if listener in done:
            task.cancel()
            await asyncio.wait({task})  # counted once the call has unwound, not when it is asked to
            gw.stats["cancelled"] += 1
            return "gone"
        return "timeout"

    async def chat(request: Request, execution_id: str | None = None):
        req = parse_chat(await read_json(request))
        gw.check_model(req)
        eid = check_execution_id(execution_id or request.headers.get("x-execution-id") or req.user or "default")
        role = request.headers.get("x-agent-role", "main")
        if role not in AGENT_ROLES:
            raise GatewayError(
                400,
                f"X-Agent-Role must be one of {list(AGENT_ROLES)}, got {role!r}",
                code="invalid_value",
                param="X-Agent-Role",
            )
        task = asyncio.ensure_future(gw.complete(req, eid, role))
        if not req.stream:
            if await until_done_or_gone(request, task) == "gone":
                return Response(status_code=499)  # nobody is listening
            return JSONResponse(task.result())
        # a call refused early (bad prompt, no backend) gets its 4xx/5xx status, not a 200 stream holding an error
        waited = await until_done_or_gone(request, task, STREAM_KEEPALIVE_S)
        if waited == "gone":
            return Response(status_code=499)
        if waited == "done" and task.exception() is not None:
            raise task.exception()
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        async def events():
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=STREAM_KEEPALIVE_S)
                    if done:
                        break
                    yield b": keep-alive\n\n"
                try:
                    body = task.result()
                except GatewayError as e:
                    yield f"data: {json.dumps(e.body())}\n\n".encode()
                    return
                for c in stream_chunks(body, include_usage):
                    yield f"data: {json.dumps(c)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                if not task.done():
                    task.cancel()  # the client went away

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Execution-Id": eid}
        )

    @app.post("/v1/chat/completions")
    async def chat_root(request: Request):
        return await chat(request)

    @app.post("/x/{execution_id}/v1/chat/completions")
    async def chat_prefixed(execution_id: str, request: Request):
        return await chat(request, execution_id)

    def models_body() -> dict[str, Any]:
        versions = sorted({b.policy_version for b in gw.backends.values()})
        return {
            "object": "list",
            "data": [
                {
                    "id": gw.served_model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "evoharness",
                    "policy_version": versions[-1] if versions else None,
                }
            ],
        }

    @app.get("/v1/models")
    async def models():
        return models_body()

    @app.get("/x/{execution_id}/v1/models")
    async def models_prefixed(execution_id: str):
        return models_body()

    @app.get("/health")
    async def health():
        h = gw.health()
        return JSONResponse(h, status_code=200 if h["routable"] else 503)

    @app.get("/v1/executions")
    async def executions():
        if gw.records is None:
            raise GatewayError(404, "this gateway keeps no records", code="no_records")
        return {"object": "list", "data": [{"id": k, "records": v} for k, v in sorted(gw.records.executions().items())]}

    @app.get("/v1/executions/{execution_id:path}/records")
    async def execution_records(execution_id: str, offset: int = 0):
        if gw.records is None:
            raise GatewayError(404, "this gateway keeps no records", code="no_records")
        check_execution_id(execution_id)
        if offset < 0:
            raise GatewayError(400, "offset must be >= 0", param="offset")
        recs = gw.records.read(execution_id, offset)
        return {"object": "list", "execution_id": execution_id, "offset": offset, "data": [r.to_dict() for r in recs]}

    @app.get("/admin/backends")
    async def list_backends():
        return {"data": [b.info() for b in gw.backends.values()]}

    @app.post("/admin/backends")
    async def add_backend(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict):
            raise GatewayError(400, "body must be a JSON object")
        if body.get("worker"):
            if not gw.worker_args.get("model_path"):
                raise GatewayError(400, "this gateway was started without --model-path: cannot start workers")
            b = WorkerBackend(name=body.get("name") or gw.new_backend_name("worker"), **gw.worker_args)
        elif isinstance(body.get("url"), str):
            if body.get("grammar", "regex") not in GRAMMAR_FORMATS:
                raise GatewayError(400, f"grammar must be one of {list(GRAMMAR_FORMATS)}", param="grammar")
            b = HTTPBackend(
                body["url"],
                name=body.get("name") or gw.new_backend_name("http"),
                model=body.get("model"),
                capacity=int(body.get("capacity", 64)),
                grammar=body.get("grammar", "regex"),
            )
        else:
            raise GatewayError(400, 'give {"url": "http://host:port/v1"} or {"worker": true}', param="url")
        return (await gw.add_backend(b)).info()

    @app.delete("/admin/backends/{name}")
    async def remove_backend(name: str):
        await gw.remove_backend(name)
        return {"removed": name}

    @app.post("/admin/backends/{name}/drain")
    async def drain(name: str, request: Request):
        body = await read_json(request) if int(request.headers.get("content-length") or 0) else {}
        b = gw._backend(name)
        b.drain(cancel_inflight=bool((body or {}).get("cancel_inflight", True)))
        return b.info()

    @app.post("/admin/routes")
    async def bind(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("execution"), str):
            raise GatewayError(400, 'expected {"execution": id, "backend": name or null}', param="execution")
        if body.get("backend") is not None:
            gw._backend(body["backend"])  # 404 for an unknown backend
        gw.bind(body["execution"], body.get("backend"))
        return {"execution": body["execution"], "backend": body.get("backend")}

    @app.delete("/admin/routes/{execution_id:path}")
    async def release(execution_id: str):
        gw.release(execution_id)
        return {"execution": execution_id, "backend": None, "released": True}

    @app.post("/admin/backends/{name}/resume")
    async def resume(name: str):
        b = gw._backend(name)
        try:
            b.resume()
        except BackendError as e:
            raise GatewayError(409, str(e), code="backend_dead") from e
        return b.info()

    async def load_weights(b: Backend, body: Any) -> int:
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise GatewayError(400, 'give {"path": "<model directory>", "version": <int, optional>}', param="path")
        try:
            return await b.load_weights(body["path"], body.get("version"))
        except BackendRejected as e:
            raise GatewayError(e.status, e.message) from e
        except BackendError as e:
            raise GatewayError(502, str(e), "backend_error") from e

    @app.post("/admin/backends/{name}/weights")
    async def weights(name: str, request: Request):
        b = gw._backend(name)
        return {"name": name, "policy_version": await load_weights(b, await read_json(request))}

    @app.post("/admin/weights")
    async def weights_all(request: Request):
        body = await read_json(request)
        return {
            "data": [
                {"name": b.name, "policy_version": await load_weights(b, body)} for b in list(gw.backends.values())
            ]
        }

    @app.post("/admin/backends/{name}/version")
    async def set_version(name: str, request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("version"), int):
            raise GatewayError(400, 'give {"version": <int>}', param="version")
        b = gw._backend(name)
        try:
            b.set_version(body["version"])
        except BackendRejected as e:
            raise GatewayError(e.status, e.message) from e
        return b.info()

    @app.get("/admin/stats")
    async def stats():
        return {**gw.stats, "backends": [b.info() for b in gw.backends.values()]}

    return app


class GatewayServer:
    """Run a `Gateway` with uvicorn on a background thread (tests, benchmarks, ``rl`` through the gateway).

    Usage::

        with GatewayServer(Gateway([LocalBackend.from_policy(policy)])) as srv:
            OpenAIPolicy(base_url=srv.url, model=srv.gateway.served_model, …)

    Args:
        port: 0 picks a free port (see `port` after `start`).
    """

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.gateway, self.host = gateway, host
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so; without it
        # Nagle + delayed ACK added 40 ms to every call (measured here)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.log_level = log_level
        self._server = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 300.0) -> GatewayServer:
        import uvicorn

        config = uvicorn_config(create_app(self.gateway), self.gateway, log_level=self.log_level)
        self._server = uvicorn.Server(config)
        failed: list[BaseException] = []

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self._server.serve(sockets=[self._sock]))
            except BaseException as e:  # noqa: BLE001 -- surfaced by start()
                failed.append(e)

        self._thread = threading.Thread(target=run, name="gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if failed or not self._thread.is_alive():
                raise RuntimeError(f"gateway failed to start: {failed[0] if failed else 'thread exited'}")
            if time.monotonic() > deadline:
                raise TimeoutError("gateway did not start in time")
            time.sleep(0.02)
        return self

    def call(self, coro, timeout_s: float | None = None):
        """Run a coroutine (e.g. an admin action on the gateway) on the server's event loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self._sock.close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# directory names the project's runs give every model (runs/X/rl/final, .../checkpoints/step_8): not a name
_GENERIC = re.compile(r"^(final|model|latest|checkpoint[s]?|step_?\d+|sft|rl|v\d+)$")


def model_name(model_path: str | Path) -> str:
    """The name a served model directory goes by: its path's last parts up to the first that is not
    generic, joined by ``-`` (``runs/smoke/rl/final`` -> ``smoke-rl-final``; ``/models/Qwen3-8B`` ->
    ``Qwen3-8B``)."""
    parts = Path(model_path).resolve().parts
    out: list[str] = []
    for p in reversed(parts[1:]):
        out.insert(0, p)
        if not _GENERIC.match(p):
            break
    return "-".join(out) or "evoharness"


def build_gateway(
    model_path: str | None = None,
    backend_urls: list[str] | None = None,
    workers: int = 0,
    records: str | Path | None = None,
    served_model: str | None = None,
    max_prompt_tokens: int | None = None,
    max_batch: int = 64,
    num_threads: int | None = None,
    log_dir: str | Path | None = None,
    backend_grammar: str = "regex",
    admin_token: str | None = None,
) -> Gateway:
    """The gateway ``evoharness serve`` runs.

    Its admin endpoints need `admin_token`, else ``$EVOHARNESS_ADMIN_TOKEN``, else a
    random token printed once on stderr.

    `model_path` with ``workers == 0`` loads the engine in this process; with
    ``workers = N`` it starts N worker processes instead. Each `backend_urls`
    entry adds an OpenAI-compatible server, sent ``action_grammar`` as `backend_grammar`
    (`HTTPBackend`'s ``grammar``). Backends start with the app.

    Raises:
        ValueError: no backend at all.
    """
    if not model_path and not backend_urls:
        raise ValueError("give --model-path and/or --backend URL")
    backends: list[Backend] = []
    worker_args: dict[str, Any] = {}
    if model_path:
        args = ["--max-batch", str(max_batch)]
        if max_prompt_tokens:
            args += ["--max-prompt-tokens", str(max_prompt_tokens)]
        if num_threads:
            args += ["--num-threads", str(num_threads)]
        # also without --workers: POST /admin/backends {"worker": true} adds engine processes later
        worker_args = {"model_path": str(model_path), "args": args}
        if workers > 0:
            for i in range(workers):
                log = Path(log_dir) / f"worker{i}.log" if log_dir else None
                backends.append(WorkerBackend(name=f"worker{i}", log_path=log, **worker_args))
        else:
            from evoharness.runtime.backends import LocalBackend

            backends.append(
                LocalBackend.from_model_path(
                    model_path, max_prompt_tokens=max_prompt_tokens, max_batch=max_batch, num_threads=num_threads
                )
            )
    for i, url in enumerate(backend_urls or []):
        backends.append(HTTPBackend(url, name=f"http{i}", grammar=backend_grammar))
    name = served_model or (model_name(model_path) if model_path else "evoharness")
    token = admin_token or os.environ.get("EVOHARNESS_ADMIN_TOKEN")
    if not token:
        token = secrets.token_urlsafe(24)
        print(
            f"gateway admin token (Authorization: Bearer ...; set EVOHARNESS_ADMIN_TOKEN to choose it): {token}",
            file=sys.stderr,
            flush=True,
        )
    return Gateway(backends, served_model=name, records=records, worker_args=worker_args, admin_token=token)


def serve(gateway: Gateway, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve `gateway` in the foreground until interrupted (Ctrl-C / SIGTERM stop it cleanly).

    Raises:
        ValueError: `host` is not loopback and the gateway has no admin token.
    """
    import uvicorn

    if gateway.admin_token is None and host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(
            f"refusing to serve unauthenticated admin endpoints on {host}: give the gateway an admin_token"
        )
    uvicorn.Server(
        uvicorn_config(create_app(gateway), gateway, host=host, port=port, log_level=log_level, access_log=False)
    ).run()  # records are the log


@contextmanager
def served_policy(policy, records: RecordStore | str | Path | None = None, concurrency: int = 64):
    """Serve a live `LocalHFPolicy` through a loopback gateway; yield an `OpenAIPolicy` that samples as it does.

    The gateway's backend shares the policy's engine and weights (`LocalBackend.from_policy`):
    a trainer updating ``policy.model`` in place and bumping ``policy.policy_version`` is seen
    by the next call, so RL rollouts can go through the gateway (issue 12 item 6) and give the
    same trajectories as ``policy.act`` with the same seeds. The client copies the sampling
    settings (temperature, top_p, max tokens, seed, constraint, prompt budget) at entry.
    """
    from evoharness.policies.openai_policy import OpenAIPolicy
    from evoharness.runtime.backends import LocalBackend

    srv = GatewayServer(Gateway([LocalBackend.from_policy(policy)], served_model="policy", records=records)).start()
    client = OpenAIPolicy(
        base_url=srv.url,
        model="policy",
        temperature=policy.temperature,
        top_p=policy.top_p,
        max_tokens=policy.max_new_tokens,
        seed=policy.seed,
        constrained=policy.constrained,
        max_prompt_tokens=policy.max_prompt_tokens,
        meta_verbs=policy.meta_verbs,
        concurrency=concurrency,
        max_retries=0,
        timeout_s=3600,
    )
    try:
        yield client
    finally:
        client.close()
        srv.stop()
