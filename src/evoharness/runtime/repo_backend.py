"""The repository-environment RL workload on cell processes: real agent loops, real sandboxes, tree GRPO.

`RepoBackend` is `alfworld_backend.AlfworldBackend` with the ALFWorld episode
replaced by a repository episode (`envs.repo.scaffold.run_repo_episode`):
execution ``e`` of RL step ``u = e // N`` is sample ``k`` of GRPO group ``g``
(``e % N = g·G + k``) on task ``tasks[order[(u·P + g) % len(order)]]``,
execution id ``{task_id}#u{u}g{k}``. The scheduling is the driver's and the
scheduler's; this module only plays executions and turns them into samples.

Agent loop. Each live execution runs the scaffold on a thread of the driver
process (its tools run in its own bubblewrap sandbox). Its `ChatPolicy`
(`CellChatPolicy`) renders the chat with the model's template, then hands the
prompt ids to the driver thread and waits: the driver issues the call to the
cell the scheduler bound the execution to (directly, or through the gateway
with ``via_gateway``: routed by execution, drained on a rollout -> train
switch, re-issued on the execution's next cell, so no turn is aborted). The
cell decodes it with the bare engine (`cell_worker`, job ``call``) at
``grpo.temperature`` with a seed that depends on (seed, execution, call index)
only, so a re-issued call returns the same completion from the same weights.
The driver decodes the text, parses Qwen-style ``<tool_call>`` blocks
(`wire.parse_tool_calls`) and returns a `ChatReply`. A prompt that does not fit
the model's window comes back as a context overflow, so the scaffold compacts
(an ``X-Agent-Role: summary`` call) as it does against any endpoint.

Reward and data. Every call is kept as a `rollout.records.CallRecord` (prompt
ids as the engine saw them, generated ids, behaviour log-probs, weights
version, role). When the execution ends, its workspace is scored by the
scaffold (`envs.repo.scoring`: scored / placeholder 0 / dropped, counted per
step); a dropped execution is left out of its group's baseline and trains
nothing. When a GRPO group has finished, the advantages are
`train.advantages.grpo_advantages` over its valid members, and each
execution's records become a prefix-shared `rollout.tree.TrajectoryTree`;
`rollout.tree.select_paths` (``grpo.j_max``; None: every trainable token)
picks its paths, and each run of selected generated tokens is one
`train.grpo.TurnSample` (its prefix on the path as context, its recorded
log-probs as behaviour), trained once even where paths share it. The train
cells run them through the existing micro-batch / optimizer-step machinery
(token weights 1/(N·n_j), the core's N/M scale at the sync, as ALFWorld's).

Checkpoints: finished executions are kept; an execution live at a job
checkpoint restarts from its beginning on resume (its sandbox workspace is not
checkpointed), counted as ``restarted_executions``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evoharness.envs.repo.policies import ChatReply, ToolCall
from evoharness.envs.repo.scaffold import run_repo_episode
from evoharness.rollout.records import CallRecord
from evoharness.rollout.tree import PathSelection, TrajectoryTree, select_paths
from evoharness.runtime.alfworld_backend import AlfworldBackend, cell_grpo, step_record
from evoharness.runtime.cells import Role
from evoharness.runtime.local_backend import LocalModelBackend
from evoharness.runtime.replicas import AllReduceAlfworldBackend
from evoharness.runtime.wire import parse_tool_calls
from evoharness.config.sim import SimConfig
from evoharness.train.advantages import grpo_advantages
from evoharness.train.grpo import TurnSample


@dataclass
class _Ask:
    """One model call an episode thread waits on (issued, and re-issued as is, by the driver thread)."""

    prompt_ids: list[int]
    role: str
    seed: int
    messages: list[dict[str, Any]]
    fut: Future = field(default_factory=Future)
    t_start: float = 0.0          # wall clock at the first issue (CallRecord.t_start)


class CellCallsClosed(RuntimeError):
    """The backend closed while an episode waited on a model call."""


class CellChatPolicy:
    """The scaffold's `ChatPolicy` for execution `e`: calls answered by the runtime's cells.

    Never raises (the `ChatPolicy` contract): an overlong prompt is a context overflow,
    a closed backend a model error.
    """

    name = "runtime"

    def __init__(self, backend: RepoBackend, e: int):
        self.be, self.e, self.n_calls = backend, e, 0

    def complete(self, messages, tools, *, execution_id, role, task) -> ChatReply:
        be = self.be
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        kw = {"tools": tools} if tools else {}
        try:
            with be.tok_lock:
                text = be.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
                ids = be.tok(text, add_special_tokens=False)["input_ids"]
        except Exception as exc:  # noqa: BLE001 -- a template that cannot render these messages
            return ChatReply(finish_reason="error", error=f"cannot render the chat: {type(exc).__name__}: {exc}")
        if len(ids) + be.rl.max_new_tokens > be.max_model_len:
            return ChatReply(finish_reason="error", context_overflow=True,
                             error=f"context_length_exceeded: prompt {len(ids)} + max_new_tokens "
                                   f"{be.rl.max_new_tokens} > {be.max_model_len}")
        ask = _Ask(ids, role, call_seed(be.rl.seed, self.e, self.n_calls), messages)
        self.n_calls += 1
        be._asks.put(("call", self.e, ask))
        try:
            return ask.fut.result()
        except CellCallsClosed as exc:
            return ChatReply(finish_reason="error", error=str(exc))

    def close(self) -> None:
        pass


def call_seed(seed: int, execution: int, call: int) -> int:
    """The sampling seed of call `call` of execution `execution` (independent of cell and timing)."""
    return ((seed * 1_000_003 + execution) * 100_003 + call) & 0x7FFFFFFF


def tree_samples(tree: TrajectoryTree, sel: PathSelection, advantage: float, group: int | None = None) -> list[TurnSample]:
    """Training rows of `tree`'s selected paths: each maximal run of generated tokens on a
    selected root-to-leaf path is one `TurnSample` whose prompt is the path before it; a node
    shared by several selected paths is trained on the first only (QwenGyre §3: a shared
    prefix trains once). Log-probs are the recorded behaviour ones; context is never trained."""
    seen: set[int] = set()
    rows: list[TurnSample] = []
    for leaf in sel.leaves:
        seq: list[int] = []
        lps: list[float] = []
        train: list[bool] = []
        for n in tree.path(leaf):
            node, fresh = tree.nodes[n], n not in seen
            seen.add(n)
            seq += node.tokens
            lps += node.logprobs
            train += [fresh and g >= 0 for g in node.gen_call]
        i = 0
        while i < len(seq):
            if not train[i]:
                i += 1
                continue
            j = i
            while j < len(seq) and train[j]:
                j += 1
            rows.append(TurnSample(seq[:i], seq[i:j], lps[i:j], float(advantage), tree.execution_id, group=group))
            i = j
    return rows


_OUTCOME = ("reward", "score_status", "stop_reason", "passed", "n_tests", "score_attempts", "tool_calls", "tool_errors",
            "model_calls", "compactions", "prompt_tokens", "completion_tokens", "wall_s", "model_s", "tool_s",
            "score_s", "error")


class RepoBackend(AlfworldBackend):
    """K cell processes playing GRPO on repository tasks (`cfg.env = "repo"`).

    Args:
        sim: the runtime's batch shape (``workload.groups_per_step`` = P tasks, ``group_size`` = G).
        roles: the scheduler's initial roles.
        cfg: the RL config (`train.rl.RLConfig`: model, ``max_new_tokens``, ``grpo``, ``repo.agent``).
        tasks / order: the `envs.repo.task.RepoTask`s and their shuffled order.
        store: unused (ALFWorld's experience store; kept for the constructor's shape).
        work_dir: weights, gradients, the trace and ``episodes/e<N>/`` (workspace, transcript).
        on_step: called with each step's metrics record at its weight sync.
        via_gateway: each call goes through the gateway, routed to the execution's cell.
        state: a job checkpoint's `state()` to carry on from.

    Raises:
        ValueError: ``grpo.mini_batches`` > 1 (the streaming trainer makes one update per step).
    """

    def __init__(self, sim: SimConfig, roles: list[Role], cfg: Any, tasks: list, order: list[int], store: Any,
                 work_dir: str, on_step: Callable[[dict], None] | None = None, env_timeout_s: float = 120.0,
                 ready_timeout_s: float = 300.0, state: dict[str, Any] | None = None, via_gateway: bool = False):
        from transformers import AutoConfig

        from evoharness.models.init import load_tokenizer

        g = cfg.grpo
        self._bind_job(cfg, tasks, order, store, on_step, env_timeout_s)
        if not tasks:
            raise ValueError("no repository tasks to train on")
        self.tok = load_tokenizer(cfg.model_path)
        self.tok_lock = threading.Lock()    # a fast tokenizer used from several threads can fail ("Already borrowed")
        self.max_model_len = int(AutoConfig.from_pretrained(cfg.model_path).max_position_embeddings)
        # the cells serve bare-engine calls (no ALFWorld policy); "grpo" is their loss and optimizer
        self._options = {"grpo": cell_grpo(cfg).model_dump(), "version": state["alf"]["newest"] if state else 0}
        self.live: dict = {}                        # (ALFWorld's live episodes: none here)
        self._asks: queue.Queue = queue.Queue()     # episode threads -> driver thread
        self._ask: dict[int, _Ask] = {}             # execution -> the call it waits on
        self._threads: dict[int, threading.Thread] = {}
        self.started: dict[int, int] = {}          # execution -> times its episode was started
        self.outcome: dict[int, dict[str, Any]] = {}     # finished execution -> its episode's outcome
        self.calls: dict[int, list[CallRecord]] = {}     # execution -> its model calls
        self._samples: dict[int, list[dict]] = {}
        self._rewards: dict[int, float | None] = {}
        self._adv: dict[int, float] = {}
        self._tree: dict[int, dict[str, int]] = {}       # execution -> tree sizes (calls, tokens, trainable, selected)
        self._trained: dict[int, set[int]] = {}
        self._t0 = time.monotonic()
        self._call_t: dict[int, list[list[float]]] = {}
        self._last_sync = time.monotonic()
        self.records: list[dict] = []
        LocalModelBackend.__init__(self, sim, roles, cfg.model_path, work_dir, lr=g.lr, time_scale=1.0,
                                   ready_timeout_s=ready_timeout_s, state=state, via_gateway=via_gateway)
        self.counts.setdefault("restarted_executions", 0)

    # ---- executions: repository episodes on threads -----------------------------------
    def _launch(self, e: int) -> None:
        """Start execution e's episode thread (its first call arrives on `_asks`)."""
        task, xid, _ = self._spec(e)
        self.started[e] = self.started.get(e, 0) + 1
        self.calls[e] = []
        self._call_t[e] = []
        workdir = Path(self.work_dir) / "episodes" / f"e{e}"
        workdir.mkdir(parents=True, exist_ok=True)
        policy = CellChatPolicy(self, e)

        def play() -> None:
            try:
                ep = run_repo_episode(task, policy, workdir, self.rl.repo.agent, execution_id=xid)
                out: dict[str, Any] = {k: getattr(ep, k) for k in _OUTCOME}
            except Exception as exc:  # noqa: BLE001 -- a harness fault ends this execution, not the run
                out = {"reward": None, "score_status": "dropped", "stop_reason": "error", "model_calls": policy.n_calls,
                       "error": f"{type(exc).__name__}: {exc}"[:500]}
            self._asks.put(("done", e, out))

        t = threading.Thread(target=play, name=f"repo-e{e}", daemon=True)
        self._threads[e] = t
        t.start()

    def _start_call(self, e: int) -> None:
        if e not in self._threads:
            self._launch(e)
        ask = self._ask.get(e)
        if ask is None:                 # the episode is between calls (tools, scoring): its next message wakes it
            self.x_state[e] = "tool"
            return
        if not ask.t_start:             # a new call (not a re-issue)
            ask.t_start = time.time()
            self._call_t[e].append([time.monotonic() - self._t0, 0.0])
        self.x_call[e] = self._issue(e, (ask.prompt_ids, self.rl.max_new_tokens, ask.seed, self.rl.grpo.temperature))
        self.x_state[e] = "call"
        self.counts["calls"] += 1

    def _call_done(self, e: int, cell: int, result: Any) -> None:
        ids, lps, version = result
        ask = self._ask.pop(e)
        self._call_t[e][-1][1:] = [time.monotonic() - self._t0, cell]
        stop = set(getattr(self.tok, "all_special_ids", []))
        with self.tok_lock:
            text = self.tok.decode([t for t in ids if t not in stop], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
        content, calls = parse_tool_calls(text)
        finish = "tool_calls" if calls else ("stop" if ids and ids[-1] in stop else "length")
        self.calls[e].append(CallRecord(
            execution_id=self._spec(e)[1], call_id=f"{self._spec(e)[1]}#c{len(self.calls[e])}", role=ask.role,
            model=self.model_dir, prompt_token_ids=list(ask.prompt_ids), completion_token_ids=list(ids),
            logprobs=list(lps), policy_version=int(version), finish_reason=finish, t_start=ask.t_start,
            t_end=time.time(), tool_calls=calls, messages=[]))
        ask.fut.set_result(self._answer(e, ask, ChatReply(
            content=content or "", tool_calls=[ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                                               for c in calls],
            prompt_tokens=len(ask.prompt_ids), completion_tokens=len(ids), finish_reason=finish)))

    def _answer(self, e: int, ask: _Ask, reply: ChatReply) -> ChatReply:
        """What the agent of execution `e` reads for this call: the model's reply (a seam for
        tests that script the agent's actions while the model's tokens are still recorded)."""
        return reply

    def _pump(self) -> None:
        """Also take the episode threads' messages: a new call to issue, or an episode's end."""
        super()._pump()
        while True:
            try:
                kind, e, payload = self._asks.get_nowait()
            except queue.Empty:
                break
            if kind == "call":
                self._ask[e] = payload
            else:
                self.outcome[e] = payload
                self._threads.pop(e, None)
            if self.x_state.get(e) == "tool":
                self._start_tool(e, 0.0)        # `_on_tool` moves it on now

    def _next_reply(self, timeout: float) -> tuple | None:
        # episode threads post on a queue the cells' pipes cannot wake: look at it often
        return super()._next_reply(min(timeout, 0.01) if self._threads else timeout)

    def _on_tool(self, e: int) -> None:
        if self.x_state.get(e) != "tool":
            return                              # a second wake-up of a turn already moved on
        if e in self.outcome or e in self._ask:
            super()._on_tool(e)                 # finished, or its next call is issued (or waits for a bind)

    def _last_turn(self, e: int) -> bool:
        return e in self.outcome

    def _tokens(self, e: int) -> int:
        return max(1, sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in self.calls.get(e, [])))

    def trajectories(self) -> dict[int, dict[str, Any]]:
        """The finished executions' outcomes (`envs.repo.scaffold.RepoEpisode` fields)."""
        return dict(self.outcome)

    # ---- rewards, trees, samples -------------------------------------------------------
    def _score_group(self, group: int) -> None:
        members = list(range(group * self.gs, (group + 1) * self.gs))
        if any(m not in self.outcome for m in members):
            raise RuntimeError(f"group {group} trained before all its members finished (GRPO needs the group)")
        g, step = self.rl.grpo, group * self.gs // self.N
        rewards = [self.outcome[m]["reward"] for m in members]
        valid = torch.tensor([[r is not None for r in rewards]])
        r = torch.tensor([[0.0 if x is None else float(x) for x in rewards]], dtype=torch.float32)
        a = g.advantage
        adv = grpo_advantages(r, a.normalize_std, a.eps, a.std_floor, valid)[0].tolist()
        for m, rew, am in zip(members, rewards, adv):
            self._rewards[m], self._adv[m] = rew, am
            recs = self.calls.get(m, [])
            if rew is None or not recs:         # dropped (unpunished, untrained) or no call made
                self._samples[m] = []
                self._tree[m] = {"calls": len(recs), "tokens": 0, "trainable": 0, "selected": 0}
                continue
            tree = TrajectoryTree.from_records(recs)
            sel = select_paths(tree, g.j_max, seed=step)
            rows = tree_samples(tree, sel, am, group=group)
            self._tree[m] = {"calls": len(recs), "tokens": tree.n_tokens, "trainable": tree.n_trainable,
                             "selected": sel.n_tokens}
            self._samples[m] = [dict(vars(s)) for s in rows]

    def _step_done(self, version: int) -> None:
        """Weights `version` are live: record the step (the batch trained on version - 1)."""
        execs = sorted(self._trained.pop(version - 1, set()))
        train = [r for r in self.train_stats if r.get("version") == version - 1]
        self.train_stats = [r for r in self.train_stats if r.get("version") != version - 1]
        step = self.step_stats[-1] if self.step_stats else {}
        m = max(1, sum(1 for e in execs if self._samples.get(e)))
        upd = {k: v for k, v in step_record([], [], train, step, self.N / m).items() if k.startswith("train/")}
        outs = [self.outcome[e] for e in execs]
        n = max(1, len(outs))
        scored = [o["reward"] for o in outs if o["reward"] is not None]
        stops: dict[str, int] = {}
        for o in outs:
            stops[o["stop_reason"]] = stops.get(o["stop_reason"], 0) + 1
        groups = sorted({e // self.gs for e in execs})
        spread = sum(len({self._rewards[x] for x in range(k * self.gs, (k + 1) * self.gs)
                          if self._rewards.get(x) is not None}) > 1 for k in groups)
        trees = [self._tree.get(e, {}) for e in execs]
        now = time.monotonic()
        rec = {
            "step": version, "policy_version": version,
            "success": sum(r == 1.0 for r in scored) / n,
            "reward": sum(scored) / len(scored) if scored else 0.0,
            **{f"score/{s}": sum(o["score_status"] == s for o in outs) for s in ("scored", "placeholder", "dropped")},
            "score/retries": sum(max(0, o.get("score_attempts", 1) - 1) for o in outs),
            **{f"stop/{k}": v for k, v in sorted(stops.items())},
            "steps_per_episode": sum(o.get("model_calls", 0) for o in outs) / n,
            "tool_calls_per_episode": sum(o.get("tool_calls", 0) for o in outs) / n,
            "compactions_per_episode": sum(o.get("compactions", 0) for o in outs) / n,
            "completion_tokens_per_episode": sum(len(r.completion_token_ids) for e in execs
                                                 for r in self.calls.get(e, [])) / n,
            "rollout/env_errors": stops.get("error", 0),
            **{f"tree/{k}": sum(t.get(k, 0) for t in trees) for k in ("calls", "tokens", "trainable", "selected")},
            "tree/rows": sum(len(self._samples.get(e, [])) for e in execs),
            "adv/signal_groups": int(spread), "adv/nonzero": sum(self._adv.get(e, 0.0) != 0.0 for e in execs),
            **upd,
            # driver-side seconds summed over the batch (executions overlap: not a wall-time split)
            "timing_s/gen": sum(b - a for e in execs for a, b, *_ in self._call_t.get(e, [])),
            "timing_s/env": sum(o.get("tool_s", 0.0) + o.get("score_s", 0.0) for o in outs),
            "timing_s/train": sum(r.get("seconds", 0.0) for r in train) + step.get("seconds", 0.0),
            "timing_s/step": now - self._last_sync,
        }
        self._write_trace(execs, version)
        for e in execs:
            self._samples.pop(e, None)
            self._tree.pop(e, None)
            self.calls.pop(e, None)
        self._last_sync = now
        self.records.append(rec)
        if self.on_step is not None:
            self.on_step(rec)

    def _write_trace(self, execs: list[int], step: int) -> None:
        """Append the executions' calls to ``work_dir/trace.jsonl`` in the simulator's trace
        format (as `AlfworldBackend._write_trace`): `evoharness simulate` replays the run."""
        Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.work_dir) / "trace.jsonl", "a") as f:
            for e in execs:
                recs, times = self.calls.get(e, []), self._call_t.pop(e, [])
                if not recs:
                    continue
                turns = [{"prompt_tokens": len(r.prompt_token_ids), "completion_tokens": len(r.completion_token_ids),
                          "start": round(a, 4), "end": round(b, 4), "policy_version": r.policy_version,
                          "role": r.role, **({"cell": c[0]} if c else {})}
                         for r, (a, b, *c) in zip(recs, times)]
                task, xid, _ = self._spec(e)
                f.write(json.dumps({"step": step, "task_id": f"{task.task_id}#u{e // self.N}", "episode_id": xid,
                                    "wall_s": self.outcome[e].get("wall_s", 0.0), "turns": turns}) + "\n")

    # ---- job checkpoints ---------------------------------------------------------------
    _BOOKS = ("outcome", "calls", "_samples", "_rewards", "_adv", "_tree", "_trained", "_call_t", "newest")

    def _extra_state(self) -> dict[str, Any]:
        """Finished executions' books; a live execution restarts on resume (see the module docstring)."""
        live = set(self._threads) | set(self._ask)
        books = {k: getattr(self, k) for k in self._BOOKS}
        for k in ("outcome", "calls", "_call_t"):
            books[k] = {e: v for e, v in books[k].items() if e not in live}
        return {"alf": books}

    def _restore(self, st: dict[str, Any]) -> None:
        for k in self._BOOKS:
            setattr(self, k, st["alf"][k])
        LocalModelBackend._restore(self, st)    # a call in flight: `_start_call` starts its episode again
        for e, x in sorted(self.x_state.items()):
            if x in ("call", "tool", "wait"):
                if e not in self._threads:
                    self._launch(e)
                    if x != "call":
                        self.x_state[e] = "tool"
                self.counts["restarted_executions"] = self.counts.get("restarted_executions", 0) + 1

    def close(self) -> None:
        """Stop the episode threads (a waiting call ends them with a model error), then the cells."""
        for ask in list(self._ask.values()):
            if not ask.fut.done():
                ask.fut.set_exception(CellCallsClosed("the runtime closed"))
        while True:          # calls posted but not taken yet
            try:
                kind, _, payload = self._asks.get_nowait()
            except queue.Empty:
                break
            if kind == "call" and not payload.fut.done():
                payload.fut.set_exception(CellCallsClosed("the runtime closed"))
        for t in list(self._threads.values()):
            t.join(timeout=30)
        LocalModelBackend.close(self)


class AllReduceRepoBackend(AllReduceAlfworldBackend, RepoBackend):
    """`RepoBackend` whose fixed train cells all-reduce gradients (`runtime.replicas`; colocate, async)."""


def ray_classes() -> tuple[type, type]:
    """(`RepoBackend`, `AllReduceRepoBackend`) on Ray actors (``--backend ray``; needs the ray extra)."""
    from evoharness.runtime.ray_backend import RayCells

    class RayRepoBackend(RayCells, RepoBackend):
        def __init__(self, *args: Any, address: str | None = None, num_cpus: float = 0.25, **kw: Any):
            self._connect(address, num_cpus)
            super().__init__(*args, **kw)

    class RayAllReduceRepoBackend(RayCells, AllReduceRepoBackend):
        def __init__(self, *args: Any, address: str | None = None, num_cpus: float = 0.25, **kw: Any):
            self._connect(address, num_cpus)
            super().__init__(*args, **kw)

    return RayRepoBackend, RayAllReduceRepoBackend
