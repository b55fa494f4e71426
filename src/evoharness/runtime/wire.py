"""The OpenAI chat-completions wire format as the gateway speaks it.

Requests are validated with pydantic (`ChatRequest`); unknown fields are kept
and forwarded to HTTP backends, as vLLM does. Extensions beyond the OpenAI API
(all optional, all vLLM-compatible where vLLM has an equivalent):

- ``return_token_ids: true`` (vLLM): the response carries top-level
  ``prompt_token_ids`` and per choice ``token_ids``;
- ``logprobs: true`` (OpenAI): ``choices[i].logprobs.content[j].logprob`` is the
  behaviour log-prob of completion token j;
- ``truncate_prompt_tokens: N`` (vLLM): prompt budget. vLLM keeps the last N tokens; the
  project's engine fits the prompt as `LocalHFPolicy` does (oldest history dropped first);
- ``action_grammar: {"commands": [...], "meta_verbs": [...]}`` (this project):
  constrain the completion to ``<think>…</think><action>A</action>`` with A an
  admissible command or ``verb text`` for a meta verb (`engines.grammar.ActionGrammar`).
  The gateway's own engine applies it exactly; for a vLLM/SGLang backend it is
  translated into vLLM's ``structured_outputs: {"regex": …}`` (`action_regex`),
  which accepts the same strings but not the same token paths (the engine's
  grammar also forces canonical tokenisation and reserves the action's budget);
- ``chat_template_kwargs: {...}`` (vLLM, SGLang): arguments of the chat template (Qwen3's
  ``enable_thinking``); the project's engine applies them, HTTP backends get them as sent;
- response field ``policy_version`` (this project): the weights' version that
  answered; ``prompt_fit`` (this project, only when the prompt was over budget):
  ``{"history_dropped", "tokens_cut"}``.

Errors follow OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.engines.grammar import ActionGrammarSpec


class Message(BaseModel):
    """One chat message (OpenAI format; extra keys are kept)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(BaseModel):
    """A ``POST /v1/chat/completions`` body (``n`` up to 128 choices: independent samples)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as vLLM: a bigger one failed the engine batch
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    user: str | None = None
    return_token_ids: bool = False
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    action_grammar: ActionGrammarSpec | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if isinstance(v, str):
            return [v]
        if v is not None and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    @property
    def stops(self) -> list[str]:
        return [s for s in (self.stop or []) if s]

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class GatewayError(Exception):
    """An error answered to the client in OpenAI's error shape (never recorded)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def new_call_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split Qwen-style ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks out of `text`.

    Returns (remaining content or None when empty, OpenAI ``tool_calls``). A block
    that is not valid JSON with a ``name`` stays in the content.
    """
    calls: list[dict[str, Any]] = []

    def take(m: re.Match) -> str:
        try:
            obj = json.loads(m.group(1))
            name = obj["name"]
        except (ValueError, KeyError, TypeError):
            return m.group(0)
        args = obj.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
        return ""

    rest = _TOOL_CALL.sub(take, text)
    if not calls:
        return text, []
    return (rest.strip() or None), calls


def choice_body(
    index: int,
    content: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    completion_ids: list[int],
    logprobs: list[float],
    req: ChatRequest,
    tokens: list[str] | None = None,
    top_logprobs: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """One ``choices[i]`` of a ``chat.completion``, with the extensions the request asked for."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = {"content": _logprob_content(completion_ids, logprobs, tokens, top_logprobs)}
    if req.return_token_ids:
        choice["token_ids"] = completion_ids
    return choice


def completion_body(
    call_id: str,
    model: str,
    choices: list[dict[str, Any]],
    prompt_ids: list[int],
    completion_tokens: int,
    policy_version: int | None,
    req: ChatRequest,
    prompt_fit: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` response body (`choice_body` choices); `completion_tokens` over all choices."""
    body: dict[str, Any] = {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
        "policy_version": policy_version,
    }
    if prompt_fit:
        body["prompt_fit"] = prompt_fit
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


def _logprob_content(
    ids: list[int], logprobs: list[float], tokens: list[str] | None, top: list[list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    toks = tokens or [f"token_id:{i}" for i in ids]
    top = top if top and len(top) == len(logprobs) else [[] for _ in logprobs]
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": alts}
        for t, lp, alts in zip(toks, logprobs, top)
    ]


def stream_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` events for a finished completion `body`: per choice a role
    chunk, one content (and tool-call) delta, a finish chunk; then a usage chunk when asked.

    The gateway streams a finished answer (see `gateway`): a retried call must
    reach the client as one normal answer, never as two half-streams.
    """

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        c = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        return {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "created": body["created"],
            "model": body["model"],
            "choices": [c],
        }

    out = []
    for choice in body["choices"]:
        k, msg = choice["index"], choice["message"]
        out.append(chunk(k, {"role": "assistant", "content": ""}))
        delta: dict[str, Any] = {}
        if msg.get("content"):
            delta["content"] = msg["content"]
        if msg.get("tool_calls"):
            delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(msg["tool_calls"])]
        extra: dict[str, Any] = {}
        if "token_ids" in choice:
            extra["token_ids"] = choice["token_ids"]
        if delta or extra:
            c = chunk(k, delta, **extra)
            if choice.get("logprobs"):
                c["choices"][0]["logprobs"] = choice["logprobs"]
            if "prompt_token_ids" in body:
                c["prompt_token_ids"] = body["prompt_token_ids"]
            out.append(c)
        out.append(chunk(k, {}, choice["finish_reason"]))
        out[-1]["policy_version"] = body.get("policy_version")
    if include_usage:
        out.append(
            {
                "id": body["id"],
                "object": "chat.completion.chunk",
                "created": body["created"],
                "model": body["model"],
                "choices": [],
                "usage": body["usage"],
            }
        )
    return out
