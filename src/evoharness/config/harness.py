"""Harness and prompt settings."""

from __future__ import annotations

from typing import Literal

from evoharness.config.base import Strict

DEFAULT_MAX_PROMPT_TOKENS = 2048
"""The prompt budget (tokens, generation prompt included) of every stage that does not set
one: ``SFTConfig``, ``RLConfig`` and ``PolicyConfig`` (eval's ``hf`` / ``openai`` policies)
all default to it, so standalone ``sft``, ``rl`` and ``eval`` fit prompts alike (issue 10,
fault 4). A run that changes it sets the same value for each stage it runs (the main
job's ``RunConfig`` checks this; configs/rl_qwen3_8b_fsdp_8gpu.toml uses the paper's 12,288)."""


class HarnessConfig(Strict):
    """Which harness renders the prompts.

    Attributes:
        kind: ``react`` (history window, admissible commands) or ``bpe``
            (EvoHarness-RL Belief / Progress / Experience with meta-actions).
        history_window: previous (action, feedback) pairs shown each turn.
        experience_path: a saved experience store (JSON) for ``bpe``; None
            starts from the built-in seed entries. Evaluation never writes it.
        system_prompt: ``full`` or ``compact`` (bpe only; one line for small
            from-scratch models whose training cost is dominated by prompt tokens).
    """

    # react (history window, admissible commands) or bpe (Belief / Progress / Experience + meta-actions)
    kind: Literal["react", "bpe"] = "bpe"
    # previous (action, feedback) pairs shown each turn; None: the harness's own default (react 8, bpe 4)
    history_window: int | None = None
    # bpe: a saved experience store (JSON) to start from; None: the built-in seed entries
    experience_path: str | None = None
    # bpe: full, or compact (one line, for small from-scratch models)
    system_prompt: Literal["full", "compact"] = "full"
