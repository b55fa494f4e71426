"""Who answers the repository agent: tool-calling chat policies.

The ALFWorld seam (`policies.base.Policy`) exchanges text; a repository agent
exchanges OpenAI chat messages with tool calls, so its policies answer one
`complete` call with a `ChatReply` (content, tool calls, usage). Three kinds:

- `ReferencePolicy`: scripted replay of the task's reference solution through
  the tools (``write_file`` per file, a ``run_shell`` check, ``finish``); a
  privileged upper bound and the end-to-end check of tools + scorer.
- `EmptyPolicy`: calls ``finish`` at once (the lower bound: placeholder 0).
- `OpenAIChatPolicy`: any OpenAI-compatible endpoint through the official
  client - vLLM, a hosted API, or the project's gateway (just a base URL).
  Every call carries ``X-Execution-Id`` and ``X-Agent-Role`` (``main`` /
  ``summary``) headers so a gateway can build per-execution trajectory trees.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from evoharness.envs.repo.task import RepoTask
from evoharness.models.tokenizer import estimate_tokens


@dataclass
class ToolCall:
    """One function call requested by the model (``arguments`` is the raw JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass
class ChatReply:
    """A policy's answer to one chat call.

    Attributes:
        content: the assistant text (may be empty when it only calls tools).
        tool_calls: requested calls, in order.
        prompt_tokens / completion_tokens: usage (from the endpoint, or estimated).
        finish_reason: ``stop``, ``tool_calls``, ``length`` or ``error``.
        error: set when the call failed (then nothing else is meaningful).
        context_overflow: the endpoint rejected the prompt as longer than the model's window.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    error: str | None = None
    context_overflow: bool = False

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation (OpenAI format)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return msg


class ChatPolicy(Protocol):
    name: str

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        execution_id: str,
        role: str,
        task: RepoTask,
    ) -> ChatReply:
        """Answer one chat call. Must not raise: failures come back as ``error``."""
        ...

    def close(self) -> None: ...


def messages_tokens(messages: list[dict[str, Any]]) -> int:
    """Rough token count of chat messages (~4 characters per token, 4 per message)."""
    n = 0
    for m in messages:
        n += 4 + estimate_tokens(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            n += estimate_tokens(c["function"]["name"] + c["function"]["arguments"])
    return n


def _scripted(calls: list[tuple[str, dict[str, Any]]], messages: list[dict[str, Any]], step: int) -> ChatReply:
    name, args = calls[min(step, len(calls) - 1)]
    text = json.dumps(args)
    return ChatReply(
        tool_calls=[ToolCall(f"call_{step}", name, text)],
        prompt_tokens=messages_tokens(messages),
        completion_tokens=estimate_tokens(name + text),
        finish_reason="tool_calls",
    )


class ReferencePolicy:
    """Writes the reference solution through the tools, checks it compiles, finishes."""

    name = "reference"

    def complete(self, messages, tools, *, execution_id, role, task):
        if role != "main":
            return ChatReply(
                content="Wrote the reference solution file by file.",
                prompt_tokens=messages_tokens(messages),
                completion_tokens=10,
            )
        calls = [("write_file", {"path": p, "content": text}) for p, text in task.reference_files().items()]
        if calls:
            calls.append(("run_shell", {"command": "python -m compileall -q . && ls -R"}))
        calls.append(("finish", {"summary": "reference solution written"}))
        step = sum(1 for m in messages if m["role"] == "assistant")
        return _scripted(calls, messages, step)

    def close(self) -> None:
        pass


class EmptyPolicy:
    """Finishes before doing anything."""

    name = "empty"

    def complete(self, messages, tools, *, execution_id, role, task):
        return _scripted([("finish", {"summary": ""})], messages, 0)

    def close(self) -> None:
        pass


_OVERFLOW_HINTS = ("context length", "context_length", "maximum context", "too many tokens", "prompt is too long")


class OpenAIChatPolicy:
    """Any OpenAI-compatible chat-completions endpoint with tool calling.

    Args:
        base_url: e.g. ``http://localhost:8000/v1`` (a vLLM server or the gateway).
        model: the served model name.
        api_key_env: environment variable holding the key (placeholder when unset).
        timeout_s / max_retries: per-call timeout and the client's retries
            (connection errors, 408/409/429/5xx, exponential backoff).
        temperature / top_p / max_tokens / seed: sampling.
        tito: also ask for token ids and log-probs (vLLM's ``return_token_ids``;
            the gateway records them itself either way).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 600.0,
        max_retries: int = 3,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        seed: int | None = 0,
        tito: bool = False,
    ) -> None:
        import openai

        self.name = f"openai:{model}"
        self.model = model
        self.sampling: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        if seed is not None:
            self.sampling["seed"] = seed
        self.extra_body = {"logprobs": True, "return_token_ids": True} if tito else None
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=os.environ.get(api_key_env) or "EMPTY",
            timeout=timeout_s,
            max_retries=max_retries,
        )

    def complete(self, messages, tools, *, execution_id, role, task):
        import openai

        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=messages,
            **self.sampling,
            extra_headers={"X-Execution-Id": execution_id, "X-Agent-Role": role},
        )
        if tools:
            kwargs["tools"] = tools
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except openai.BadRequestError as e:
            msg = str(e)
            return ChatReply(
                finish_reason="error",
                error=f"BadRequestError: {msg}"[:500],
                context_overflow=any(h in msg.lower() for h in _OVERFLOW_HINTS),
            )
        except Exception as e:  # network, HTTP status, timeout: recorded, never raised
            return ChatReply(finish_reason="error", error=f"{type(e).__name__}: {e}"[:500])
        if not resp.choices:
            return ChatReply(finish_reason="error", error="response has no choices")
        choice = resp.choices[0]
        calls = [
            ToolCall(c.id or f"call_{i}", c.function.name, c.function.arguments or "")
            for i, c in enumerate(choice.message.tool_calls or [])
            if getattr(c, "function", None)
        ]
        usage = resp.usage
        return ChatReply(
            content=choice.message.content or "",
            tool_calls=calls,
            prompt_tokens=usage.prompt_tokens if usage else messages_tokens(messages),
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason or "stop",
        )

    def close(self) -> None:
        self.client.close()


def make_chat_policy(kind: str, **kw: Any) -> ChatPolicy:
    """``reference`` | ``empty`` | ``openai`` (needs ``base_url`` and ``model``).

    Raises:
        ValueError: unknown kind or a missing field.
    """
    if kind == "reference":
        return ReferencePolicy()
    if kind == "empty":
        return EmptyPolicy()
    if kind == "openai":
        if not kw.get("base_url") or not kw.get("model"):
            raise ValueError("policy kind 'openai' needs base_url and model")
        return OpenAIChatPolicy(**kw)
    raise ValueError(f"unknown repo policy kind {kind!r} (reference | empty | openai)")
