"""EvoHarness: harness policy learning (EvoHarness-RL) on an elastic long-horizon RL runtime (QwenGyre).

The Python API, importable from the top level (each name loads its module on first use, so
``import evoharness`` stays cheap)::

    from evoharness import make_env, discover_games, BPEHarness, ExperienceStore, run_episodes, EpisodeSpec

    tasks = discover_games("valid_seen")[:4]
    trajs = run_episodes(
        [EpisodeSpec(t, f"{t.task_id}#0") for t in tasks],
        make_env=lambda task: make_env(task, engine="fast"),
        make_harness=lambda: BPEHarness(ExperienceStore()),
        policy=my_policy,  # anything with .name and .act(list[PolicyRequest]) -> list[Completion]
        max_steps=50,
    )

docs/api.md walks through it (a custom policy, evaluation, SFT and RL from Python).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_API = {
    # environments and games
    "make_env": "evoharness.envs.alfworld",
    "discover_games": "evoharness.envs.alfworld.games",
    "TaskSpec": "evoharness.envs.base",
    # harnesses
    "BPEHarness": "evoharness.harness.bpe",
    "ExperienceStore": "evoharness.harness.bpe",
    "ReActHarness": "evoharness.harness.react",
    "make_harness": "evoharness.harness.factory",
    # policies
    "Completion": "evoharness.policies.base",
    "PolicyRequest": "evoharness.policies.base",
    "OpenAIPolicy": "evoharness.policies.openai_policy",
    "LocalHFPolicy": "evoharness.policies.local",
    "make_policy": "evoharness.policies.factory",
    # episodes and records
    "EpisodeSpec": "evoharness.rollout.episode",
    "run_episodes": "evoharness.rollout.episode",
    "Trajectory": "evoharness.rollout.records",
    # evaluation and training
    "EvalConfig": "evoharness.config.eval",
    "evaluate": "evoharness.eval.evaluate",
    "SFTConfig": "evoharness.config.sft",
    "train_sft": "evoharness.train.sft",
    "RLConfig": "evoharness.config.rl",
    "train_rl": "evoharness.recipes.rl",
    "load_config": "evoharness.config.base",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:  # PEP 562: load a public name's module on first use
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'evoharness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
