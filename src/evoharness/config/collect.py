"""Data for stage 1: teacher traces (`evoharness collect`) and distilled agent logs (`evoharness distill`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evoharness.config.base import Strict
from evoharness.config.env import EnvConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.policy import PolicyConfig


class CollectConfig(Strict):
    """``evoharness collect`` settings: who plays which games, and where the traces go."""

    split: str = "train"  # ALFWorld split played
    per_type: int = Field(0, ge=0)  # the first N games of each task type; 0: every game of the split
    samples: int = Field(1, ge=1)  # episodes per game (episode ids <task_id>#k)
    max_steps: int = Field(50, ge=1)  # step cap per episode (meta-actions count)
    batch_size: int = Field(8, ge=1)  # episodes played in lock-step (the experience store is consolidated after each)
    keep: Literal["successful", "all"] = "successful"  # which episodes are written: won ones, or all
    out: str = "runs/traces/traces.jsonl"  # trajectory JSONL (appended to: a rerun resumes)
    # also write SFT examples ({messages, completion} per line) here, and their harness recipe beside them
    # (<sft>.recipe.json), which `evoharness sft` saves with the model it trains
    sft: str | None = None
    # experience store JSON, loaded on resume and saved after every batch; None: a fresh store, not saved
    experience: str | None = None
    env: EnvConfig = Field(default_factory=EnvConfig)  # game data, engine and wording
    harness: HarnessConfig = Field(default_factory=HarnessConfig)  # the prompt harness (bpe only)
    policy: PolicyConfig = Field(default_factory=lambda: PolicyConfig(kind="teacher"))  # who plays

    @model_validator(mode="after")
    def _bpe_only(self) -> CollectConfig:
        if self.harness.kind != "bpe":
            raise ValueError("collect writes BPE-harness traces: harness.kind must be 'bpe'")
        return self


class DistillConfig(Strict):
    """``evoharness distill`` settings (docs/distill.md): which logs, how they are replayed, the outputs."""

    logs: str = ""  # trajectory JSONL or ReAct-format JSONL of any agent (docs/distill.md)
    out: str = "runs/distill/traj.jsonl"  # distilled trajectories (JSONL, written atomically)
    sft: str | None = None  # also write next-action SFT examples here (and <sft>.recipe.json beside them)
    max_steps: int = Field(50, ge=1)  # step cap of the replayed episodes
    env: EnvConfig = Field(default_factory=EnvConfig)  # game data (where the logged games are found) and engine
    harness: HarnessConfig = Field(default_factory=HarnessConfig)  # the prompt harness of the examples (bpe only)

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        if not self.logs:
            raise ValueError("logs: give the agent logs to distil (evoharness distill LOGS, or logs = ... in the file)")
        if self.harness.kind != "bpe":
            raise ValueError("distill writes BPE-harness examples: harness.kind must be 'bpe'")
        return self
