"""The repository agent loop: spec in, tool calls until finish or a budget, partial score out.

One execution (`run_repo_episode`): a fresh workspace (the task's starting
workspace copied, else empty) and sandbox; the conversation is a system
prompt, the spec, then model turns and tool results. Context compaction
(QwenGyre: "summarise and continue", what makes a trajectory a tree): when the
conversation would pass ``compact_at`` of the model's window - or the endpoint
rejects it as too long - one ``summary`` call (header ``X-Agent-Role: summary``)
condenses the work so far, and the next main call starts again from the system
prompt, the spec and that summary. Budgets: tool calls and wall time (the
task's unless overridden), model calls, compactions. Whatever stopped it, the
workspace left behind is scored (`scorer.score_workspace`).

Host resources: as root the workspace is a tmpfs of ``AgentConfig.disk_mb`` MiB
and ``max_files`` inodes (`sandbox.WorkspaceFS`), so the kernel bounds what the
agent writes; after scoring it is unmounted (or copied out first, bounded, with
``keep_workspace``), and ``workdir`` keeps only ``transcript.json`` and
``episode.json``, what reports need.

Stop reasons: ``finish`` (the agent called finish), ``tool_budget``,
``wall_time``, ``model_calls``, ``no_tool_call`` (too many replies without a
tool call), ``model_error`` (the endpoint failed after its retries),
``context_overflow`` (compaction could not make room), ``sandbox_error`` (a
harness fault).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evoharness.config.env import AgentConfig
from evoharness.envs.repo.policies import ChatPolicy, ChatReply, messages_tokens
from evoharness.envs.repo.sandbox import Limits, Sandbox, SandboxError, WorkspaceFS, copy_tree, walk_tree
from evoharness.envs.repo.scorer import score_workspace
from evoharness.envs.repo.task import RepoTask
from evoharness.envs.repo.tools import ToolBox, shown_name, tool_schemas
from evoharness.envs.repo.trace import TraceWriter

SYSTEM_PROMPT = """\
You are a software engineer working alone in a sandboxed Linux workspace at /workspace \
(Python 3 and pytest available, no network, no package installs). Build what the \
specification asks, using the tools; write your own tests and run them with run_shell. \
When you call finish, or when a budget runs out, hidden tests are run against the \
workspace with /workspace as the working directory and on sys.path; the score is the \
fraction that pass, so partial work counts. Budget: {tool_calls} tool calls and \
{wall:g} seconds."""

SUMMARY_PROMPT = """\
Your context is full. Write a summary that lets you continue without the conversation: \
what is already implemented (files and their public API), what was tested and the \
results, known bugs, and the remaining steps, in order. Be specific and concise."""

NUDGE = "Use the tools to make progress, or call finish when the work is done."


@dataclass
class RepoEpisode:
    """One execution's record (one JSONL line of an evaluation).

    Units: seconds, tokens. ``reward`` is None when scoring was dropped.
    """

    task_id: str
    execution_id: str
    policy: str
    difficulty: str
    stop_reason: str
    reward: float | None
    score_status: str
    passed: int
    n_tests: int
    score_attempts: int
    tool_calls: int
    tool_errors: int
    tool_counts: dict[str, int]
    model_calls: int
    compactions: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    model_s: float
    tool_s: float
    score_s: float
    error: str | None = None
    finish_summary: str = ""
    score_detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _first_user(task: RepoTask, workspace_files: list[str]) -> str:
    start = (
        "The workspace starts with these files:\n" + "\n".join(f"- {f}" for f in workspace_files)
        if workspace_files
        else "The workspace starts empty."
    )
    return f"# Specification\n\n{task.spec.strip()}\n\n{start}"


def _files(root: Path, limit: int = 200) -> list[str]:
    """Up to `limit` regular files under `root` (relative paths, sorted); walked by descriptors,
    links not followed, at most 10,000 entries looked at: any depth or size of tree is cheap."""
    out: list[str] = []
    for n, (_, rel, e, _) in enumerate(walk_tree(root, max_depth=64)):
        if n >= 10_000 or len(out) >= 5 * limit:
            break
        try:
            if e.is_file(follow_symlinks=False) and "__pycache__/" not in rel:
                out.append(shown_name(rel + e.name))
        except OSError:
            continue
    return sorted(out)[:limit]


class _Episode:
    """State of one execution; `run` is the loop."""

    def __init__(
        self, task: RepoTask, policy: ChatPolicy, workdir: Path, cfg: AgentConfig, trace: TraceWriter, execution_id: str
    ) -> None:
        self.task, self.policy, self.cfg, self.trace, self.xid = task, policy, cfg, trace, execution_id
        self.workspace = Path(workdir) / "workspace"
        remove_workspace(self.workspace)  # a restarted execution's leftovers
        self.workspace.mkdir(parents=True)
        # as root, the kernel bounds the workspace (size and inodes), not only the watchdog
        self.fs = WorkspaceFS(self.workspace, cfg.disk_mb, cfg.max_files).mount() if WorkspaceFS.available() else None
        if task.workspace_dir is not None:
            shutil.copytree(
                task.workspace_dir, self.workspace, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
            )
        self.tool_budget = cfg.max_tool_calls or task.max_tool_calls
        self.wall_budget = cfg.wall_time_s or task.wall_time_s
        limits = Limits(
            wall_s=cfg.shell_timeout_s,
            cpu_s=int(cfg.shell_timeout_s) + 5,
            memory_mb=cfg.shell_memory_mb,
            processes=cfg.shell_processes,
            disk_mb=cfg.disk_mb,
            max_files=cfg.max_files,
        )
        try:
            self.sandbox = Sandbox(self.workspace, limits=limits, hidden=[str(task.root)])
        except BaseException:
            self.release(keep=False)
            raise
        self.tools = ToolBox(self.sandbox, output_chars=cfg.output_chars, max_shell_s=cfg.shell_timeout_s)
        self.schemas = tool_schemas()
        self.t0 = time.monotonic()
        self.head = [
            {"role": "system", "content": SYSTEM_PROMPT.format(tool_calls=self.tool_budget, wall=self.wall_budget)},
            {"role": "user", "content": _first_user(task, _files(self.workspace))},
        ]
        self.messages: list[dict[str, Any]] = list(self.head)
        self.n_tool = self.n_tool_err = self.n_model = self.n_compact = 0
        self.tool_counts: dict[str, int] = {}
        self.prompt_tokens = self.completion_tokens = 0
        self.model_s = self.tool_s = 0.0
        self.known = (0, 0)  # (messages sent at the last call, its prompt + completion tokens)
        self.finish_summary = ""
        self.error: str | None = None
        self.segments: list[dict[str, Any]] = []  # earlier contexts and their summaries (the transcript)

    def release(self, keep: bool) -> None:
        """Remove the workspace (unmount its tmpfs); with `keep`, copy it out to the same
        path first, bounded by the config's size and entry count."""
        ws = self.workspace
        if keep and ws.is_dir():
            kept = ws.with_name(".workspace.kept")
            remove_workspace(kept)
            kept.mkdir()
            copy_tree(ws, kept, self.cfg.disk_mb << 20, self.cfg.max_files, max_depth=64, skip=frozenset())
            remove_workspace(ws, self.fs)
            os.replace(kept, ws)
        else:
            remove_workspace(ws, self.fs)
        self.fs = None

    # ---- model calls ----------------------------------------------------------------

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _call(self, messages: list[dict[str, Any]], role: str) -> tuple[ChatReply, float, float]:
        start = self._elapsed()
        reply = self.policy.complete(
            messages, self.schemas if role == "main" else None, execution_id=self.xid, role=role, task=self.task
        )
        end = self._elapsed()
        self.n_model += 1
        self.model_s += end - start
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        return reply, start, end

    def _context_tokens(self) -> int:
        """Tokens of the next prompt: the last call's usage plus an estimate of what came after."""
        n_sent, tokens = self.known
        if tokens and n_sent <= len(self.messages):
            return tokens + messages_tokens(self.messages[n_sent:])
        return messages_tokens(self.messages)

    def _compact(self) -> str | None:
        """Summarise and restart the conversation; returns a stop reason on failure."""
        if self.n_compact >= self.cfg.max_compactions:
            return "context_overflow"
        convo = self.messages
        limit = int(self.cfg.context_window * self.cfg.compact_at)
        while True:  # drop the oldest turns (never the head) until the summary request fits
            request = convo + [{"role": "user", "content": SUMMARY_PROMPT}]
            if messages_tokens(request) <= limit or len(convo) <= len(self.head) + 1:
                break
            convo = self.head + _tail_from_assistant(convo[len(self.head) :], keep=(len(convo) - len(self.head)) // 2)
        reply, start, end = self._call(request, "summary")
        self.trace.model_call(
            self.xid, self.task.task_id, start, end, reply.prompt_tokens, reply.completion_tokens, "summary", []
        )
        if reply.error:
            self.error = reply.error
            return "context_overflow" if reply.context_overflow else "model_error"
        self.n_compact += 1
        self.segments += [
            {"role": "main", "messages": self.messages},
            {"role": "summary", "dropped_messages": len(self.messages) - len(convo), "content": reply.content},
        ]
        self.messages = self.head[:1] + [
            {
                "role": "user",
                "content": (
                    f"{self.head[1]['content']}\n\n# Your progress so far (summary {self.n_compact})\n\n"
                    f"{reply.content.strip()}\n\nFiles now in the workspace:\n"
                    + "\n".join(f"- {f}" for f in _files(self.workspace))
                    + "\n\nContinue from here."
                ),
            }
        ]
        self.known = (0, 0)
        if messages_tokens(self.messages) > limit:
            return "context_overflow"
        return None

    # ---- the loop ------------------------------------------------------------------

    def run(self) -> str:
        no_tool = 0
        window = self.cfg.context_window * self.cfg.compact_at
        while True:
            if self._elapsed() >= self.wall_budget:
                return "wall_time"
            if self.n_tool >= self.tool_budget:
                return "tool_budget"
            if self.n_model >= self.cfg.max_model_calls:
                return "model_calls"
            if self._context_tokens() > window and (stop := self._compact()):
                return stop
            reply, start, end = self._call(self.messages, "main")
            if reply.error:
                if reply.context_overflow:
                    self.trace.model_call(self.xid, self.task.task_id, start, end, 0, 0, "main", [])
                    if stop := self._compact():
                        return stop
                    continue
                self.error = reply.error
                return "model_error"
            self.known = (len(self.messages) + 1, reply.prompt_tokens + reply.completion_tokens)
            self.messages.append(reply.message())
            tools_done: list[tuple[str, float]] = []
            stop = None
            if not reply.tool_calls:
                no_tool += 1
                self.messages.append({"role": "user", "content": NUDGE})
                if no_tool >= self.cfg.max_no_tool_replies:
                    stop = "no_tool_call"
            else:
                no_tool = 0
            for call in reply.tool_calls:
                if stop is not None or self.n_tool >= self.tool_budget or self._elapsed() >= self.wall_budget:
                    stop = stop or ("tool_budget" if self.n_tool >= self.tool_budget else "wall_time")
                    self.messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": f"error: not run ({stop.replace('_', ' ')} reached)",
                        }
                    )
                    continue
                # a command may not outlast the episode's wall budget
                self.tools.max_shell_s = max(1.0, min(self.cfg.shell_timeout_s, self.wall_budget - self._elapsed()))
                try:
                    res = self.tools.call(call.name, call.arguments)
                except SandboxError as e:
                    self.error = f"sandbox: {e}"
                    stop = "sandbox_error"
                    self.messages.append({"role": "tool", "tool_call_id": call.id, "content": "error: sandbox failure"})
                    continue
                self.n_tool += 1
                self.n_tool_err += res.is_error
                self.tool_counts[call.name] = self.tool_counts.get(call.name, 0) + 1
                self.tool_s += res.seconds
                tools_done.append((call.name, res.seconds))
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": res.content})
                if res.finished:
                    try:
                        self.finish_summary = str(json.loads(call.arguments or "{}").get("summary", ""))[:2000]
                    except (json.JSONDecodeError, AttributeError):
                        pass
                    stop = "finish"
            self.trace.model_call(
                self.xid,
                self.task.task_id,
                start,
                end,
                reply.prompt_tokens,
                reply.completion_tokens,
                "main",
                tools_done,
            )
            if stop is not None:
                return stop


def _tail_from_assistant(turns: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """The last ~`keep` messages, starting at an assistant message (tool results keep their call)."""
    i = max(0, len(turns) - keep)
    while i < len(turns) and turns[i]["role"] != "assistant":
        i += 1
    return turns[i:]


def remove_workspace(path: Path, fs: WorkspaceFS | None = None) -> None:
    """Remove an episode's workspace: unmount its tmpfs (`fs`, or one left mounted there by a
    process that died) and delete what remains; links inside are never followed."""
    path = Path(path)
    if fs is not None:
        fs.unmount()
    elif os.path.ismount(path):
        WorkspaceFS(path, 1, 1).adopt().unmount()
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def run_repo_episode(
    task: RepoTask,
    policy: ChatPolicy,
    workdir: str | Path,
    cfg: AgentConfig | None = None,
    trace: TraceWriter | None = None,
    execution_id: str | None = None,
) -> RepoEpisode:
    """Play one execution of `task` with `policy` in ``workdir/workspace`` and score it.

    After scoring (on a copy) the workspace is removed, unless
    ``cfg.keep_workspace`` (then it stays at ``workdir/workspace``, copied off its
    tmpfs, bounded). ``workdir/transcript.json`` holds every context the agent
    saw (segments: main conversations and the summaries that replaced them) and
    ``workdir/episode.json`` the returned `RepoEpisode`. Never raises for the
    agent's or the endpoint's failures: they end the episode with a stop reason.

    Raises:
        SandboxUnavailable: bwrap missing (nothing is ever run unconfined).
    """
    cfg = cfg or AgentConfig()
    xid = execution_id or f"{task.task_id}#{uuid.uuid4().hex[:12]}"
    ep = _Episode(task, policy, Path(workdir), cfg, trace or TraceWriter(None), xid)
    stop = None
    try:
        stop = ep.run()
    finally:
        ep.sandbox.close()
        if stop is None:  # a harness fault: nothing will be scored, nothing may stay mounted
            ep.release(keep=False)
        transcript = {
            "execution_id": xid,
            "task_id": task.task_id,
            "segments": ep.segments + [{"role": "main", "messages": ep.messages}],
        }
        tmp = Path(workdir) / ".transcript.json.tmp"
        tmp.write_text(json.dumps(transcript))
        os.replace(tmp, Path(workdir) / "transcript.json")
    wall = time.monotonic() - ep.t0
    t_score = time.monotonic()
    try:
        outcome = score_workspace(task, ep.workspace, budget=cfg.score_budget)
    finally:
        ep.release(keep=cfg.keep_workspace)
    score_s = time.monotonic() - t_score
    detail = {
        k: outcome.detail[k]
        for k in (
            "passed",
            "collected",
            "collect_errors",
            "errors",
            "reason",
            "exit_code",
            "killed",
            "abnormal",
            "tampered",
            "copy",
        )
        if k in outcome.detail
    }
    episode = RepoEpisode(
        task_id=task.task_id,
        execution_id=xid,
        policy=policy.name,
        difficulty=task.difficulty,
        stop_reason=stop,
        reward=outcome.reward,
        score_status=outcome.status,
        passed=int(outcome.detail.get("passed", 0)),
        n_tests=task.n_tests,
        score_attempts=outcome.attempts,
        tool_calls=ep.n_tool,
        tool_errors=ep.n_tool_err,
        tool_counts=ep.tool_counts,
        model_calls=ep.n_model,
        compactions=ep.n_compact,
        prompt_tokens=ep.prompt_tokens,
        completion_tokens=ep.completion_tokens,
        wall_s=round(wall, 3),
        model_s=round(ep.model_s, 3),
        tool_s=round(ep.tool_s, 3),
        score_s=round(score_s, 3),
        error=ep.error,
        finish_summary=ep.finish_summary,
        score_detail=detail,
    )
    tmp = Path(workdir) / ".episode.json.tmp"
    tmp.write_text(json.dumps(episode.to_dict()))
    os.replace(tmp, Path(workdir) / "episode.json")
    return episode
