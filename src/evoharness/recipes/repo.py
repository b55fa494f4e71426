"""The repository-task RL recipe (``env = "repo"``): real agent loops, real sandboxes, tree GRPO.

- `repo_tasks`: the tasks a run trains on (``cfg.repo.tasks``, only ``repo.task_ids`` when given);
- `RepoWorkload`: the agents of a run (`runtime.cell_backend.AgentWorkload`). Execution ``e`` of
  RL step ``u = e // N`` is sample ``k`` of GRPO group ``g`` (``e % N = g·G + k``) on task
  ``tasks[order[(u·P + g) % len(order)]]``, execution id ``{task_id}#u{u}g{k}``;
- `repo_recipe`: the run's `recipes.base.Recipe`: the workload, bare-engine cells
  (`recipes.engine_cell`), no periodic evaluation (``evoharness eval --env repo`` evaluates).

Agent loop. Each live execution runs the scaffold (`envs.repo.scaffold.run_repo_episode`, its
tools in a bubblewrap sandbox of its own) on a thread of the driver process, in
``<out>/runtime/episodes/e<N>/``. Its `ChatPolicy` (`CellChatPolicy`) renders the chat with the
model's template, posts the prompt ids to the driver thread and waits: the runtime issues the
call (`request`) to the cell the scheduler bound the execution to (directly, or through the
gateway with ``runtime.via_gateway``), while the agent waits the execution is "pending" and
`woken` says when its next call (or its end) is there. The cell decodes the call with the bare
engine at ``grpo.temperature`` with a seed of (seed, execution, call index) only
(`call_seed`), so a call re-issued on another cell, or batched with other calls, returns the
same completion from the same weights. `reply` decodes the text, parses Qwen-style
``<tool_call>`` blocks (`runtime.wire.parse_tool_calls`) and hands the agent a `ChatReply`. A
prompt that does not fit the model's window comes back as a context overflow, so the scaffold
compacts (an ``X-Agent-Role: summary`` call) as against any endpoint.

Reward and data. Every call is kept as a TITO `rollout.records.CallRecord` (prompt ids as the
engine saw them, generated ids, behaviour log-probs, weights version, role). The finished
workspace is scored by the scaffold (`envs.repo.scorer`: scored / placeholder 0 / dropped);
the reward is the partial score, None when scoring was dropped or the episode runner itself
raised (a harness error, ``score/errors``, not a crashed run): such a member is out of its
group's baseline and trains nothing (`train.step.score_rewards`). Rows: the execution's
records folded into a prefix-shared trajectory tree, ``grpo.j_max`` dedup-sampled paths, each
run of generated tokens on them one row (`train.step.call_rows`). Streamed micro-batches (one
update per step) or the whole batch's planned updates at the sync, as every workload
(`train.step`).

Host hygiene. The sandbox's hooks are checked when the workload is built (bwrap present, the
seccomp filter buildable: `envs.repo.sandbox.require_bwrap` / `seccomp_program`), so a machine
that cannot confine the agents fails before any cell starts. The scaffold removes each
execution's workspace (a kernel-bounded tmpfs as root) once it is scored; unless
``repo.agent.keep_workspace``, workspaces left behind (a killed run's, an execution still live
when the run closes) are removed when the workload starts and when it closes
(`envs.repo.scaffold.remove_workspace`).

Checkpoints: finished executions are kept; an execution live at a job checkpoint restarts from
its beginning on resume (its sandbox workspace is not checkpointed), counted per step as
``rollout/restarted_executions``.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from evoharness.config.rl import RLConfig
from evoharness.envs.repo import sandbox
from evoharness.envs.repo.policies import ChatReply, ToolCall
from evoharness.envs.repo.scaffold import remove_workspace, run_repo_episode
from evoharness.rollout.records import CallRecord
from evoharness.runtime.wire import parse_tool_calls
from evoharness.train.step import (
    GroupScore,
    call_rows,
    group_metrics,
    lr_at,
    merged_update_metrics,
    plan_updates,
    score_rewards,
    stream_scale,
    streamed_rows,
    streams,
)

# the `RepoEpisode` fields an execution's outcome keeps
_OUTCOME = (
    "reward",
    "score_status",
    "stop_reason",
    "passed",
    "n_tests",
    "score_attempts",
    "tool_calls",
    "tool_errors",
    "model_calls",
    "compactions",
    "prompt_tokens",
    "completion_tokens",
    "wall_s",
    "model_s",
    "tool_s",
    "score_s",
    "error",
    "score_detail",
)
# score statuses counted per step (``score/<status>``); "errors": the episode runner raised (a harness error)
_STATUSES = {
    "scored": "score/scored",
    "placeholder": "score/placeholder",
    "dropped": "score/dropped",
    "error": "score/errors",
}


def repo_tasks(cfg: RLConfig) -> list:
    """The repository tasks RL trains on (``cfg.repo.tasks``, only ``repo.task_ids`` when given, in that order).

    Raises:
        ValueError: a task id that names no task; TaskFormatError (a ValueError): no loadable task there.
    """
    from evoharness.envs.repo.task import load_tasks

    tasks = load_tasks(cfg.repo.tasks)
    if not cfg.repo.task_ids:
        return tasks
    known = {t.task_id: t for t in tasks}
    if unknown := sorted(set(cfg.repo.task_ids) - set(known)):
        raise ValueError(f"repo.task_ids {unknown} name no task in {cfg.repo.tasks!r}")
    return [known[i] for i in cfg.repo.task_ids]


def task_order(n: int, seed: int) -> list[int]:
    """The run's task order: a seeded shuffle of ``range(n)``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def call_seed(seed: int, execution: int, call: int) -> int:
    """The sampling seed of call `call` of execution `execution` (independent of cell and timing)."""
    return ((seed * 1_000_003 + execution) * 100_003 + call) & 0x7FFFFFFF


def check_sandbox() -> None:
    """The repository sandbox can confine agents here: bwrap is installed and the seccomp filter
    builds (both refuse to run anything unconfined).

    Raises:
        SandboxUnavailable: one of them is missing (its message says what to install).
    """
    try:
        sandbox.require_bwrap()
        sandbox.seccomp_program()
    except sandbox.SandboxUnavailable as e:
        raise sandbox.SandboxUnavailable(
            f"env = 'repo' runs every agent command in the sandbox, which cannot start on this machine: {e}"
        ) from e


@dataclasses.dataclass
class Ask:
    """One model call an agent thread waits on (issued, and re-issued as is, by the runtime).

    Attributes:
        prompt_ids: the rendered chat, tokenized.
        role: ``main`` or ``summary`` (the scaffold's `X-Agent-Role`).
        seed: its sampling seed (`call_seed`).
        messages: the chat it renders (for a test that scripts the agent's actions).
        fut: the agent's answer (`ChatReply`).
    """

    prompt_ids: list[int]
    role: str
    seed: int
    messages: list[dict[str, Any]]
    fut: Future = dataclasses.field(default_factory=Future)
    t_start: float = 0.0  # wall clock when the agent asked (CallRecord.t_start)


class WorkloadClosed(Exception):
    """The workload closed while an agent waited on a model call: its episode ends unscored."""


class CellChatPolicy:
    """The scaffold's `ChatPolicy` for execution `e`: calls answered by the runtime's cells.

    An overlong prompt is a context overflow (the scaffold compacts), a chat the template cannot
    render a model error. Raises `WorkloadClosed` only when the workload closes under it: the
    episode then ends without scoring (the scaffold releases its workspace).
    """

    name = "runtime"

    def __init__(self, workload: RepoWorkload, e: int):
        self.wl, self.e, self.n_calls = workload, e, 0

    def complete(self, messages, tools, *, execution_id, role, task) -> ChatReply:
        wl = self.wl
        if wl.closed:
            raise WorkloadClosed("the workload closed")
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        kw = {"tools": tools} if tools else {}
        try:
            with wl.tok_lock:
                text = wl.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
                ids = wl.tok(text, add_special_tokens=False)["input_ids"]
        except Exception as exc:  # noqa: BLE001 -- a template that cannot render these messages
            return ChatReply(finish_reason="error", error=f"cannot render the chat: {type(exc).__name__}: {exc}")
        if len(ids) + wl.max_new_tokens > wl.max_model_len:
            return ChatReply(
                finish_reason="error",
                context_overflow=True,
                error=f"context_length_exceeded: prompt {len(ids)} + max_new_tokens "
                f"{wl.max_new_tokens} > {wl.max_model_len}",
            )
        ask = Ask(list(ids), role, call_seed(wl.cfg.seed, self.e, self.n_calls), messages, t_start=time.time())
        self.n_calls += 1
        wl.inbox.put(("call", self.e, ask))
        return ask.fut.result()  # WorkloadClosed when the workload closes meanwhile

    def close(self) -> None:
        pass


class RepoWorkload:
    """The repository agents of an RL run (module docstring; `runtime.cell_backend.AgentWorkload`).

    Args:
        cfg: the run's config (``model_path``: the tokenizer and window; ``max_new_tokens``,
            ``grpo``, ``repo.agent``, ``seed``).
        tasks / order: the `envs.repo.task.RepoTask`s and their shuffled order.
        work_dir: ``episodes/e<N>/`` (workspace while live, ``transcript.json``, ``episode.json``).
        join_s: at close, how long live agent threads get to end (seconds, all together).

    Raises:
        ValueError: no tasks.
        SandboxUnavailable: the sandbox cannot run here (`check_sandbox`).
    """

    def __init__(self, cfg: RLConfig, tasks: list, order: list[int], work_dir: str | Path, join_s: float = 60.0):
        from transformers import AutoConfig

        from evoharness.models.init import load_tokenizer
        from evoharness.recipes.alfworld import train_grpo

        if not tasks:
            raise ValueError("no repository tasks to train on")
        check_sandbox()
        self.cfg, self.grpo = cfg, train_grpo(cfg)
        self.tasks, self.order = tasks, order
        self.P, self.G = cfg.grpo.prompts_per_step, cfg.grpo.group_size
        self.N = self.P * self.G
        self.work_dir, self.join_s = Path(work_dir), join_s
        self.keep = cfg.repo.agent.keep_workspace
        self.max_new_tokens, self.temperature = cfg.max_new_tokens, cfg.grpo.temperature
        self.tok = load_tokenizer(cfg.model_path)
        self.tok_lock = threading.Lock()  # a fast tokenizer used from several threads fails ("Already borrowed")
        self._stop_ids = set(getattr(self.tok, "all_special_ids", []))
        self.max_model_len = int(AutoConfig.from_pretrained(cfg.model_path).max_position_embeddings)
        self.closed = False
        self.inbox: queue.Queue = queue.Queue()  # agent threads -> the driver thread
        self._ask: dict[int, Ask] = {}  # execution -> the call it waits on
        self._woke: set[int] = set()  # executions whose call or end arrived since `woken`
        self._threads: dict[int, threading.Thread] = {}
        self.started: dict[int, int] = {}  # execution -> times its episode was started
        self.outcome: dict[int, dict[str, Any]] = {}  # finished execution -> its episode's outcome
        self.records: dict[int, list[CallRecord]] = {}  # execution -> its model calls (TITO)
        self._gen_s: dict[int, float] = {}  # execution -> cell-seconds its calls decoded
        self._scores: dict[int, GroupScore] = {}  # run's group index -> its score (once all members finished)
        self._rows: dict[int, tuple[list, dict[str, int]]] = {}  # execution -> (its rows, its tree's sizes)
        self._last_sync = time.monotonic()
        self.sweep()  # a killed run's workspaces (tmpfs mounts) go first

    # ---- executions: repository episodes on threads ---------------------------------------------
    def spec(self, e: int) -> tuple[Any, str]:
        """(task, execution id) of execution e."""
        step, i = divmod(e, self.N)
        g, k = divmod(i, self.G)
        task = self.tasks[self.order[(step * self.P + g) % len(self.order)]]
        return task, f"{task.task_id}#u{step}g{k}"

    def episode_dir(self, e: int) -> Path:
        return self.work_dir / "episodes" / f"e{e}"

    def start(self, e: int) -> None:
        """Start execution e's agent on a thread (its first call arrives through `inbox`)."""
        task, xid = self.spec(e)
        self.started[e] = self.started.get(e, 0) + 1
        self.records[e], self._gen_s[e] = [], 0.0
        self._ask.pop(e, None)
        self.outcome.pop(e, None)
        policy = CellChatPolicy(self, e)
        try:
            workdir = self.episode_dir(e)
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.outcome[e] = self._error(exc, 0)
            return

        def play() -> None:
            try:
                ep = run_repo_episode(task, policy, workdir, self.cfg.repo.agent, execution_id=xid)
                out: dict[str, Any] = {k: getattr(ep, k) for k in _OUTCOME}
            except WorkloadClosed:
                return
            except Exception as exc:  # noqa: BLE001 -- a harness fault ends this execution, not the run
                out = self._error(exc, policy.n_calls)
            self.inbox.put(("done", e, out))

        t = threading.Thread(target=play, name=f"repo-e{e}", daemon=True)
        self._threads[e] = t
        t.start()

    @staticmethod
    def _error(exc: BaseException, calls: int) -> dict[str, Any]:
        """The outcome of an execution whose episode runner raised: a harness error, unscored."""
        return {
            "reward": None,
            "score_status": "error",
            "stop_reason": "error",
            "model_calls": calls,
            "error": f"{type(exc).__name__}: {exc}"[:500],
            "score_detail": {},
        }

    def _drain(self) -> None:
        """Take the agent threads' messages: a call to issue, or an episode's end."""
        while True:
            try:
                kind, e, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                self._ask[e] = payload
            else:
                self.outcome[e] = payload
                self._threads.pop(e, None)
            self._woke.add(e)

    def request(self, e: int) -> tuple | None:
        """``(prompt_ids, max_new_tokens, seed, temperature)``: the bare engine's call (`recipes.engine_cell`)."""
        self._drain()
        ask = self._ask.get(e)
        if ask is None:
            return None
        self._woke.discard(e)
        return list(ask.prompt_ids), self.max_new_tokens, ask.seed, self.temperature

    def reply(self, e: int, result: dict[str, Any]) -> None:
        ids, lps, version = result["result"]
        ask = self._ask.pop(e)
        self._gen_s[e] += result["seconds"]
        keep = [t for t in ids if t not in self._stop_ids]
        with self.tok_lock:
            text = self.tok.decode(keep, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        content, calls = parse_tool_calls(text)
        finish = "tool_calls" if calls else ("stop" if ids and ids[-1] in self._stop_ids else "length")
        _, xid = self.spec(e)
        recs = self.records[e]
        recs.append(
            CallRecord(
                execution_id=xid,
                call_id=f"{xid}#c{len(recs)}",
                role=ask.role,
                model=self.cfg.model_path,
                prompt_token_ids=list(ask.prompt_ids),
                completion_token_ids=list(ids),
                logprobs=list(lps),
                policy_version=int(version),
                finish_reason=finish,
                t_start=ask.t_start,
                t_end=time.time(),
                tool_calls=calls,
            )
        )
        answer = ChatReply(
            content=content or "",
            tool_calls=[ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls],
            prompt_tokens=len(ask.prompt_ids),
            completion_tokens=len(ids),
            finish_reason=finish,
        )
        ask.fut.set_result(self.answer(e, ask, answer))

    def answer(self, e: int, ask: Ask, reply: ChatReply) -> ChatReply:
        """What the agent of execution `e` reads for this call: the model's reply (a seam for a
        test that scripts the agent's actions while the model's tokens are still recorded)."""
        return reply

    def tool_delay(self, e: int) -> float:
        return 0.0  # the agent's tools run on its thread: `woken` says when it asks again

    def finished(self, e: int) -> bool:
        self._drain()
        return e in self.outcome

    def woken(self) -> list[int]:
        self._drain()
        out, self._woke = sorted(self._woke), set()
        return out

    def tokens(self, e: int) -> int:
        return sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in self.records.get(e, []))

    def calls(self, e: int) -> list[dict[str, Any]]:
        return [
            {
                "prompt_tokens": len(r.prompt_token_ids),
                "completion_tokens": len(r.completion_token_ids),
                "policy_version": r.policy_version,
                "role": r.role,
            }
            for r in self.records.get(e, [])
        ]

    def trace_key(self, e: int) -> tuple[str, str, float]:
        task, xid = self.spec(e)
        return task.task_id, xid, float(self.outcome.get(e, {}).get("wall_s", 0.0))

    # ---- rewards, trees, rows ----------------------------------------------------------------------
    def _score(self, group: int) -> GroupScore:
        """Group `group` of the run (all members finished), scored once: its rows and trees too."""
        if group not in self._scores:
            members = range(group * self.G, (group + 1) * self.G)
            if missing := [m for m in members if m not in self.outcome]:
                raise RuntimeError(
                    f"group {group} trained before its members {missing} finished (GRPO needs the group)"
                )
            score = score_rewards([self.outcome[m]["reward"] for m in members], self.grpo)
            step = group * self.G // self.N
            for m, valid, adv in zip(members, score.valid, score.advantages):
                recs = self.records.get(m, [])
                if not valid or not recs:  # dropped / harness error (unpunished, untrained), or no call made
                    self._rows[m] = [], {"calls": len(recs), "tokens": 0, "trainable": 0, "selected": 0}
                else:
                    self._rows[m] = call_rows(recs, adv[0], self.grpo, step, group=group)
            self._scores[group] = score
        return self._scores[group]

    def rows(self, e: int) -> list:
        """Execution e's training rows (fresh copies: weights are set on them per use)."""
        self._score(e // self.G)
        return [dataclasses.replace(r) for r in self._rows[e][0]]

    def micro_batch(self, executions: Sequence[int], version: int) -> list | None:
        if not streams(self.grpo):
            return None
        return streamed_rows([r for e in executions for r in self.rows(e)], self.N)

    def sync(self, version: int, executions: Sequence[int], ranks: int) -> list[dict[str, Any]]:
        """Step ``version - 1``'s update plan per train rank (as `recipes.alfworld.AlfworldWorkload.sync`):
        streamed, no rows and the summed gradient times N/M; else the whole batch's updates
        (`train.step.plan_updates`), each update's rows dealt round-robin over the ranks."""
        step = version - 1
        plan = {"lr": lr_at(self.grpo, step, self.cfg.steps), "step": step}
        if streams(self.grpo):
            m = sum(1 for e in executions if self.rows(e))
            return [dict(plan, updates=[], scale=stream_scale(self.N, m)) for _ in range(ranks)]
        updates = plan_updates([r for e in sorted(executions) for r in self.rows(e)], self.grpo)
        return [dict(plan, updates=[u[r::ranks] for u in updates], scale=1.0) for r in range(ranks)]

    def step_done(
        self, version: int, executions: Sequence[int], stats: dict[str, Any], timing: dict[str, float]
    ) -> dict[str, Any]:
        """Step ``version - 1`` trained: its metrics record (`stats`: `train.step.merged_update_metrics`'
        arguments); the trained executions' books are dropped."""
        execs = sorted(executions)
        groups = sorted({e // self.G for e in execs})
        scores = [self._score(g) for g in groups]
        adv = {
            m: s.advantages[m - g * self.G][0]
            for g, s in zip(groups, scores)
            for m in range(g * self.G, (g + 1) * self.G)
        }
        outs = [self.outcome[e] for e in execs]
        n = max(1, len(outs))
        scored = [o["reward"] for o in outs if o["reward"] is not None]
        stops: dict[str, int] = {}
        for o in outs:
            stops[o["stop_reason"]] = stops.get(o["stop_reason"], 0) + 1
        details = [o.get("score_detail") or {} for o in outs]
        trees = [self._rows[e][1] for e in execs]
        now = time.monotonic()
        rec = {
            "step": version,
            "policy_version": version,
            "success": sum(r == 1.0 for r in scored) / n,
            "reward": sum(scored) / len(scored) if scored else 0.0,
            **{name: sum(o["score_status"] == s for o in outs) for s, name in _STATUSES.items()},
            "score/retries": sum(max(0, o.get("score_attempts", 1) - 1) for o in outs),
            # the scorer's evidence: runs that ended abnormally (scored on what passed before, the control
            # run healthy) and runs whose pytest was tampered with (no pass counted)
            "score/abnormal": sum(bool(d.get("abnormal")) for d in details),
            "score/tampered": sum(bool(d.get("tampered")) for d in details),
            **{f"stop/{k}": v for k, v in sorted(stops.items())},
            "steps_per_episode": sum(o.get("model_calls", 0) for o in outs) / n,
            "tool_calls_per_episode": sum(o.get("tool_calls", 0) for o in outs) / n,
            "compactions_per_episode": sum(o.get("compactions", 0) for o in outs) / n,
            "completion_tokens_per_episode": sum(
                len(r.completion_token_ids) for e in execs for r in self.records.get(e, [])
            )
            / n,
            **group_metrics(scores, self.grpo),
            # harness errors (the episode runner raised); scorer drops are ``score/dropped``
            "rollout/env_errors": stops.get("error", 0),
            "rollout/restarted_executions": sum(self.started.get(e, 1) - 1 for e in execs),
            **{f"tree/{k}": sum(t[k] for t in trees) for k in ("calls", "tokens", "trainable", "selected")},
            "tree/rows": sum(len(self._rows[e][0]) for e in execs),
            "adv/nonzero": sum(adv.get(e, 0.0) != 0.0 for e in execs),
            **merged_update_metrics(**stats),
            # cell-seconds and agent-thread seconds summed over the batch (executions overlap: not a wall-time split)
            "timing_s/gen": sum(self._gen_s.get(e, 0.0) for e in execs),
            "timing_s/env": sum(o.get("tool_s", 0.0) + o.get("score_s", 0.0) for o in outs),
            **{f"timing_s/{k}": v for k, v in timing.items()},
            "timing_s/step": now - self._last_sync,
        }
        self._last_sync = now
        for e in execs:
            for books in (self.outcome, self.records, self._gen_s, self._rows, self.started):
                books.pop(e, None)
        for g in groups:
            if not any(m in self.outcome for m in range(g * self.G, (g + 1) * self.G)):
                self._scores.pop(g, None)
        return rec

    # ---- job checkpoints ----------------------------------------------------------------------------
    _BOOKS = ("outcome", "records", "_gen_s", "_scores", "_rows", "started")

    def state(self) -> dict[str, Any]:
        """The finished executions' books, and which executions are live (they restart on resume:
        a sandbox workspace is not checkpointed)."""
        self._drain()
        live = sorted(e for e in self.started if e not in self.outcome)
        books = {k: dict(getattr(self, k)) for k in self._BOOKS}
        for k in ("records", "_gen_s"):
            books[k] = {e: v for e, v in books[k].items() if e not in live}
        return {**books, "live": live}

    def restore(self, st: dict[str, Any]) -> None:
        for k in self._BOOKS:
            setattr(self, k, dict(st[k]))
        for e in st["live"]:
            self.start(e)  # from its beginning (`started` counts the restart)

    # ---- host hygiene -----------------------------------------------------------------------------
    def sweep(self, executions: Sequence[int] | None = None) -> list[Path]:
        """Remove the workspaces left in ``episodes/e<N>/`` (all, or these executions'), tmpfs
        mounts included; nothing with ``repo.agent.keep_workspace``. Returns what was removed."""
        if self.keep:
            return []
        dirs = (
            [self.episode_dir(e) for e in executions]
            if executions is not None
            else sorted((self.work_dir / "episodes").glob("e*"))
        )
        gone = []
        for d in dirs:
            for ws in (d / "workspace", d / ".workspace.kept"):
                if ws.exists() or ws.is_symlink() or ws.is_mount():
                    remove_workspace(ws)
                    gone.append(ws)
        return gone

    def close(self) -> None:
        """End the agent threads (a waiting call ends its episode unscored), then remove what
        they left (`sweep`); a thread still in a tool past ``join_s`` releases its own workspace."""
        if self.closed:
            return
        self.closed = True
        self._drain()
        for ask in self._ask.values():
            if not ask.fut.done():
                ask.fut.set_exception(WorkloadClosed("the workload closed"))
        self._ask.clear()
        deadline = time.monotonic() + self.join_s
        while True:
            self._drain_closing()
            alive = [t for t in self._threads.values() if t.is_alive()]
            if not alive or time.monotonic() >= deadline:
                break
            alive[0].join(timeout=0.05)
        stuck = {e for e, t in self._threads.items() if t.is_alive()}
        self.sweep([e for e in self.started if e not in stuck])

    def _drain_closing(self) -> None:
        """While closing: a call an agent posted meanwhile is failed at once."""
        while True:
            try:
                kind, e, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                payload.fut.set_exception(WorkloadClosed("the workload closed"))
            else:
                self.outcome[e] = payload
                self._threads.pop(e, None)


def repo_recipe(cfg: RLConfig) -> Any:
    """The repository part of an RL job (`recipes.base.Recipe`): `RepoWorkload` over `repo_tasks`
    in a seeded order (its episodes in ``<out_dir>/runtime/episodes``), bare-engine cells
    (`recipes.engine_cell.EngineCellFactory`), no periodic evaluation.

    Raises:
        ValueError: a bad task filter, ``eval_every`` > 0, an ``sft_anchor`` (the engine cells have none).
        SandboxUnavailable: the sandbox cannot run here.
    """
    from evoharness.recipes.alfworld import train_grpo
    from evoharness.recipes.base import Recipe
    from evoharness.recipes.engine_cell import EngineCellFactory

    if cfg.eval_every > 0:
        raise ValueError(
            "env = 'repo' has no periodic evaluation yet (eval_every = 0; `evoharness eval --env repo` "
            "evaluates a model)"
        )
    if cfg.sft_anchor is not None:
        raise ValueError("env = 'repo' trains without an SFT anchor (its cells' trainer has none): unset sft_anchor")
    tasks = repo_tasks(cfg)
    workload = RepoWorkload(cfg, tasks, task_order(len(tasks), cfg.seed), Path(cfg.out_dir) / "runtime")
    grpo = train_grpo(cfg)

    def cell(threads: int | None = None) -> EngineCellFactory:
        return EngineCellFactory(
            cfg.model_path,
            grpo,
            threads,
            device=cfg.device,
            dtype=cfg.dtype,
            ref_device=cfg.ref_device,
            lora=cfg.lora,
            seed=cfg.seed,
        )

    return Recipe(workload, cell, None)
