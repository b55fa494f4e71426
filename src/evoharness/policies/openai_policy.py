"""Any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API).

Uses the official `openai` client: base URL and model from config, the key
from an environment variable, per-call timeout and bounded retries (the
client's own exponential backoff). A batch of requests is sent concurrently
from a thread pool. A failed call becomes a `Completion` with ``error`` set
(the turn then counts as an invalid action); it never raises.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from evoharness.policies.base import Completion, PolicyRequest


class OpenAIPolicy:
    """Chat-completions policy.

    Args:
        base_url: e.g. ``http://localhost:8000/v1``.
        model: the served model name.
        api_key_env: environment variable holding the key (a placeholder is
            sent when it is unset, as local servers ignore it).
        timeout_s: per-request timeout in seconds.
        max_retries: retries on connection errors, 408/409/429/5xx.
        concurrency: requests in flight at once.
        seed: sent as the request ``seed`` (servers that support it use it).
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0,
                 max_retries: int = 3, concurrency: int = 16, temperature: float = 0.0, top_p: float = 1.0,
                 max_tokens: int = 256, seed: int | None = 0) -> None:
        import openai

        self.name = f"openai:{model}"
        self.model = model
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self.client = openai.OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env) or "EMPTY",
                                    timeout=timeout_s, max_retries=max_retries)
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency))

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        return list(self._pool.map(self._one, requests))

    def _one(self, req: PolicyRequest) -> Completion:
        try:
            resp = self.client.chat.completions.create(
                model=self.model, messages=req.messages, temperature=self.temperature, top_p=self.top_p,
                max_tokens=self.max_tokens, seed=self.seed,
            )
        except Exception as e:  # network, HTTP status, timeout: recorded, never raised
            return Completion(text="", finish_reason="error", error=f"{type(e).__name__}: {e}"[:500])
        if not resp.choices:
            return Completion(text="", finish_reason="error", error="response has no choices")
        choice = resp.choices[0]
        usage = resp.usage
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason or "stop",
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False)
