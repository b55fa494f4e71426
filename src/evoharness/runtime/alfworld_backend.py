"""The ALFWorld RL workload on cell processes: real episodes, real decoding, real GRPO gradients.

`AlfworldBackend` is `local_backend.LocalModelBackend` with the synthetic
agents replaced by the ones `train.rl` plays: execution ``e`` of RL step
``u = e // N`` is sample ``k`` of GRPO group ``g`` (``e % N = g·G + k``), the
game ``tasks[order[(u·P + g) % len(order)]]`` with episode id
``{task_id}#u{u}g{k}``, exactly the in-process loop's episode. The agent loop
(env x BPE harness) lives in the driver process, as it would behind the
gateway; each turn's model call is a `PolicyRequest` sent to the cell the
scheduler bound the execution to, where a `policies.local.LocalHFPolicy`
answers it (`runtime.cell_worker`). Sampling seeds depend on (seed, episode,
turn) only, so a call re-issued on another cell, or played in another order,
returns the same completion from the same weights.

When a GRPO group has finished, its rewards (`train.rewards`, Eq. 5-6 at epoch
u), advantages (`train.advantages.turn_advantages`) and trainable turns
(`train.grpo.turn_samples`) are computed once; a micro-batch of executions
sends their turns to a train cell with token weights 1/(N·n_j), and the core
scales the summed gradient by N/M (M: trajectories of the step batch with
trainable tokens, known at the weight sync) so the update equals
`train.grpo.grpo_step` on the whole batch (one mini-batch).

The experience store is shared by all harnesses of the driver process: frozen
while rolling out, consolidated at each weight sync (the in-process loop's
epoch boundary). Under async/elastic schedules, rollouts of the next batch may
be under way at that moment; they then read the consolidated store from their
next turn on, as they read the new weights.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from evoharness.envs.alfworld import make_env
from evoharness.harness.factory import make_harness
from evoharness.policies.base import Completion, PolicyRequest
from evoharness.rollout.episode import (EpisodeSpec, LiveEpisode, advance, close_quietly, describe_error,
                                       error_trajectory, time_limit)
from evoharness.rollout.records import Trajectory
from evoharness.runtime.cells import Role
from evoharness.runtime.events import Event, RunMicroBatch, SyncWeights, WeightSyncDone
from evoharness.runtime.local_backend import LocalModelBackend
from evoharness.config.sim import SimConfig
from evoharness.train.advantages import std_floor_active, turn_advantages, valid_members
from evoharness.config.rl import GRPOConfig, resolved_off_policy
from evoharness.train.rewards import trajectory_reward
from evoharness.runtime.inprocess import TimedEnv, experience_consolidator


def cell_grpo(cfg: Any) -> GRPOConfig:
    """The cells' loss settings: ``cfg.grpo`` with ``off_policy = "auto"`` resolved to
    decoupled PPO on the schedules that train stale samples (async, elastic-async, η > 0), and the
    lr schedule's horizon fixed to the run's steps (a cell knows versions, not the run's length)."""
    rt = cfg.runtime
    g = resolved_off_policy(cfg.grpo, stale=rt.schedule in ("async", "elastic-async") and rt.staleness > 0)
    return g if g.lr_decay_steps else g.model_copy(update={"lr_decay_steps": cfg.steps})


class AlfworldBackend(LocalModelBackend):
    """K cell processes playing `cfg`'s ALFWorld RL (an `train.rl.RLConfig`).

    Args:
        sim: the runtime's cluster and batch shape (``workload.groups_per_step`` =
            P prompts, ``group_size`` = G, ``steps``).
        roles: the scheduler's initial roles.
        cfg: the RL config (model, harness, decoding, GRPO, env).
        tasks / order: the games and their shuffled order, as `train.rl.train_rl` draws them.
        store: the experience store every harness reads (frozen here).
        work_dir: weights versions and gradients.
        on_step: called with each step's metrics record at its weight sync.
        env_timeout_s: an environment reset or step running longer ends its episode as an error.
        via_gateway: each turn's call goes through the gateway (`gateway_cells`), routed to the
            execution's cell; a rollout -> train switch drains the cell (calls re-issued, none aborted).
        state: a job checkpoint's `state()` to carry on from (then `store` is replaced
            by the checkpoint's, see ``self.store``).

    Raises:
        ValueError: a GRPO setting the streaming trainer cannot honour (mini_batches > 1).
    """

    def __init__(self, sim: SimConfig, roles: list[Role], cfg: Any, tasks: list, order: list[int], store: Any,
                 work_dir: str, on_step: Callable[[dict], None] | None = None, env_timeout_s: float = 120.0,
                 ready_timeout_s: float = 300.0, state: dict[str, Any] | None = None, via_gateway: bool = False):
        g = cfg.grpo
        self._bind_job(cfg, tasks, order, store, on_step, env_timeout_s)
        self._options = {
            "policy": dict(temperature=g.temperature, max_new_tokens=cfg.max_new_tokens,
                           max_prompt_tokens=cfg.max_prompt_tokens, constrained=cfg.constrained, seed=cfg.seed,
                           num_threads=cfg.decode_threads),
            "grpo": cell_grpo(cfg).model_dump(),
            "version": state["alf"]["newest"] if state else 0,     # the cells start on the newest weights
        }
        self.live: dict[int, LiveEpisode] = {}
        self.traj: dict[int, Trajectory] = {}       # finished executions
        self._req: dict[int, PolicyRequest] = {}   # the turn in flight (re-issued as is)
        self._comps: dict[int, list[dict]] = {}    # live execution -> its completions so far (a resume replays them)
        self._samples: dict[int, list[dict]] = {}  # execution -> its trainable turns (once its group finished)
        self._rewards: dict[int, Any] = {}         # execution -> RewardBreakdown
        self._adv_stats: dict[int, dict] = {}      # step -> GiGPO counters
        self._trained: dict[int, set[int]] = {}    # version -> executions trained on it
        self._t0 = time.monotonic()
        self._call_t: dict[int, list[list[float]]] = {}   # execution -> [first issue, reply s, cell] per turn
        self._env_s: dict[int, list[float]] = {}  # execution -> seconds in env reset/step (driver process)
        self._gen_s: dict[int, float] = {}        # execution -> seconds its calls decoded (cell process)
        self._last_sync = time.monotonic()
        self.records: list[dict] = []
        store.freeze()
        super().__init__(sim, roles, cfg.model_path, work_dir, lr=g.lr, time_scale=1.0,
                         ready_timeout_s=ready_timeout_s, state=state, via_gateway=via_gateway)

    def _bind_job(self, cfg: Any, tasks: list, order: list[int], store: Any,
                  on_step: Callable[[dict], None] | None, env_timeout_s: float) -> None:
        """Check and keep the job's RL config, tasks and callbacks (before the cells start).

        Raises:
            ValueError: ``grpo.mini_batches`` > 1 (the streaming trainer makes one update per step).
        """
        if cfg.grpo.mini_batches != 1:
            raise ValueError("the runtime path trains one update per step (grpo.mini_batches = 1)")
        self.rl, self.tasks, self.order, self.store = cfg, tasks, order, store
        self.consolidator = experience_consolidator(cfg)  # the same rule as the in-process loop
        self.on_step, self.env_timeout_s = on_step, env_timeout_s

    def _cell_args(self, cell: int) -> tuple[str, str, float, dict[str, Any]]:
        return self.model_dir, self.work_dir, self.lr, self._options

    # ---- executions: real episodes ----------------------------------------------------
    def _spec(self, e: int) -> tuple[Any, str, int]:
        step, i = divmod(e, self.N)
        group, k = divmod(i, self.gs)
        task = self.tasks[self.order[(step * self.cfg.workload.groups_per_step + group) % len(self.order)]]
        return task, f"{task.task_id}#u{step}g{k}", step

    def _cap(self, e: int) -> int:
        """Execution e's T_max (`train.rl.step_cap`)."""
        from evoharness.train.rl import step_cap

        step, i = divmod(e, self.N)
        return step_cap(self.rl, step, i // self.gs)

    def _open(self, e: int) -> bool:
        """Start execution e's episode; False when its game failed to load (an error trajectory)."""
        task, eid, _ = self._spec(e)
        hname = self.rl.harness.kind
        t0 = time.perf_counter()
        self._env_s[e], self._gen_s[e] = [0.0], 0.0
        env = None
        try:
            with time_limit(self.env_timeout_s):
                env = TimedEnv(make_env(task, engine=self.rl.engine, wording=self.rl.wording), self._env_s[e])
                first = env.reset()
            harness = make_harness(self.rl.harness, experience=self.store)
            harness.reset(task, first)
        except Exception as exc:  # a game that cannot load is a failed episode, not a crashed run
            if env is not None:
                close_quietly(env)
            self.traj[e] = error_trajectory(EpisodeSpec(task, eid, self.rl.seed), hname, "local", self._cap(e),
                                             describe_error(exc))
            return False
        traj = Trajectory(episode_id=eid, task_id=task.task_id, task_type=task.task_type, split=task.split,
                          harness=harness.name, policy="local", goal=first.goal,
                          initial_observation=first.observation, max_steps=self._cap(e), seed=self.rl.seed)
        self.live[e] = LiveEpisode(EpisodeSpec(task, eid, self.rl.seed), env, harness, traj, first, t0)
        return True

    def _start_call(self, e: int) -> None:
        if e not in self.live and e not in self.traj and not self._open(e):
            self._start_tool(e, 0.0)            # ends at once (`_last_turn`)
            return
        lv = self.live[e]
        if len(self._call_t.setdefault(e, [])) == len(lv.traj.turns):   # a new turn (not a re-issue)
            self._call_t[e].append([time.monotonic() - self._t0, 0.0])
        if e not in self._req:
            self._req[e] = PolicyRequest(lv.harness.messages(), lv.spec.episode_id, len(lv.traj.turns),
                                         list(lv.harness.admissible))
        req = self._req[e]
        payload = {"messages": req.messages, "episode_id": req.episode_id, "turn": req.turn,
                   "admissible_commands": req.admissible_commands, "meta_verbs": list(lv.harness.meta_verbs)}
        self.x_call[e] = self._issue(e, payload)
        self.x_state[e] = "call"
        self.counts["calls"] += 1

    def _call_done(self, e: int, cell: int, result: Any) -> None:
        lv, req = self.live[e], self._req.pop(e)
        self._gen_s[e] += result.pop("seconds")
        self._comps.setdefault(e, []).append(result)
        self._call_t[e][-1][1:] = [time.monotonic() - self._t0, cell]     # reply time, the cell that answered
        if not advance(lv, req, Completion(**result), self.env_timeout_s, self._cap(e)):
            lv.traj.wall_s = time.perf_counter() - lv.t0
            close_quietly(lv.env)
            self.traj[e] = lv.traj
            del self.live[e], self._comps[e]

    def _tool_delay(self, e: int) -> float:
        return 0.0                              # the environment step already ran in `_call_done`

    def _last_turn(self, e: int) -> bool:
        return e in self.traj

    def _tokens(self, e: int) -> int:
        t = self.traj.get(e) or self.live[e].traj
        return max(1, sum(x.prompt_tokens + x.completion_tokens for x in t.turns))

    def trajectories(self) -> dict[int, Trajectory]:
        """The finished executions' trajectories (TITO records per turn)."""
        return dict(self.traj)

    # ---- job checkpoints ---------------------------------------------------------------
    _BOOKS = ("traj", "_samples", "_rewards", "_adv_stats", "_trained", "_env_s", "_gen_s", "_call_t", "newest")

    def _extra_state(self) -> dict[str, Any]:
        """Taken at a weight sync (`Driver`): finished trajectories not yet recorded, the
        group scores, the store, and each live episode's completions (live envs are not
        picklable: a resume replays the completions into a fresh env and harness)."""
        return {"alf": {**{k: getattr(self, k) for k in self._BOOKS}, "store": self.store.to_dict(),
                        "comps": {e: list(self._comps.get(e, [])) for e in self.live}}}

    def _restore(self, st: dict[str, Any]) -> None:
        from evoharness.harness.bpe import ExperienceStore

        a = st["alf"]
        for k in self._BOOKS:
            setattr(self, k, a[k])
        self.store = ExperienceStore.from_dict(a["store"])
        for e, comps in sorted(a["comps"].items()):
            self._replay(e, comps)
        super()._restore(st)                  # then the calls that were in flight are issued again

    def _replay(self, e: int, comps: list[dict]) -> None:
        """Rebuild live execution e: its env and harness replay the recorded completions (no
        model call). The harness reads a scratch copy of the store meanwhile, so the store's
        pending writes, which already hold these turns', are not written twice."""
        from evoharness.harness.bpe import ExperienceStore

        env_s, gen_s = self._env_s.get(e, [0.0]), self._gen_s.get(e, 0.0)
        real, self.store = self.store, ExperienceStore.from_dict(self.store.to_dict())
        try:
            if not self._open(e):
                raise RuntimeError(f"execution {e}: its game no longer loads; cannot resume it")
        finally:
            self.store = real
        lv = self.live[e]
        for c in comps:
            req = PolicyRequest(lv.harness.messages(), lv.spec.episode_id, len(lv.traj.turns),
                                list(lv.harness.admissible))
            if not advance(lv, req, Completion(**c), self.env_timeout_s, self._cap(e)):
                raise RuntimeError(f"execution {e} ended while replaying its {len(comps)} recorded turns")
        if hasattr(lv.harness, "experience"):
            lv.harness.experience = real
        self._comps[e], self._env_s[e], self._gen_s[e] = list(comps), env_s, gen_s

    # ---- rewards, advantages, micro-batches ------------------------------------------
    def _score_group(self, group: int) -> None:
        members = range(group * self.gs, (group + 1) * self.gs)
        if any(m not in self.traj for m in members):
            raise RuntimeError(f"group {group} trained before all its members finished (GRPO needs the group)")
        from evoharness.train.grpo import turn_samples

        g, step = self.rl.grpo, group * self.gs // self.N
        trajs = [self.traj[m] for m in members]
        breakdowns = [trajectory_reward(t, step, g.reward) for t in trajs]
        rewards = torch.tensor([[b.total for b in breakdowns]], dtype=torch.float32)
        stats = self._adv_stats.setdefault(step, {})
        adv = turn_advantages([trajs], rewards, g.advantage, stats=stats)[0]
        for m, t, a, b in zip(members, trajs, adv, breakdowns):
            self._rewards[m] = b
            self._samples[m] = [dataclasses.asdict(s) for s in
                                turn_samples([t], [a], max_turns=g.max_train_turns, seed=step)]

    def _micro_batch(self, c: RunMicroBatch) -> None:
        samples = []
        for e in c.executions:
            if e not in self._samples:
                self._score_group(e // self.gs)
            n_tok = sum(len(s["completion_ids"]) for s in self._samples[e])
            samples += [dict(s, weight=1.0 / (self.N * n_tok)) for s in self._samples[e]]
        self._trained.setdefault(c.version, set()).update(c.executions)   # a re-claimed micro-batch counts once
        tok = self._send(c.cell, "train", (c.version, samples), key=c.executions)
        self.mb_tokens.setdefault(c.version, []).append(tok)

    def _sync(self, c: SyncWeights) -> None:
        v = c.version - 1
        m = sum(1 for e in self._trained.get(v, ()) if self._samples.get(e))
        self._send(0, "step", (v, self.mb_tokens.pop(v, []), self.N / m if m else 1.0),
                   key=(c.version, tuple(c.cells)))

    # ---- per-step bookkeeping --------------------------------------------------------------
    def poll(self, timeout: float) -> list[Event]:
        events = super().poll(timeout)
        for ev in events:
            if isinstance(ev, WeightSyncDone):
                self._step_done(ev.version)
        return events

    def _step_done(self, version: int) -> None:
        """Weights `version` are live: consolidate the experience store and record the step
        (the batch trained on version - 1), before the scheduler dispatches more work."""
        self.store.unfreeze()
        ops = self.store.consolidate(self.consolidator)
        self.store.freeze()
        execs = sorted(self._trained.pop(version - 1, set()))
        train = [r for r in self.train_stats if r.get("version") == version - 1]
        step = self.step_stats[-1] if self.step_stats else {}
        rec = step_record([self.traj[e] for e in execs], [self._rewards[e] for e in execs], train, step,
                          self.N / max(1, sum(1 for e in execs if self._samples.get(e))))
        self.train_stats = [r for r in self.train_stats if r.get("version") != version - 1]
        self._write_trace(execs, version)
        for e in execs:
            self._samples.pop(e, None)
        now = time.monotonic()
        groups = sorted({e // self.gs for e in execs})
        members = [[self.traj[m] for m in range(k * self.gs, (k + 1) * self.gs)] for k in groups]
        rewards = torch.tensor([[self._rewards[m].total for m in range(k * self.gs, (k + 1) * self.gs)]
                                for k in groups], dtype=torch.float32).reshape(len(groups), self.gs)
        valid = valid_members(members)
        rec.update({
            "step": version, "experience_ops": len(ops), "experience_epoch": self.store.epoch,
            "policy_version": version, "constrained": self.rl.constrained,
            "adv/signal_groups": int(sum(len(set(row[v].tolist())) > 1 for row, v in zip(rewards, valid))),
            "adv/std_floor_groups": int(std_floor_active(rewards, self.rl.grpo.advantage, valid).sum()),
            **{f"adv/{k}": v for k, v in self._adv_stats.pop(version - 1, {}).items()},
            # cell-seconds and driver seconds summed over the batch (cells overlap: not a wall-time split)
            "timing_s/env": sum(self._env_s.pop(e, [0.0])[0] for e in execs),
            "timing_s/gen": sum(self._gen_s.pop(e, 0.0) for e in execs),
            "timing_s/train": sum(r.get("seconds", 0.0) for r in train) + step.get("seconds", 0.0),
            "timing_s/step": now - self._last_sync,
        })
        self._last_sync = now
        self.records.append(rec)
        if self.on_step is not None:
            self.on_step(rec)

    def _write_trace(self, execs: list[int], step: int) -> None:
        """Append the executions' call trace to ``work_dir/trace.jsonl``, one trajectory a line in
        the simulator's trace format (docs/simulator.md: prompt/completion tokens and start/end
        seconds per call), so `evoharness simulate --workload` can replay this run."""
        import json
        from pathlib import Path

        Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.work_dir) / "trace.jsonl", "a") as f:
            for e in execs:
                t, times = self.traj[e], self._call_t.pop(e, [])
                if not t.turns:
                    continue
                turns = [{"prompt_tokens": x.prompt_tokens, "completion_tokens": x.completion_tokens,
                          "start": round(a, 4), "end": round(b, 4), "policy_version": x.policy_version,
                          **({"cell": c[0]} if c else {})}
                         for x, (a, b, *c) in zip(t.turns, times)]
                f.write(json.dumps({"step": step, "task_id": f"{t.task_id}#u{e // self.N}", "episode_id": t.episode_id,
                                    "wall_s": t.wall_s, "turns": turns}) + "\n")

    def close(self) -> None:
        for lv in self.live.values():
            close_quietly(lv.env)
        super().close()


def step_record(trajs: list[Trajectory], breakdowns: list, train: list[dict], step: dict, scale: float) -> dict:
    """One RL step's metrics under `train.rl`'s names: rollout (success, reward and its
    terms, steps, tokens, harness calls) over the trained batch, and the update
    (train cells' micro-batch sums, times the batch's token-weight `scale`; the core's grad norm)."""
    n = max(1, len(trajs))
    flat = [b.as_dict() for b in breakdowns]
    tot: dict[str, float] = {}
    for r in train:
        for k, v in r.items():
            if k not in ("version", "seconds"):
                tot[k] = max(tot.get(k, 0.0), v) if k == "ratio_max" else tot.get(k, 0.0) + v
    ntok = max(1.0, tot.get("n_tokens", 0.0))
    return {
        "success": sum(t.won for t in trajs) / n,
        # float32 mean, as `train.rl` averages its [P, G] reward tensor
        "reward": float(torch.tensor([b["total"] for b in flat], dtype=torch.float32).mean()) if flat else 0.0,
        **{f"reward/{k}": sum(float(b[k]) for b in flat) / n for k in (flat[0] if flat else {}) if k != "solved"},
        "steps_per_episode": sum(t.steps for t in trajs) / n,
        "completion_tokens_per_episode": sum(t.completion_tokens for t in trajs) / n,
        "invalid_per_episode": sum(t.invalid_actions for t in trajs) / n,
        **{f"harness/{v}_per_episode": sum(t.meta_calls[v] for t in trajs) / n
           for v in ("track", "commit", "recall", "note")},
        "rollout/env_errors": sum(t.stop_reason == "error" for t in trajs),
        "prompt/fitted_turns": sum(t.info.get("prompt_fit", {}).get("turns", 0) for t in trajs),
        "prompt/cut_tokens": sum(t.info.get("prompt_fit", {}).get("tokens_cut", 0) for t in trajs),
        **{f"train/{k}": tot.get(k, 0.0) * scale for k in ("loss", "pg_loss", "kl", "entropy")},
        "train/clip_fraction": tot.get("n_clipped", 0.0) / ntok, "train/ratio_mean": tot.get("ratio_sum", 0.0) / ntok,
        "train/ratio_max": tot.get("ratio_max", 0.0), "train/n_tokens": int(tot.get("n_tokens", 0)),
        "train/forced_fraction": tot.get("n_forced", 0.0) / ntok, "train/grad_norm": step.get("grad_norm", 0.0),
        "train/lr": step.get("lr", 0.0),
    }
