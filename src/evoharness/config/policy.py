"""Who plays: the policy of an evaluation or a collection."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evoharness.config.base import Strict
from evoharness.config.harness import DEFAULT_MAX_PROMPT_TOKENS

PolicyKind = Literal["expert", "noisy_expert", "random", "teacher", "openai", "hf"]


class PolicyConfig(Strict):
    """Who plays.

    ``expert`` is the privileged PDDL planner (an upper bound, not a teacher);
    ``teacher`` the non-privileged scripted BPE teacher; ``openai`` any
    OpenAI-compatible chat-completions endpoint; ``hf`` a local Hugging Face
    model directory served by the project's engine.
    """

    kind: PolicyKind = "expert"  # expert (PDDL planner), noisy_expert, random, teacher (scripted BPE), openai, hf
    seed: int = 0  # scripted policies' RNG; openai / hf: each request's seed from (seed, episode, turn)
    epsilon: float = 0.2  # noisy_expert: probability of a random admissible command instead of the expert's
    # openai-compatible endpoint:
    base_url: str | None = None  # its base URL, e.g. http://localhost:8000/v1 (policy openai)
    model: str | None = None  # openai: the served model name
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the API key (a placeholder is sent when unset)
    timeout_s: float = 120.0  # openai: per-request timeout, seconds
    max_retries: int = 3  # openai: client retries of a request (connection errors, 408/409/429/5xx)
    # this many errored calls in a row stop an evaluation (`policies.guard.ErrorGuard`): a dead server
    # fails fast instead of scoring every turn as an invalid action; 0: never stop
    max_consecutive_errors: int = Field(8, ge=0)
    concurrency: int = 16  # openai: requests in flight at once (per worker process)
    constraint_format: Literal["gateway", "vllm", "vllm_xargs"] = (
        "gateway"  # how `constrained` is sent (policies.openai_policy)
    )
    # sampling (openai and hf):
    temperature: float = 0.0  # temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling mass (1.0: off)
    # completion tokens per turn; None: 256, or 4096 with thinking = true (a thinking model's reasoning comes
    # before its <action>, and a cut completion has no action)
    max_tokens: int | None = Field(None, ge=1)
    # Qwen3-style reasoning switch, sent as chat_template_kwargs.enable_thinking (openai: in the request body,
    # which vLLM and SGLang apply; hf: to the tokenizer's chat template); None: the template's own default
    thinking: bool | None = None
    # further chat-template arguments (openai: chat_template_kwargs in the request body; hf: the tokenizer's
    # apply_chat_template), e.g. --set 'policy.chat_template_kwargs={ reasoning_effort = "low" }'
    chat_template_kwargs: dict[str, str | int | float | bool] = {}
    # local hf model:
    model_path: str | None = None  # its directory (config, weights, tokenizer; policy hf)
    device: str = "cpu"  # hf: torch device (cpu, cuda, cuda:1, ...)
    dtype: str = "auto"  # hf: weights dtype: auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16
    # prompt budget, tokens (oldest history dropped to fit; harness.prompt); shared with sft and rl
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    constrained: bool = False  # decode only admissible commands / meta-actions (openai: as constraint_format says)
    num_threads: int | None = None  # torch CPU threads while decoding (1 suits tiny models)
    # hf: the in-process engine (evoharness.engines): "static" (pre-allocated KV cache, Qwen3 family), "hf" (any
    # HF causal LM), "auto" (static where the model is supported, else hf)
    decoder: Literal["auto", "static", "hf"] = "auto"

    @property
    def completion_cap(self) -> int:
        """Completion tokens per turn: `max_tokens`, else 256 (4096 under ``thinking = true``)."""
        return self.max_tokens or (4096 if self.thinking else 256)

    @property
    def template_kwargs(self) -> dict[str, str | int | float | bool]:
        """Chat-template arguments of every request: `chat_template_kwargs` plus ``enable_thinking``."""
        kw = dict(self.chat_template_kwargs)
        if self.thinking is not None:
            kw["enable_thinking"] = self.thinking
        return kw
