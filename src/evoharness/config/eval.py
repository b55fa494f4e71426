"""Evaluations: the ALFWorld panel and the repository tasks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evoharness.config.base import Strict, Trackers
from evoharness.config.env import TASK_TYPES, AgentConfig, EnvConfig, RepoTasksConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.policy import PolicyConfig

PROTOCOLS = {"panel": 50, "evoharness": 70, "random128": 50}


def protocol_step_cap(protocol: str) -> int:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[protocol]


class EvalConfig(Strict):
    split: str = "valid_seen"  # ALFWorld split played: train | valid_seen | valid_unseen
    # which episodes (eval/panel.py): panel (every game once, step cap 50), evoharness (the same, cap 70),
    # random128 (128 games drawn with replacement using `seed`, cap 50)
    protocol: Literal["panel", "evoharness", "random128"] = "panel"
    max_steps: int | None = None  # step cap per episode; None: the protocol's cap (50, or 70 for evoharness)
    seed: int = 0  # the episodes' seed: random128's draw, recorded in each trajectory (the policy's: policy.seed)
    workers: int = 1  # evaluation processes, each with its own policy (1: in this process)
    batch_size: int = 8  # episodes a worker plays in lock-step (a model policy answers their turns in one batch)
    limit: int | None = None  # N episodes of the panel, round-robin across task types (smoke runs); None: all
    games: list[str] | None = None  # only these task ids (a development set), in panel order
    # K > 0: end an episode once the same (prompt, completion) pair has occurred K times
    # (stop_reason "hopeless", a failure; `run_episodes`): a greedy policy cannot leave that loop
    stop_repeats: int = 0
    task_types: list[str] = list(TASK_TYPES)  # play only games of these ALFWorld task types
    out_dir: str = "runs/eval"  # output directory: config.json, episodes.jsonl, summary.json, report.md, success.png
    # keep out_dir's finished episodes and play the rest (another evaluation's out_dir is refused); false: replay all
    resume: bool = True
    # experiment trackers mirroring the metrics (tensorboard, wandb, mlflow; evoharness.tracking); []: JSONL only
    tracking: Trackers = []
    env: EnvConfig = EnvConfig()  # game data, engine and wording
    harness: HarnessConfig = HarnessConfig()  # the prompt harness
    policy: PolicyConfig = PolicyConfig()  # who plays

    @property
    def step_cap(self) -> int:
        return self.max_steps or protocol_step_cap(self.protocol)


class RepoPolicyConfig(Strict):
    """Who plays: ``reference`` (scripted replay of the solution), ``empty``, or
    ``openai`` (any OpenAI-compatible endpoint, the gateway included)."""

    # reference: writes the reference solution; empty: finishes at once; openai: the endpoint below
    kind: Literal["reference", "empty", "openai"] = "reference"
    base_url: str | None = None  # openai: the endpoint, e.g. http://localhost:8000/v1 (a vLLM server or the gateway)
    model: str | None = None  # openai: the served model name
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the API key (a placeholder is sent when unset)
    timeout_s: float = 600.0  # openai: per-call timeout, seconds
    max_retries: int = 3  # openai: client retries of a call (connection errors, 408/409/429/5xx; exponential backoff)
    temperature: float = 0.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling mass (1.0: off)
    max_tokens: int = 4096  # completion tokens per model call
    seed: int | None = 0  # sampling seed sent with every call; None: none sent
    # also ask for token ids and log-probs (vLLM's return_token_ids; the gateway records them anyway)
    tito: bool = False


class RepoEvalConfig(Strict):
    """``evoharness eval --env repo`` settings (docs/repo_env.md)."""

    # the tasks and the agent's budgets; keep_workspace: each task's final workspace stays in
    # out_dir/workspaces/<task_id>/workspace, for reading
    repo: RepoTasksConfig = Field(default_factory=lambda: RepoTasksConfig(agent=AgentConfig(keep_workspace=True)))
    limit: int | None = Field(None, ge=1)  # only the first N tasks (after repo.task_ids); None: all
    workers: int = Field(2, ge=1)  # executions run at once (threads)
    # output directory: config.json, episodes.jsonl, trace.jsonl, workspaces/, report.md
    out_dir: str = "runs/eval_repo"
    resume: bool = True  # keep out_dir's finished tasks and run the rest; false: start afresh
    policy: RepoPolicyConfig = RepoPolicyConfig()  # who plays
