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

    kind: PolicyKind = "expert"
    seed: int = 0
    epsilon: float = 0.2
    # openai-compatible endpoint
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 3
    # this many errored calls in a row stop an evaluation (`policies.guard.ErrorGuard`): a dead server
    # fails fast instead of scoring every turn as an invalid action; 0: never stop
    max_consecutive_errors: int = Field(8, ge=0)
    concurrency: int = 16
    constraint_format: Literal["gateway", "vllm", "vllm_xargs"] = (
        "gateway"  # how `constrained` is sent (policies.openai_policy)
    )
    # sampling (openai and hf)
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    # local hf model
    model_path: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS  # shared with sft and rl (harness.prompt)
    constrained: bool = False
    num_threads: int | None = None  # torch CPU threads while decoding (1 suits tiny models)
    decoder: Literal["auto", "static", "hf"] = "auto"  # in-process engine (evoharness.engines.make_engine)
