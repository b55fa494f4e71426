"""Build a policy from its config (each worker process builds its own)."""

from __future__ import annotations

from evoharness.config.policy import PolicyConfig


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
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            concurrency=cfg.concurrency,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.completion_cap,
            chat_template_kwargs=cfg.template_kwargs,
            seed=cfg.seed,
            constrained=cfg.constrained,
            max_prompt_tokens=cfg.max_prompt_tokens,
            constraint_format=cfg.constraint_format,
        )
    if cfg.kind == "hf":
        from evoharness.policies.local import LocalHFPolicy

        if not cfg.model_path:
            raise ValueError("policy kind 'hf' needs model_path (a local Hugging Face model directory)")
        return LocalHFPolicy(
            model_path=cfg.model_path,
            device=cfg.device,
            dtype=cfg.dtype,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.completion_cap,
            chat_template_kwargs=cfg.template_kwargs,
            max_prompt_tokens=cfg.max_prompt_tokens,
            constrained=cfg.constrained,
            seed=cfg.seed,
            num_threads=cfg.num_threads,
            engine=cfg.decoder,
        )
    raise ValueError(f"unknown policy kind {cfg.kind!r}")
