"""Evaluations: the ALFWorld panel and the repository tasks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evoharness.config.base import Strict
from evoharness.config.env import TASK_TYPES, AgentConfig, EnvConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.policy import PolicyConfig

PROTOCOLS = {"panel": 50, "evoharness": 70, "random128": 50}


def protocol_step_cap(protocol: str) -> int:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[protocol]


class EvalConfig(Strict):
    split: str = "valid_seen"
    protocol: Literal["panel", "evoharness", "random128"] = "panel"
    max_steps: int | None = None  # None: the protocol's cap (50, or 70 for evoharness)
    seed: int = 0
    workers: int = 1
    batch_size: int = 8
    limit: int | None = None  # first N games of the panel (smoke runs)
    games: list[str] | None = None  # only these task ids (a development set), in panel order
    # K > 0: end an episode once the same (prompt, completion) pair has occurred K times
    # (stop_reason "hopeless", a failure; `run_episodes`): a greedy policy cannot leave that loop
    stop_repeats: int = 0
    task_types: list[str] = list(TASK_TYPES)
    out_dir: str = "runs/eval"
    resume: bool = True
    env: EnvConfig = EnvConfig()
    harness: HarnessConfig = HarnessConfig()
    policy: PolicyConfig = PolicyConfig()

    @property
    def step_cap(self) -> int:
        return self.max_steps or protocol_step_cap(self.protocol)


class RepoPolicyConfig(Strict):
    """Who plays: ``reference`` (scripted replay of the solution), ``empty``, or
    ``openai`` (any OpenAI-compatible endpoint, the gateway included)."""

    kind: Literal["reference", "empty", "openai"] = "reference"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 600.0
    max_retries: int = 3
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 4096
    seed: int | None = 0
    tito: bool = False


class RepoEvalConfig(Strict):
    tasks: str = "pack"  # "pack", a task directory, or a directory of tasks
    task_ids: list[str] = []  # only these (default: all)
    limit: int | None = Field(None, ge=1)
    workers: int = Field(2, ge=1)
    out_dir: str = "runs/eval_repo"
    resume: bool = True
    agent: AgentConfig = AgentConfig(keep_workspace=True)  # workspaces/<task_id>/workspace, for reading
    policy: RepoPolicyConfig = RepoPolicyConfig()
