"""Repository-building tasks (NL2Repo-style): a spec in, a repository out, hidden tests, partial scores.

- `task`: the task format (the project's pack and NL2Repo-Bench's layout).
- `sandbox`: bubblewrap confinement of every command (no network, read-only system,
  bounded CPU / memory / processes / file size / wall time).
- `tools`: the agent's tools as OpenAI function schemas.
- `scaffold`: the agent loop with context compaction, budgets and stop reasons.
- `scorer`: hidden tests over a copy of the workspace, reward = passed / n_tests.
- `policies`: reference replay, empty, any OpenAI-compatible endpoint (the gateway too).
- `trace`: model/tool durations for ``evoharness simulate``.
- `scoring`: scored / placeholder / dropped, the retry budget (QwenGyre partial scoring).
"""

from evoharness.envs.repo.policies import EmptyPolicy, OpenAIChatPolicy, ReferencePolicy, make_chat_policy
from evoharness.envs.repo.sandbox import Limits, RunResult, Sandbox, SandboxError, SandboxUnavailable
from evoharness.envs.repo.scaffold import RepoEpisode, run_repo_episode
from evoharness.envs.repo.scorer import score_workspace
from evoharness.envs.repo.task import PACK_DIR, RepoTask, TaskFormatError, load_task, load_tasks
from evoharness.envs.repo.tools import ToolBox, tool_schemas

__all__ = [
    "EmptyPolicy",
    "Limits",
    "OpenAIChatPolicy",
    "PACK_DIR",
    "ReferencePolicy",
    "RepoEpisode",
    "RepoTask",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "TaskFormatError",
    "ToolBox",
    "load_task",
    "load_tasks",
    "make_chat_policy",
    "run_repo_episode",
    "score_workspace",
    "tool_schemas",
]
