"""Any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API, the gateway).

Uses the official `openai` client: base URL and model from config, the key
from an environment variable, per-call timeout and bounded retries (the
client's own exponential backoff). A batch of requests is sent concurrently
from a thread pool. A failed call becomes a `Completion` with ``error`` set
(the turn then counts as an invalid action); it never raises.

Token-in/token-out, so served rollouts can be trained on: each request asks
for ``logprobs: true`` and (vLLM extension) ``return_token_ids: true``, and the
completion carries ``prompt_token_ids``, ``choices[0].token_ids`` and
``choices[0].logprobs.content[*].logprob`` where the server returns them (the
gateway and vLLM do), else None. Each request also carries

- ``seed``: `policies.local.request_seed` (policy seed, episode id, turn), the
  same derivation as the in-process policy, so the same seeds give the same
  samples through the gateway as in-process;
- the header ``X-Execution-Id: <episode id>`` (the gateway's execution key);
- with ``constrained``, the ``action_grammar`` extension (admissible commands
  and the harness's meta verbs; see `runtime.wire`); for a plain vLLM server
  (``constraint_format="vllm"``) the equivalent ``structured_outputs.regex``
  (same strings, but the regex's token masks: its log-probs are not the ones the
  trainer replays); for a vLLM server started with the project's logits processor
  (``constraint_format="vllm_xargs"``, `engines.vllm_grammar`) the grammar itself in
  ``vllm_xargs``: exact masks and contract log-probs;
- with ``max_prompt_tokens`` and the gateway format, ``truncate_prompt_tokens``: the gateway
  fits an over-long prompt the harness's way (history dropped first, system prompt and
  OBJECTIVE kept; `harness.prompt.fit_prompt_ids`). It is never sent in the ``vllm`` format:
  vLLM keeps the last N tokens, which cuts the system prompt and OBJECTIVE first; an
  over-long prompt there fails as a recorded error instead.

Extensions are optional: if the endpoint rejects the first request with a 400
(a hosted API that does not know ``return_token_ids``), the policy drops every
extension field, retries, and stays text-only from then on.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from evoharness.harness.base import META_VERBS
from evoharness.policies.base import Completion, PolicyRequest
from evoharness.policies.local import request_seed

# words in a 400 that mean "this endpoint does not take the extension fields"
_EXTENSION_HINTS = (
    "return_token_ids",
    "truncate_prompt_tokens",
    "action_grammar",
    "structured_outputs",
    "logprobs",
    "unrecognized",
    "unknown",
    "extra",
)


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
        temperature / top_p / max_tokens: sampling settings sent with every request.
        seed: base seed; each request sends ``request_seed(seed, episode_id, turn)``
            (None: no seed sent).
        constrained: restrict the action to admissible commands / meta-actions
            (needs a server that understands ``constraint_format``).
        constraint_format: ``gateway`` (the ``action_grammar`` extension; exact
            token-level grammar on the project's engine), ``vllm``
            (``structured_outputs.regex``) or ``vllm_xargs`` (the `engines.vllm_grammar`
            processor's ``vllm_xargs`` keys; exact grammar on vLLM).
        max_prompt_tokens: sent as ``truncate_prompt_tokens`` to the gateway only (None: not sent).
        meta_verbs: meta verbs allowed under `constrained` when a request has no harness.
        extensions: ask for token ids / log-probs and send the extension fields
            (turned off automatically if the endpoint rejects them).
        chat_template_kwargs: sent as ``chat_template_kwargs`` in every request body (vLLM and
            SGLang apply them to the chat template, e.g. Qwen3's ``enable_thinking``); kept when
            the extensions are turned off.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 3,
        concurrency: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        seed: int | None = 0,
        constrained: bool = False,
        constraint_format: Literal["gateway", "vllm", "vllm_xargs"] = "gateway",
        max_prompt_tokens: int | None = None,
        meta_verbs: tuple[str, ...] = META_VERBS,
        extensions: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import openai

        self.name = f"openai:{model}"
        self.model = model
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self.constrained, self.constraint_format = constrained, constraint_format
        self.max_prompt_tokens, self.meta_verbs = max_prompt_tokens, tuple(meta_verbs)
        self.extensions = extensions
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._ext_lock = threading.Lock()
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=os.environ.get(api_key_env) or "EMPTY",
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency))

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        return list(self._pool.map(self._one, requests))

    def constraint(self, req: PolicyRequest) -> dict[str, Any] | None:
        """The constraint this request is sampled under (the shared ``constraint`` record), or None."""
        if not self.constrained:
            return None
        verbs = getattr(req.harness, "meta_verbs", self.meta_verbs) if req.harness is not None else self.meta_verbs
        return {"commands": list(req.admissible_commands), "meta_verbs": list(verbs), "max_new_tokens": self.max_tokens}

    def _extra_body(self, constraint: dict[str, Any] | None) -> dict[str, Any]:
        extra: dict[str, Any] = {"return_token_ids": True}
        if self.chat_template_kwargs:
            extra["chat_template_kwargs"] = self.chat_template_kwargs
        if self.max_prompt_tokens and self.constraint_format == "gateway":
            extra["truncate_prompt_tokens"] = self.max_prompt_tokens
        if constraint is not None:
            if self.constraint_format == "vllm":
                from evoharness.engines.grammar import action_regex

                extra["structured_outputs"] = {"regex": action_regex(constraint["commands"], constraint["meta_verbs"])}
            elif self.constraint_format == "vllm_xargs":
                extra["vllm_xargs"] = {
                    "action_grammar_commands": constraint["commands"],
                    "action_grammar_meta_verbs": constraint["meta_verbs"],
                    "action_grammar_max_new_tokens": constraint["max_new_tokens"],
                }
            else:
                extra["action_grammar"] = {"commands": constraint["commands"], "meta_verbs": constraint["meta_verbs"]}
        return extra

    def _create(self, req: PolicyRequest, seed: int | None, constraint: dict[str, Any] | None):
        import openai

        kw: dict[str, Any] = dict(
            model=self.model,
            messages=req.messages,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
        )
        if seed is not None:
            kw["seed"] = seed
        if not self.extensions:
            if self.chat_template_kwargs:
                kw["extra_body"] = {"chat_template_kwargs": self.chat_template_kwargs}
            return self.client.chat.completions.create(**kw)
        try:
            return self.client.chat.completions.create(
                **kw,
                logprobs=True,
                extra_body=self._extra_body(constraint),
                extra_headers={"X-Execution-Id": req.episode_id},
            )
        except openai.BadRequestError as e:
            if not any(k in str(e).lower() for k in _EXTENSION_HINTS):
                raise  # a genuinely bad request, not an endpoint without the extensions
            with self._ext_lock:  # an endpoint without the extensions: go text-only for good
                self.extensions = False
            return self.client.chat.completions.create(**kw)

    def _one(self, req: PolicyRequest) -> Completion:
        seed = request_seed(self.seed, req.episode_id, req.turn) if self.seed is not None else None
        constraint = self.constraint(req)
        try:
            resp = self._create(req, seed, constraint)
        except Exception as e:  # network, HTTP status, timeout: recorded, never raised
            return Completion(text="", finish_reason="error", error=f"{type(e).__name__}: {e}"[:500])
        if not resp.choices:
            return Completion(text="", finish_reason="error", error="response has no choices")
        choice = resp.choices[0]
        usage = resp.usage
        prompt_ids = _extra(resp, "prompt_token_ids")
        completion_ids = _extra(choice, "token_ids")
        lp = choice.logprobs.content if choice.logprobs is not None and choice.logprobs.content else None
        logprobs = [float(x.logprob) for x in lp] if lp else None
        if completion_ids is not None and logprobs is not None and len(logprobs) != len(completion_ids):
            logprobs = None  # not one per token: unusable as behaviour log-probs
        version = _extra(resp, "policy_version")
        extra: dict[str, Any] = {"seed": seed} if seed is not None else {}
        if constraint is not None:
            extra["constraint"] = constraint
        if fit := _extra(resp, "prompt_fit"):  # the gateway shortened the prompt to max_prompt_tokens
            extra["prompt_fit"] = fit
        return Completion(
            text=choice.message.content or "",
            prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
            completion_token_ids=list(completion_ids) if completion_ids is not None else None,
            logprobs=logprobs,
            policy_version=int(version) if version is not None else None,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason or "stop",
            extra=extra,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _extra(obj: Any, key: str) -> Any:
    """A non-OpenAI field of a response object (kept by the client in ``model_extra``)."""
    val = getattr(obj, key, None)
    if val is None:
        val = (getattr(obj, "model_extra", None) or {}).get(key)
    return val
