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

    # ALFWorld data: a directory holding json_2.1.1/; None/"bundled": the pack inside the project; "env": $ALFWORLD_DATA
    data_path: str | None = None
    engine: Literal["textworld", "fast"] = "fast"  # "fast": the project's byte-identical engine; "textworld" = stock
    # placing command (envs/alfworld/wording.py): the game's own, put X in/on Y, or move X to Y
    wording: Literal["native", "put", "move"] = "native"
    timeout_s: float = 120.0  # seconds a game reset or step may take; longer ends the episode as an error


class AgentConfig(Strict):
    """The scaffold's budgets and context management (None: the task's own budget)."""

    context_window: int = Field(32_768, ge=1024)  # the model's window, tokens
    compact_at: float = Field(0.85, gt=0.1, le=1.0)  # compact when the next prompt would pass this fraction
    max_tool_calls: int | None = Field(None, ge=1)  # tool calls per execution (None: the task's max_tool_calls)
    wall_time_s: float | None = Field(None, gt=0)  # seconds per execution (None: the task's wall_time_s)
    max_model_calls: int = Field(2000, ge=1)  # model calls per execution, summaries included (then stop: model_calls)
    # context compactions (summarise and restart) per execution; past it the execution stops (context_overflow)
    max_compactions: int = Field(50, ge=0)
    # replies in a row without a tool call that end the execution (no_tool_call)
    max_no_tool_replies: int = Field(3, ge=1)
    output_chars: int = Field(8000, ge=200)  # tool result shown to the model, characters
    # wall seconds per shell command (CPU limit + 5 s; never past wall_time_s)
    shell_timeout_s: float = Field(120.0, gt=0)
    # sandbox memory, MiB: each process's address space (RLIMIT_AS) and the summed RSS of its processes
    shell_memory_mb: int = Field(2048, ge=64)
    shell_processes: int = Field(64, ge=4)  # processes + threads of the sandbox's user (RLIMIT_NPROC)
    score_budget: int = Field(3, ge=1)  # scoring attempts (retries on evaluation faults)
    disk_mb: int = Field(512, ge=1)  # workspace size (a tmpfs of this size as root), MiB
    max_files: int = Field(20_000, ge=16)  # workspace entries (the tmpfs's inodes)
    keep_workspace: bool = False  # copy the workspace out before it is removed after scoring


class RepoTasksConfig(Strict):
    """Repository tasks (section ``[repo]`` of ``evoharness eval --env repo`` and ``evoharness rl --env repo``)."""

    tasks: str = "pack"  # "pack", a task directory, or a directory of tasks
    task_ids: list[str] = []  # only these (default: all of `tasks`)
    agent: AgentConfig = Field(default_factory=AgentConfig)  # each execution's scaffold budgets and context management
