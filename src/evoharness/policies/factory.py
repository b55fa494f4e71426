"""Build a policy from its config (each worker process builds its own)."""

from __future__ import annotations

from typing import Literal

from evoharness.config import Strict
from evoharness.harness.prompt import DEFAULT_MAX_PROMPT_TOKENS

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
    concurrency: int = 16
    constraint_format: Literal["gateway", "vllm", "vllm_xargs"] = "gateway"  # how `constrained` is sent (policies.openai_policy)
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


def make_policy(cfg: PolicyConfig):
    """Instantiate the policy `cfg` describes.

    Raises:
        ValueError: a required field is missing (e.g. ``base_url`` for openai).
    """
    if cfg.kind == "expert":
        from evoharness.policies.scripted import ExpertPolicy

        return ExpertPolicy()
    if cfg.kind == "noisy_expert":
        from evoharness.policies.scripted import NoisyExpertPolicy

        return NoisyExpertPolicy(epsilon=cfg.epsilon, seed=cfg.seed)
    if cfg.kind == "random":
        from evoharness.policies.scripted import RandomPolicy

        return RandomPolicy(seed=cfg.seed)
    if cfg.kind == "teacher":
        from evoharness.policies.teacher import TeacherPolicy

        return TeacherPolicy(seed=cfg.seed)
    if cfg.kind == "openai":
        from evoharness.policies.openai_policy import OpenAIPolicy

        if not cfg.base_url or not cfg.model:
            raise ValueError("policy kind 'openai' needs base_url and model")
        return OpenAIPolicy(
            base_url=cfg.base_url, model=cfg.model, api_key_env=cfg.api_key_env, timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries, concurrency=cfg.concurrency, temperature=cfg.temperature,
            top_p=cfg.top_p, max_tokens=cfg.max_tokens, seed=cfg.seed, constrained=cfg.constrained,
            max_prompt_tokens=cfg.max_prompt_tokens, constraint_format=cfg.constraint_format,
        )
    if cfg.kind == "hf":
        from evoharness.policies.local import LocalHFPolicy

        if not cfg.model_path:
            raise ValueError("policy kind 'hf' needs model_path (a local Hugging Face model directory)")
        return LocalHFPolicy(
            model_path=cfg.model_path, device=cfg.device, dtype=cfg.dtype, temperature=cfg.temperature,
            top_p=cfg.top_p, max_new_tokens=cfg.max_tokens, max_prompt_tokens=cfg.max_prompt_tokens,
            constrained=cfg.constrained, seed=cfg.seed, num_threads=cfg.num_threads, engine=cfg.decoder,
        )
    raise ValueError(f"unknown policy kind {cfg.kind!r}")
