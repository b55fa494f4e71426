"""Rollout backends behind the gateway: who actually generates.

Three kinds, one interface (`Backend.run(params) -> GenOutput`):

- `LocalBackend`: an engine in this process (`engines.hf.Engine`, or any object
  with its ``generate(requests, max_new_tokens, temperature, top_p)`` and
  ``grammar(commands, meta_verbs)``). Concurrent requests are gathered into
  one ``generate`` batch per (temperature, top_p, max_tokens); generation runs
  on one dedicated thread, so weight reloads never interleave with a batch.
- `HTTPBackend`: any OpenAI-compatible server (vLLM, SGLang, an evoharness
  worker), asked for ``logprobs`` and ``return_token_ids``.
- `WorkerBackend`: an `HTTPBackend` whose server is an evoharness worker
  process (`runtime.worker`) this backend started and owns.

Failure classes: `BackendError` means "this backend failed, try another"
(connection dropped, process died, 5xx, drained mid-request);
`BackendRejected` means "the request itself is bad" (4xx) and is not retried.

Draining (QwenGyre's harness-preserving role transfer): a draining backend
takes no new calls; with ``cancel_inflight`` its in-flight calls are cancelled
at once and fail with `BackendError`, so the gateway re-issues them elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from evoharness.engines.grammar import ActionGrammarSpec, action_regex
from evoharness.runtime.wire import parse_tool_calls


class BackendError(Exception):
    """The backend failed this call (retry elsewhere)."""


class BackendRejected(Exception):
    """The backend refused the request as malformed (an OpenAI-style 4xx; not retried)."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass
class GenParams:
    """One call, as the gateway hands it to a backend.

    Attributes:
        messages: chat messages (tool-call payloads already restored from the gateway's cache).
        temperature / top_p: sampling (temperature 0 = greedy).
        max_tokens: completion cap; None = the backend's default.
        seed: per-request sampling seed (None: backend's choice).
        stops: stop strings (excluded from the text, as in vLLM).
        grammar: the ``action_grammar`` constraint, or None.
        truncate_prompt_tokens: keep only the last N prompt tokens.
        chat_template_kwargs: chat-template arguments (e.g. ``enable_thinking``), applied by
            engine backends and forwarded to HTTP backends.
        tools / tool_choice: passed to the chat template or the HTTP backend as is.
        want_token_text: fill `GenOutput.tokens` (for ``logprobs.content[].token``).
        top_logprobs: alternatives per token to return (HTTP backends only; None/0: none).
        passthrough: other request fields, forwarded to HTTP backends only.
    """

    messages: list[dict[str, Any]]
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    stops: list[str] = field(default_factory=list)
    grammar: ActionGrammarSpec | None = None
    truncate_prompt_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    want_token_text: bool = False
    top_logprobs: int | None = None
    passthrough: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenOutput:
    """A backend's answer: token-in/token-out plus the assistant message.

    Empty id/log-prob lists mean the backend does not report them (a server
    without ``return_token_ids``); `policy_version` None means unknown.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    policy_version: int | None
    tokens: list[str] | None = None
    prompt_fit: dict[str, int] | None = None  # how an over-budget prompt was shortened (`harness.prompt.PromptFit`)
    max_new_tokens: int | None = None  # the completion cap applied (the grammar's budget); None: unknown
    top_logprobs: list[list[dict[str, Any]]] | None = None  # per token, as the backend returned them
    detail: Any = None  # an in-process backend's full answer (a runtime cell's reply: a `Completion` dict)


class Backend:
    """Base class: state, load accounting and eviction; subclasses implement `_generate`.

    Attributes:
        name: unique within a gateway.
        capacity: calls in flight at which the backend counts as full (routing weight).
        state: ``active`` (routable), ``draining`` (no new calls) or ``dead``.
        in_flight / served / failed: counters (a call is in flight until its generation has unwound).
    """

    kind = "base"

    def __init__(self, name: str, capacity: int = 64):
        self.name, self.capacity = name, max(1, capacity)
        self.state = "active"
        self.in_flight = self.served = self.failed = 0
        self._version = 0
        self._evict: asyncio.Event | None = None
        self.down_until = 0.0  # after a connection failure: skipped by routing until then

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def load(self) -> float:
        return self.in_flight / self.capacity

    @property
    def routable(self) -> bool:
        return self.state == "active" and time.monotonic() >= self.down_until

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def _evict_event(self) -> asyncio.Event:
        if self._evict is None:
            self._evict = asyncio.Event()
        return self._evict

    async def run(self, params: GenParams) -> GenOutput:
        """Generate, unless the backend is evicted first (then `BackendError`)."""
        if self.state != "active":
            raise BackendError(f"backend {self.name} is {self.state}")
        evict = self._evict_event()
        self.in_flight += 1
        task = asyncio.ensure_future(self._generate(params))
        waiter = asyncio.ensure_future(evict.wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:  # evicted; the finally cancels the generation
                raise BackendError(f"backend {self.name} drained mid-request")
            out = task.result()
            self.served += 1
            return out
        except BackendError:
            self.failed += 1
            raise
        finally:
            waiter.cancel()
            try:
                if not task.done():
                    task.cancel()
                    await asyncio.wait({task})  # in flight until it has unwound (an HTTP backend's abort)
            finally:  # even when a second cancel cuts that wait short
                self.in_flight -= 1

    async def _generate(self, params: GenParams) -> GenOutput:
        raise NotImplementedError

    def drain(self, cancel_inflight: bool = True) -> None:
        """Stop taking new calls; with `cancel_inflight`, fail the running ones now (they are retried elsewhere)."""
        if self.state == "active":
            self.state = "draining"
        if cancel_inflight:
            self._evict_event().set()

    def resume(self) -> None:
        """Take calls again after `drain`."""
        if self.state == "dead":
            raise BackendError(f"backend {self.name} is dead")
        self.state = "active"
        self._evict = asyncio.Event()

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """Reload weights from a model directory; returns the new policy version."""
        raise BackendRejected(
            400, f"backend {self.name} ({self.kind}) cannot reload weights; sync it yourself and set its version"
        )

    def set_version(self, version: int) -> None:
        self._version = int(version)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "in_flight": self.in_flight,
            "capacity": self.capacity,
            "served": self.served,
            "failed": self.failed,
            "policy_version": self.policy_version,
        }


# ---------------------------------------------------------------- in-process engine


@dataclass
class _Item:
    params: GenParams
    future: asyncio.Future


def load_state_dict_checked(model, state_dict: dict[str, Any]) -> None:
    """Load `state_dict` into `model` in place; a tied weight may be left out.

    Raises:
        KeyError: unexpected keys, or missing keys that are not tied weights.
    """
    own = model.state_dict()
    res = model.load_state_dict(state_dict, strict=False)
    given = {own[k].data_ptr() for k in state_dict if k in own}
    missing = [k for k in res.missing_keys if own[k].data_ptr() not in given]
    if missing or res.unexpected_keys:
        raise KeyError(f"weights do not fit the model: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}")


def read_safetensors_dir(path: str | Path) -> dict[str, Any]:
    """All tensors of the ``*.safetensors`` files in a model directory.

    Raises:
        FileNotFoundError: no safetensors file there.
    """
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    sd: dict[str, Any] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


class LocalBackend(Backend):
    """The project's engine in this process, batching concurrent calls.

    Args:
        engine: `engines.hf.Engine` (or the same interface); its ``model`` is reloaded by `load_weights`.
        tokenizer: the model's tokenizer (chat template applied with ``add_generation_prompt``).
        max_prompt_tokens: prompt budget (None: no cap); a request's ``truncate_prompt_tokens``
            wins. A longer prompt is fitted as `LocalHFPolicy` fits it
            (`harness.prompt.fit_prompt_ids`: oldest history first), so served and
            in-process prompts match; with ``tools`` it is left-truncated.
        default_max_tokens: completion cap when the request gives none.
        max_batch: calls per ``generate`` at most.
        batch_wait_s: after a call arrives, wait this long for the next one to join the batch
            (0: take only what is already queued).
        max_batch_wait_s: the longest a batch waits for company in total.
        num_threads: torch CPU threads while generating (None: unchanged).
        policy_version: initial version; `version_source` (a callable) overrides it, e.g.
            to follow a trainer's `LocalHFPolicy.policy_version` when the weights are shared.
        max_model_len: prompt + completion limit (default: the model config's
            ``max_position_embeddings``); longer requests get a 400.
    """

    kind = "local"

    def __init__(
        self,
        engine,
        tokenizer,
        name: str = "local",
        max_prompt_tokens: int | None = None,
        default_max_tokens: int = 256,
        max_batch: int = 64,
        batch_wait_s: float = 0.005,
        max_batch_wait_s: float = 0.05,
        num_threads: int | None = None,
        policy_version: int = 0,
        version_source: Callable[[], int] | None = None,
        max_model_len: int | None = None,
        capacity: int | None = None,
    ):
        super().__init__(name, capacity or max_batch)
        self.engine, self.tokenizer = engine, tokenizer
        self.max_prompt_tokens, self.default_max_tokens = max_prompt_tokens, default_max_tokens
        self.max_batch, self.batch_wait_s, self.num_threads = max_batch, batch_wait_s, num_threads
        self.max_batch_wait_s = max_batch_wait_s
        self._version, self._version_source = policy_version, version_source
        cfg = getattr(getattr(engine, "model", None), "config", None)
        self.max_model_len = max_model_len or getattr(cfg, "max_position_embeddings", None)
        action_close = tokenizer.convert_tokens_to_ids("</action>")
        stop_ids = set(getattr(engine, "stop_ids", ()))
        # ids not shown in the text: end-of-turn and padding (as `LocalHFPolicy`); `</action>` is kept
        self._hidden = {tokenizer.eos_token_id, tokenizer.pad_token_id, *stop_ids} - {action_close, None}
        self._queue: asyncio.Queue[_Item] | None = None
        self._loop_task: asyncio.Task | None = None
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{name}")
        self.batches = 0

    @classmethod
    def from_model_path(
        cls, model_path: str | Path, device: str = "cpu", dtype: str | None = None, decoder: str = "auto", **kw: Any
    ) -> LocalBackend:
        """Load a local HF model directory into an in-process engine (`engines.make_engine` name `decoder`)."""
        from evoharness.engines import make_engine
        from evoharness.models.init import load_model, load_tokenizer

        model = load_model(model_path, device, dtype)
        tok = load_tokenizer(model_path)
        return cls(make_engine(decoder, model, tok), tok, **kw)

    @classmethod
    def from_policy(cls, policy, name: str = "local", **kw: Any) -> LocalBackend:
        """Serve a live `LocalHFPolicy`'s engine: same weights, same version (a trainer updating
        the policy in place is seen at once), same prompt cap."""
        kw.setdefault("max_prompt_tokens", policy.max_prompt_tokens)
        kw.setdefault("default_max_tokens", policy.max_new_tokens)
        kw.setdefault("num_threads", policy.num_threads)
        return cls(policy.engine, policy.tokenizer, name=name, version_source=lambda: policy.policy_version, **kw)

    @property
    def policy_version(self) -> int:
        return self._version_source() if self._version_source else self._version

    def set_version(self, version: int) -> None:
        if self._version_source:
            raise BackendRejected(400, f"backend {self.name} follows its policy's version")
        self._version = int(version)

    async def start(self) -> None:
        if self._loop_task is None:
            self._queue = asyncio.Queue()
            self._loop_task = asyncio.create_task(self._batch_loop())

    async def close(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            self._loop_task = None
        self._exec.shutdown(wait=False, cancel_futures=True)

    async def _generate(self, params: GenParams) -> GenOutput:
        if self._queue is None:
            await self.start()
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(params, fut))
        return await fut

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self._queue.get()]
            # gather a burst: keep waiting while calls arrive less than `batch_wait_s` apart
            # (agents answered by the last batch send their next calls together), at most `max_batch_wait_s`
            deadline = loop.time() + self.max_batch_wait_s
            while len(items) < self.max_batch:
                if not self._queue.empty():
                    items.append(self._queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0 or not self.batch_wait_s:
                    break
                try:
                    items.append(await asyncio.wait_for(self._queue.get(), min(self.batch_wait_s, left)))
                except TimeoutError:
                    break
            items = [it for it in items if not it.future.done()]  # cancelled while queued
            if not items:
                continue
            try:
                results = await loop.run_in_executor(self._exec, self._run_batch, [it.params for it in items])
            except Exception as e:  # noqa: BLE001 -- the engine thread itself failed
                results = [BackendError(f"{type(e).__name__}: {e}")] * len(items)
            for it, r in zip(items, results):
                if it.future.done():
                    continue
                if isinstance(r, BaseException):
                    it.future.set_exception(r)
                else:
                    it.future.set_result(r)

    # -- engine thread ----------------------------------------------------------------

    def _prompt_ids(self, p: GenParams) -> tuple[list[int], dict[str, int] | None]:
        """The prompt ids within the budget, and how they were shortened (None: not at all)."""
        msgs = [_template_message(m) for m in p.messages]
        kw = {"tools": p.tools} if p.tools else {}
        text = self.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False, **kw, **(p.chat_template_kwargs or {})
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        cap = p.truncate_prompt_tokens or self.max_prompt_tokens
        if not cap or len(ids) <= cap:
            return ids, None
        cut = {"history_dropped": 0, "tokens_cut": len(ids) - cap}
        if kw:
            return ids[-cap:], cut
        try:  # the project's prompt recipe (as `LocalHFPolicy` and SFT): oldest history dropped first
            from evoharness.harness.prompt import PromptTooLong, fit_prompt_ids
        except ImportError:
            return ids[-cap:], cut
        try:
            fitted, fit = fit_prompt_ids(self.tokenizer, msgs, cap, p.chat_template_kwargs)
            return fitted, (fit.as_dict() if fit.fitted else None)
        except PromptTooLong as e:
            raise BackendRejected(
                400, f"prompt does not fit truncate_prompt_tokens={cap}: {e}", "context_length_exceeded"
            ) from e

    def _run_batch(self, batch: list[GenParams]) -> list[GenOutput | BaseException]:
        import torch

        from evoharness.engines.grammar import GenRequest

        self.batches += 1
        out: list[GenOutput | BaseException | None] = [None] * len(batch)
        fits: dict[int, dict[str, int] | None] = {}
        groups: dict[tuple[float, float, int], list[tuple[int, GenRequest]]] = {}
        for i, p in enumerate(batch):
            try:
                unsupported_by_engine(p)
                ids, fit = self._prompt_ids(p)
                fits[i] = fit
                if not ids:
                    raise BackendRejected(400, "the prompt renders to no tokens")
                max_new = p.max_tokens or self.default_max_tokens
                if self.max_model_len and len(ids) + max_new > self.max_model_len:
                    raise BackendRejected(
                        400,
                        f"prompt ({len(ids)} tokens) + max_tokens ({max_new}) exceeds the "
                        f"model's context ({self.max_model_len})",
                        "context_length_exceeded",
                    )
                grammar = None
                if p.grammar is not None:
                    grammar = self.engine.grammar(list(p.grammar.commands), tuple(p.grammar.meta_verbs))
                seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(7), "little")
                groups.setdefault((p.temperature, p.top_p, max_new), []).append((i, GenRequest(ids, seed, grammar)))
            except BackendRejected as e:
                out[i] = e
            except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects these messages
                out[i] = BackendRejected(400, f"cannot render the request: {type(e).__name__}: {e}")
        version = self.policy_version
        old_threads = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            for (temp, top_p, max_new), members in groups.items():
                try:
                    results = self.engine.generate([g for _, g in members], max_new, temp, top_p)
                except Exception as e:  # noqa: BLE001 -- e.g. out of memory: fail this group, retry elsewhere
                    for i, _ in members:
                        out[i] = BackendError(f"engine failed: {type(e).__name__}: {e}")
                    continue
                for (i, g), r in zip(members, results):
                    out[i] = self._output(batch[i], g.prompt_ids, r, version, fits.get(i))
        finally:
            if self.num_threads:
                torch.set_num_threads(old_threads)
        return out  # type: ignore[return-value]

    def _output(self, p: GenParams, prompt_ids: list[int], r, version: int, fit: dict[str, int] | None) -> GenOutput:
        ids, lps, finish = list(r.token_ids), list(r.logprobs), r.finish_reason
        text_ids = ids[:-1] if ids and ids[-1] in self._hidden else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if p.stops:
            ids, lps, text, hit = self._apply_stops(ids, lps, text, p.stops)
            finish = "stop" if hit else finish
        content, calls = parse_tool_calls(text) if p.tools else (text, [])
        tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids] if p.want_token_text else None
        return GenOutput(
            prompt_ids,
            ids,
            lps,
            content,
            calls,
            "tool_calls" if calls else finish,
            version,
            tokens,
            fit,
            p.max_tokens or self.default_max_tokens,
        )

    def _apply_stops(self, ids, lps, text, stops):
        """vLLM semantics: cut the text before the first stop string; keep the tokens that produced it."""
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        if cut < 0:
            return ids, lps, text, False
        for k in range(1, len(ids) + 1):  # the shortest token prefix whose text reaches the stop string
            if any(s in self.tokenizer.decode(ids[:k], skip_special_tokens=False) for s in stops):
                return ids[:k], lps[:k], text[:cut], True
        return ids, lps, text[:cut], True

    async def load_weights(self, path: str, version: int | None = None) -> int:
        def load() -> int:
            load_state_dict_checked(self.engine.model, read_safetensors_dir(path))
            if self._version_source is None:
                self._version = self._version + 1 if version is None else int(version)
            return self.policy_version

        try:
            return await asyncio.get_running_loop().run_in_executor(self._exec, load)
        except (FileNotFoundError, KeyError, OSError) as e:
            raise BackendRejected(400, f"cannot load weights from {path}: {e}") from e

    def info(self) -> dict[str, Any]:
        return {**super().info(), "queued": self._queue.qsize() if self._queue else 0, "batches": self.batches}


# request fields the project's engine cannot honour, with the values that mean "off": anything else
# is refused rather than ignored (the client would believe it sampled from another distribution)
_ENGINE_OFF: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "top_k": (None, -1, 0),
    "min_p": (None, 0),
    "min_tokens": (None, 0),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "vllm_xargs": (None, {}),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "prompt_logprobs": (None, 0),
}


def unsupported_by_engine(p: GenParams) -> None:
    """Raise `BackendRejected` (400) for a setting the in-process engine would silently ignore."""
    for key, off in _ENGINE_OFF.items():
        if key in p.passthrough and p.passthrough[key] not in off:
            raise BackendRejected(
                400,
                f"`{key}` is not supported by the evoharness engine (use action_grammar to constrain the output)",
                "unsupported_parameter",
            )
    if p.top_logprobs:
        raise BackendRejected(
            400,
            "`top_logprobs` is not supported by the evoharness engine "
            "(logprobs: true gives each sampled token's log-prob)",
            "unsupported_parameter",
        )


def _template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message a plain chat template can render: text parts joined, None content as ''.

    Raises:
        ValueError: a non-text content part (image, audio, file): the model reads text only.
    """
    c = m.get("content")
    if isinstance(c, list):
        kinds = {part.get("type") if isinstance(part, dict) else type(part).__name__ for part in c} - {"text"}
        if kinds:
            raise ValueError(f"content parts of type {sorted(map(str, kinds))} are not supported (text only)")
        c = "".join(part.get("text", "") for part in c)
    return {**m, "content": c or ""}


# ---------------------------------------------------------------- HTTP backends


GRAMMAR_FORMATS = ("regex", "xargs")


class HTTPBackend(Backend):
    """Any OpenAI-compatible chat-completions server.

    Args:
        base_url: ``http://host:port/v1``.
        model: the backend's model name (default: the first of its ``/models``).
        api_key: sent as ``Bearer`` (local servers ignore it).
        timeout_s: per-call read timeout.
        capacity: routing weight (calls in flight at which it counts as full).
        grammar: how ``action_grammar`` reaches a non-evoharness server: ``regex``
            (vLLM ``structured_outputs.regex``, any vLLM/SGLang: the same strings, but not the
            same token paths or masks, so its log-probs do not follow the shared contract) or
            ``xargs`` (the flat ``vllm_xargs`` keys of `engines.vllm_grammar`, for a vLLM
            server started with ``--logits-processors
            evoharness.engines.vllm_grammar:ActionGrammarLogitsProcessor``: exact masks).

    On `start` it reads ``/models``; a model card with ``owned_by == "evoharness"``
    marks an evoharness worker, which takes ``action_grammar`` natively and reloads
    weights over HTTP.
    """

    kind = "http"

    def __init__(
        self,
        base_url: str,
        name: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        capacity: int = 64,
        grammar: str = "regex",
    ):
        if grammar not in GRAMMAR_FORMATS:
            raise ValueError(f"grammar must be one of {GRAMMAR_FORMATS}, got {grammar!r}")
        super().__init__(name or base_url, capacity)
        self.grammar = grammar
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.evoharness = False
        self._client: httpx.AsyncClient | None = None

    @property
    def root_url(self) -> str:
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )  # no Nagle stall between header and body
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(self.timeout_s, connect=10.0), transport=transport
        )
        try:
            r = await self._client.get(f"{self.base_url}/models")
            r.raise_for_status()
            cards = r.json().get("data", [])
        except (httpx.HTTPError, ValueError) as e:
            await self._client.aclose()
            raise BackendError(f"backend {self.base_url} did not answer /models: {e}") from e
        if not cards:
            raise BackendError(f"backend {self.base_url} serves no model")
        card = next((c for c in cards if c.get("id") == self.model), cards[0]) if self.model else cards[0]
        self.model = card["id"]
        self.evoharness = card.get("owned_by") == "evoharness"
        if self.evoharness and card.get("policy_version") is not None:
            self._version = int(card["policy_version"])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _body(self, p: GenParams) -> dict[str, Any]:
        body = {
            **p.passthrough,
            "model": self.model,
            "messages": p.messages,
            "stream": False,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "logprobs": True,
            "return_token_ids": True,
        }
        for key, val in (
            ("max_tokens", p.max_tokens),
            ("seed", p.seed),
            ("stop", p.stops or None),
            ("top_logprobs", p.top_logprobs or None),
            ("tools", p.tools),
            ("tool_choice", p.tool_choice),
            ("truncate_prompt_tokens", p.truncate_prompt_tokens),
            ("chat_template_kwargs", p.chat_template_kwargs),
        ):
            if val is not None:
                body[key] = val
        if p.grammar is not None:
            if self.evoharness:
                body["action_grammar"] = p.grammar.model_dump()
            elif self.grammar == "xargs":
                xargs = {
                    "action_grammar_commands": list(p.grammar.commands),
                    "action_grammar_meta_verbs": list(p.grammar.meta_verbs),
                }
                if p.max_tokens is not None:
                    xargs["action_grammar_max_new_tokens"] = p.max_tokens
                body["vllm_xargs"] = {**(body.get("vllm_xargs") or {}), **xargs}
            else:
                body["structured_outputs"] = {"regex": action_regex(p.grammar.commands, p.grammar.meta_verbs)}
        return body

    def _transport_failed(self) -> None:
        self.down_until = time.monotonic() + 1.0

    async def _generate(self, p: GenParams) -> GenOutput:
        if self._client is None:
            raise BackendError(f"backend {self.name} is not started")
        try:
            r = await self._client.post(f"{self.base_url}/chat/completions", json=self._body(p))
        except httpx.HTTPError as e:
            self._transport_failed()
            raise BackendError(f"{type(e).__name__}: {e}") from e
        if r.status_code >= 500 or r.status_code in (408, 429):
            raise BackendError(f"HTTP {r.status_code}: {r.text[:300]}")
        try:
            data = r.json()
        except ValueError as e:
            raise BackendError(f"HTTP {r.status_code}: not JSON: {r.text[:200]}") from e
        if r.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            msg = err.get("message") if isinstance(err, dict) else None
            raise BackendRejected(
                r.status_code, msg or str(data)[:500], err.get("code") if isinstance(err, dict) else None
            )
        try:
            choice = data["choices"][0]
            msg = choice["message"]
            lp = (choice.get("logprobs") or {}).get("content") or []
            version = data.get("policy_version")
            return GenOutput(
                prompt_ids=list(data.get("prompt_token_ids") or []),
                completion_ids=list(choice.get("token_ids") or []),
                logprobs=[float(x["logprob"]) for x in lp],
                content=msg.get("content"),
                tool_calls=list(msg.get("tool_calls") or []),
                finish_reason=choice.get("finish_reason") or "stop",
                policy_version=int(version) if version is not None else self._version,
                tokens=[x.get("token", "") for x in lp] if lp else None,
                prompt_fit=data.get("prompt_fit"),
                max_new_tokens=p.max_tokens,
                top_logprobs=[list(x.get("top_logprobs") or []) for x in lp] if p.top_logprobs else None,
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(f"malformed response from {self.name}: {type(e).__name__}: {e}") from e

    async def load_weights(self, path: str, version: int | None = None) -> int:
        if not self.evoharness:
            return await super().load_weights(path, version)
        try:
            r = await self._client.post(
                f"{self.root_url}/admin/backends/local/weights", json={"path": path, "version": version}
            )
        except httpx.HTTPError as e:
            raise BackendError(f"weight sync to {self.name} failed: {e}") from e
        if r.status_code != 200:
            raise BackendRejected(r.status_code, f"weight sync to {self.name} failed: {r.text[:300]}")
        self._version = int(r.json()["policy_version"])
        return self._version

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "url": self.base_url,
            "model": self.model,
            "evoharness": self.evoharness,
            "grammar": self.grammar,
        }


def wait_for_server(base_url: str, timeout_s: float, api_key: str | None = None) -> None:
    """Block until ``GET {base_url}/models`` answers 200 (a vLLM server takes ~35 s to come up on CPU).

    Raises:
        BackendError: not serving within `timeout_s` (the last failure named).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline, why = time.monotonic() + timeout_s, "no answer"
    while True:
        try:
            r = httpx.get(f"{base_url.rstrip('/')}/models", headers=headers, timeout=5.0)
            if r.status_code == 200:
                return
            why = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            why = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise BackendError(f"{base_url} did not answer /models within {timeout_s:.0f} s ({why})")
        time.sleep(1.0)


READY = "EVOHARNESS_WORKER_READY"


class WorkerBackend(HTTPBackend):
    """An evoharness worker process (`runtime.worker`) serving a model directory on loopback.

    The process is started by `start` (it prints ``EVOHARNESS_WORKER_READY <port>``
    once serving) and killed by `close`. If it dies, the backend turns ``dead``.
    """

    kind = "worker"

    def __init__(
        self,
        model_path: str | Path,
        name: str = "worker",
        args: list[str] | None = None,
        startup_timeout_s: float = 300.0,
        log_path: str | Path | None = None,
        capacity: int = 64,
    ):
        super().__init__("http://127.0.0.1:0/v1", name=name, capacity=capacity)
        self.model_path, self.args = str(model_path), list(args or [])
        self.startup_timeout_s, self.log_path = startup_timeout_s, log_path
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "evoharness.runtime.worker",
            "--model-path",
            self.model_path,
            "--port",
            "0",
            *self.args,
        ]
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 -- owned by the child
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        if log:
            log.close()
        port = await asyncio.get_running_loop().run_in_executor(None, self._wait_ready)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        await super().start()

    def _wait_ready(self) -> int:
        box: list[str] = []

        def read() -> None:
            for raw in self.proc.stdout:  # type: ignore[union-attr]
                line = raw.decode(errors="replace").strip()
                if line.startswith(READY):
                    box.append(line)
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self.startup_timeout_s)
        if not box:
            self.proc.kill()
            raise BackendError(
                f"worker {self.name} did not start within {self.startup_timeout_s:.0f} s (exit code {self.proc.poll()})"
            )
        return int(box[0].split()[1])

    def _transport_failed(self) -> None:
        super()._transport_failed()
        if self.proc is not None and self.proc.poll() is not None:
            self.state = "dead"

    async def close(self) -> None:
        await super().close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def info(self) -> dict[str, Any]:
        alive = self.proc is not None and self.proc.poll() is None
        return {**super().info(), "pid": self.pid, "alive": alive}
