"""Environments: ALFWorld games and the repository-building tasks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evoharness.config.base import Strict

# ALFWorld's six task types, in the papers' column order (Pick/Look/Clean/Heat/Cool/Pick2).
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


class EnvConfig(Strict):
    """Where games come from and which engine plays them."""

    data_path: str | None = None  # None/"bundled": the pack inside the project; "env": $ALFWORLD_DATA
    engine: Literal["textworld", "fast"] = "fast"  # the project's byte-identical engine; "textworld" = stock
    wording: Literal["native", "put", "move"] = "native"
    timeout_s: float = 120.0


class AgentConfig(Strict):
    """The scaffold's budgets and context management (None: the task's own budget)."""

    context_window: int = Field(32_768, ge=1024)  # the model's window, tokens
    compact_at: float = Field(0.85, gt=0.1, le=1.0)  # compact when the next prompt would pass this fraction
    max_tool_calls: int | None = Field(None, ge=1)
    wall_time_s: float | None = Field(None, gt=0)
    max_model_calls: int = Field(2000, ge=1)
    max_compactions: int = Field(50, ge=0)
    max_no_tool_replies: int = Field(3, ge=1)
    output_chars: int = Field(8000, ge=200)  # tool result shown to the model, characters
    shell_timeout_s: float = Field(120.0, gt=0)
    shell_memory_mb: int = Field(2048, ge=64)
    shell_processes: int = Field(64, ge=4)
    score_budget: int = Field(3, ge=1)  # scoring attempts (retries on evaluation faults)
    disk_mb: int = Field(512, ge=1)  # workspace size (a tmpfs of this size as root), MiB
    max_files: int = Field(20_000, ge=16)  # workspace entries (the tmpfs's inodes)
    keep_workspace: bool = False  # copy the workspace out before it is removed after scoring
