"""The ALFWorld RL recipe: which games a run trains on, how its agents play them, and what a cell
with the policy does (EvoHarness-RL §4, Table 4).

- task helpers: `train_tasks`, `select_tasks`, `spread`, `branch_starts`, `step_cap`, `quick_eval`,
  `load_experience_fresh`, `experience_consolidator`;
- `AlfworldWorkload`: the agents of a run (`runtime.cell_backend.AgentWorkload`). Execution
  ``e`` of RL step ``u = e // N`` is sample ``k`` of GRPO group ``g`` (``e % N = g·G + k``): the
  game ``tasks[order[(u·P + g) % len(order)]]``, episode id ``{task_id}#u{u}g{k}``; with branches
  every other group of the run starts from the next branch state instead. The agent loop (env x
  BPE harness) lives in the driver process, as it would behind the gateway; each turn's model
  call is a request a cell answers. Sampling seeds depend on (seed, episode, turn) only, so a call
  re-issued on another cell, or batched with other calls, returns the same completion from the
  same weights. A finished group is scored once (`train.step.score_group`).
- `PolicyCell`: a cell's parts (`runtime.cell.CellParts`): a `policies.local.LocalHFPolicy` that
  answers the calls and a `train.trainer.Trainer` (with the KL reference and the SFT anchor)
  over the same weights.

The experience store is shared by all harnesses of the driver process: frozen while rolling out,
consolidated at each weight sync. Under async schedules rollouts of the next batch may be under
way at that moment; they read the consolidated store from their next turn on, as they read the
new weights.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig, RLConfig, resolved_off_policy
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.factory import make_harness
from evoharness.policies.base import Completion, PolicyRequest
from evoharness.recipes.trained_cell import TrainedCell, adapt, base_weights
from evoharness.rollout.episode import (
    EpisodeSpec,
    LiveEpisode,
    advance,
    close_quietly,
    describe_error,
    error_trajectory,
    replayed,
    run_episodes,
    time_limit,
)
from evoharness.rollout.records import Trajectory
from evoharness.train.checkpoint import get_rng_state, set_rng_state
from evoharness.train.step import (
    GroupScore,
    group_metrics,
    lr_at,
    merged_update_metrics,
    plan_updates,
    rollout_metrics,
    score_group,
    stream_scale,
    streamed_rows,
    streams,
    turn_rows,
)

# ---- the games --------------------------------------------------------------------------------


def load_experience_fresh(path: str | Path | None) -> Any:
    """A trainable (unfrozen) experience store: from `path`, or the seeded default."""
    from evoharness.harness.bpe import ExperienceStore

    return ExperienceStore.load(path) if path else ExperienceStore()


def experience_consolidator(cfg: RLConfig) -> Any:
    """The consolidator a run applies to its experience store at each weight sync: none when
    ``consolidate_experience`` is off (the store stays fixed), the LLM consolidator when
    ``llm_consolidator`` names an endpoint, else None (the store's rules)."""
    if not cfg.consolidate_experience:
        from evoharness.harness.bpe.experience import NoConsolidation

        return NoConsolidation()
    if cfg.llm_consolidator:
        from evoharness.harness.bpe.llm_consolidator import LLMConsolidator

        return LLMConsolidator(**cfg.llm_consolidator.model_dump())
    return None


def select_tasks(tasks: list, task_types: list[str] | None) -> list:
    """The tasks of the given types (all when None).

    Raises:
        ValueError: a type that names no task (a typo would silently train on nothing).
    """
    if task_types is None:
        return tasks
    known = {t.task_type for t in tasks}
    if unknown := sorted(set(task_types) - known):
        raise ValueError(f"task_types {unknown} match no game; known: {sorted(known)}")
    return [t for t in tasks if t.task_type in task_types]


def spread(tasks: list, n: int | None) -> list:
    """``n`` tasks evenly spaced over the (type-sorted) list, so a short evaluation covers every
    type instead of the first one; all when None."""
    if not n or n >= len(tasks):
        return tasks
    return [tasks[i * len(tasks) // n] for i in range(n)]


def train_tasks(cfg: RLConfig) -> list:
    """The games RL trains on: ``cfg.split`` of the given task types, less ``exclude_games``, and
    only ``games`` when set.

    Raises:
        ValueError: ``games`` names a task id not in the split (or excluded, or of another type).
        GameDataError: a bad data path or split.
    """
    excluded = set(cfg.exclude_games)
    tasks = [
        t for t in select_tasks(discover_games(cfg.split, cfg.data_path), cfg.task_types) if t.task_id not in excluded
    ]
    if cfg.games is None:
        return tasks
    wanted = set(cfg.games)
    tasks = [t for t in tasks if t.task_id in wanted]
    if len(tasks) != len(wanted):
        raise ValueError(
            f"{len(wanted) - len(tasks)} of the {len(wanted)} RL games are not trainable games of "
            f"split {cfg.split!r} (unknown, excluded, or not of task_types)"
        )
    return tasks


def branch_starts(cfg: RLConfig) -> list[tuple]:
    """``cfg.branches`` as ``(TaskSpec, prefix)`` pairs, each game looked up in ``cfg.split``.

    Raises:
        ValueError: a branch of a game not in the split, or of an excluded (development) game.
    """
    if not cfg.branches:
        return []
    by_id = {t.task_id: t for t in discover_games(cfg.split, cfg.data_path)}
    excluded = set(cfg.exclude_games)
    bad = sorted({b.task_id for b in cfg.branches if b.task_id not in by_id or b.task_id in excluded})
    if bad:
        raise ValueError(
            f"{len(bad)} branch game(s) are not trainable games of split {cfg.split!r} (unknown or excluded): {bad[:3]}"
        )
    return [(by_id[b.task_id], tuple(b.prefix)) for b in cfg.branches]


def step_cap(cfg: RLConfig, step: int, group: int, replayed_turns: int = 0) -> int:
    """T_max of group `group` (0..P-1) of RL step `step`: ``max_steps``, or the ``step_caps`` mix;
    for a branch that replays `replayed_turns` turns, at most ``replayed_turns + branch_turns``."""
    caps = cfg.step_caps
    cap = caps[(step * cfg.grpo.prompts_per_step + group) % len(caps)] if caps else cfg.max_steps
    return min(cap, replayed_turns + cfg.branch_turns) if replayed_turns and cfg.branch_turns else cap


def quick_eval(cfg: RLConfig, policy: Any, store: Any) -> dict[str, float]:
    """Greedy success on ``eval_limit`` games spread over the eval split (the training task types).

    An evaluation changes no training state: it reads a frozen copy of the experience store
    (its writes are dropped with the copy), and the policy's temperature, train/eval mode and the
    global RNG states are restored.
    """
    from evoharness.harness.bpe import ExperienceStore

    tasks = spread(select_tasks(discover_games(cfg.eval_split, cfg.data_path), cfg.task_types), cfg.eval_limit)
    snapshot = ExperienceStore.from_dict(store.to_dict())
    snapshot.freeze()
    temp, training, rng = policy.temperature, policy.model.training, get_rng_state()
    policy.temperature = 0.0
    policy.model.eval()
    try:
        trajs = run_episodes(
            [EpisodeSpec(t, f"{t.task_id}#eval", cfg.seed) for t in tasks],
            make_env=lambda task: make_env(task, engine=cfg.engine, wording=cfg.wording),
            make_harness=lambda: make_harness(cfg.harness, experience=snapshot),
            policy=policy,
            max_steps=cfg.max_steps,
        )
    finally:
        policy.temperature = temp
        policy.model.train(training)
        set_rng_state(rng)
    return {
        "eval/success": sum(t.won for t in trajs) / len(trajs),
        "eval/n": len(trajs),
        "eval/experience_writes_dropped": len(snapshot.pending),
    }


def train_grpo(cfg: RLConfig) -> GRPOConfig:
    """The GRPO settings of a run: ``cfg.grpo`` with ``off_policy = "auto"`` resolved (decoupled
    PPO on the schedules that train stale samples), and the lr schedule's horizon and λ_div's
    decay U (Eq. 6) the run's steps unless set (a cell knows versions, not the run's length)."""
    rt = cfg.runtime
    g = resolved_off_policy(cfg.grpo, stale=rt.schedule in ("async", "elastic-async") and rt.staleness > 0)
    reward = g.reward if g.reward.div_epochs else g.reward.model_copy(update={"div_epochs": cfg.steps})
    return g.model_copy(update={"lr_decay_steps": g.lr_decay_steps or cfg.steps, "reward": reward})


class _TimedEnv:
    """An env whose reset/step wall time adds to a counter (``clock[0]``)."""

    def __init__(self, env: Any, clock: list[float]) -> None:
        self._env, self._clock, self.task = env, clock, env.task

    def _timed(self, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._clock[0] += time.perf_counter() - t

    def reset(self):
        return self._timed(self._env.reset)

    def step(self, action):
        return self._timed(self._env.step, action)

    def facts(self):
        return self._env.facts()

    def close(self) -> None:
        self._env.close()


# ---- the agents --------------------------------------------------------------------------------


class AlfworldWorkload:
    """The ALFWorld agents of an RL run (module docstring; `runtime.cell_backend.AgentWorkload`).

    Args:
        cfg: the run's config.
        tasks / order: the games and their shuffled order.
        store: the experience store every harness reads.
        branches: ``(task, prefix)`` start states (`branch_starts`).
        env_timeout_s: an env reset or step taking longer ends the episode as an error.
    """

    def __init__(
        self,
        cfg: RLConfig,
        tasks: list,
        order: list[int],
        store: Any,
        branches: list | None = None,
        env_timeout_s: float = 120.0,
    ):
        self.cfg, self.grpo = cfg, train_grpo(cfg)
        self.tasks, self.order, self.store, self.branches = tasks, order, store, branches or []
        self.P, self.G = cfg.grpo.prompts_per_step, cfg.grpo.group_size
        self.N = self.P * self.G
        self.env_timeout_s = env_timeout_s
        self.consolidator = experience_consolidator(cfg)
        self.live: dict[int, LiveEpisode] = {}
        self.traj: dict[int, Trajectory] = {}  # finished executions
        self._req: dict[int, PolicyRequest] = {}  # the turn in flight (re-issued as is)
        self._comps: dict[int, list[dict]] = {}  # live execution -> its completions (a resume replays them)
        self._scores: dict[int, GroupScore] = {}  # run's group index -> its score (once all members finished)
        self._env_s: dict[int, list[float]] = {}  # execution -> seconds in env reset/step
        self._gen_s: dict[int, float] = {}  # execution -> cell-seconds its calls decoded
        self._last_sync = time.monotonic()
        store.freeze()

    # ---- executions ------------------------------------------------------------------------
    def spec(self, e: int) -> EpisodeSpec:
        step, i = divmod(e, self.N)
        g, k = divmod(i, self.G)
        n = step * self.P + g  # the run's n-th group
        if self.branches:  # odd groups start from the branches
            if n % 2:
                task, prefix = self.branches[n // 2 % len(self.branches)]
                return EpisodeSpec(task, f"{task.task_id}@{len(prefix)}#u{step}g{k}", self.cfg.seed, prefix)
            n //= 2
        task = self.tasks[self.order[n % len(self.order)]]
        return EpisodeSpec(task, f"{task.task_id}#u{step}g{k}", self.cfg.seed)

    def cap(self, e: int) -> int:
        step, i = divmod(e, self.N)
        return step_cap(self.cfg, step, i // self.G, len(self.spec(e).prefix))

    def start(self, e: int) -> None:
        """Open e's episode (a game that fails to load ends it as an error trajectory)."""
        spec, cfg = self.spec(e), self.cfg
        t0 = time.perf_counter()
        self._env_s[e], self._gen_s[e] = [0.0], 0.0
        env = None
        try:
            with time_limit(self.env_timeout_s):
                env = _TimedEnv(make_env(spec.task, engine=cfg.engine, wording=cfg.wording), self._env_s[e])
                first = env.reset()
            harness = make_harness(cfg.harness, experience=self.store)
            harness.reset(spec.task, first)
        except Exception as exc:  # a game that cannot load is a failed episode, not a crashed run
            if env is not None:
                close_quietly(env)
            self.traj[e] = error_trajectory(spec, cfg.harness.kind, "local", self.cap(e), describe_error(exc))
            return
        traj = Trajectory(
            episode_id=spec.episode_id,
            task_id=spec.task.task_id,
            task_type=spec.task.task_type,
            split=spec.task.split,
            harness=harness.name,
            policy="local",
            goal=first.goal,
            initial_observation=first.observation,
            max_steps=self.cap(e),
            seed=cfg.seed,
        )
        self.live[e] = LiveEpisode(spec, env, harness, traj, first, t0)
        self._replay_prefix(e)

    def _replay_prefix(self, e: int) -> None:
        """A branch's first turns replay its prefix (no model call)."""
        lv = self.live[e]
        while (comp := replayed(lv)) is not None:
            if not self._advance(e, self._request(lv), comp):
                return

    @staticmethod
    def _request(lv: LiveEpisode) -> PolicyRequest:
        return PolicyRequest(lv.harness.messages(), lv.spec.episode_id, len(lv.traj.turns), list(lv.harness.admissible))

    def _advance(self, e: int, req: PolicyRequest, comp: Completion) -> bool:
        lv = self.live[e]
        if advance(lv, req, comp, self.env_timeout_s, self.cap(e)):
            return True
        lv.traj.wall_s = time.perf_counter() - lv.t0
        close_quietly(lv.env)
        self.traj[e] = lv.traj
        del self.live[e]
        self._comps.pop(e, None)
        return False

    def request(self, e: int) -> dict[str, Any] | None:
        if e not in self.live:
            return None
        lv = self.live[e]
        req = self._req.setdefault(e, self._request(lv))
        return {
            "messages": req.messages,
            "episode_id": req.episode_id,
            "turn": req.turn,
            "admissible_commands": req.admissible_commands,
            "meta_verbs": list(lv.harness.meta_verbs),
        }

    def reply(self, e: int, result: dict[str, Any]) -> None:
        comp = dict(result["result"])
        self._gen_s[e] += result["seconds"]
        self._comps.setdefault(e, []).append(comp)
        self._advance(e, self._req.pop(e), Completion(**comp))

    def tool_delay(self, e: int) -> float:
        return 0.0  # the env step already ran in `reply`

    def finished(self, e: int) -> bool:
        return e in self.traj

    def woken(self) -> list[int]:
        return []

    def _trajectory(self, e: int) -> Trajectory:
        return self.traj[e] if e in self.traj else self.live[e].traj

    def tokens(self, e: int) -> int:
        return sum(x.prompt_tokens + x.completion_tokens for x in self._trajectory(e).turns)

    def calls(self, e: int) -> list[dict[str, Any]]:
        t = self._trajectory(e)
        return [
            {
                "prompt_tokens": x.prompt_tokens,
                "completion_tokens": x.completion_tokens,
                "policy_version": x.policy_version,
            }
            for x in t.turns[t.info.get("replayed_turns", 0) :]
        ]

    def trace_key(self, e: int) -> tuple[str, str, float]:
        t = self.traj[e]
        return t.task_id, t.episode_id, t.wall_s

    # ---- training ---------------------------------------------------------------------------
    def _score(self, group: int) -> GroupScore:
        """Group `group` of the run (all members finished), scored once."""
        if group not in self._scores:
            members = range(group * self.G, (group + 1) * self.G)
            if missing := [m for m in members if m not in self.traj]:
                raise RuntimeError(f"group {group} trained before its members {missing} finished")
            step, n = divmod(group, self.P)
            positive = self.cfg.branch_advantage == "positive" and bool(self.spec(group * self.G).prefix)
            self._scores[group] = score_group([self.traj[m] for m in members], step, self.grpo, positive)
        return self._scores[group]

    def _rows(self, e: int) -> list:
        g = e // self.G
        return turn_rows(self.traj[e], self._score(g).advantages[e % self.G], self.grpo, e // self.N, group=g)

    def micro_batch(self, executions: Sequence[int], version: int) -> list | None:
        if not streams(self.grpo):
            return None
        return streamed_rows([r for e in executions for r in self._rows(e)], self.N)

    def sync(self, version: int, executions: Sequence[int], ranks: int) -> list[dict[str, Any]]:
        """Step ``version - 1``'s update plan for each of `ranks` train ranks: the whole batch's
        updates (`train.step.plan_updates`), each update's rows dealt round-robin over the ranks
        (their token weights are set over the whole update, so the ranks' gradients sum to it);
        streamed (one update per step): no rows, the summed gradient times N/M."""
        step = version - 1
        plan = {"lr": lr_at(self.grpo, step, self.cfg.steps), "step": step}
        if streams(self.grpo):
            m = sum(1 for e in executions if self._rows(e))
            return [dict(plan, updates=[], scale=stream_scale(self.N, m)) for _ in range(ranks)]
        updates = plan_updates([r for e in sorted(executions) for r in self._rows(e)], self.grpo)
        return [dict(plan, updates=[u[r::ranks] for u in updates], scale=1.0) for r in range(ranks)]

    def step_done(
        self, version: int, executions: Sequence[int], stats: dict[str, Any], timing: dict[str, float]
    ) -> dict[str, Any]:
        """Step ``version - 1`` trained (`stats`: `train.step.merged_update_metrics`' arguments):
        consolidate the experience store and return the step's metrics record."""
        self.store.unfreeze()
        ops = self.store.consolidate(self.consolidator)  # epoch + 1: continues from the store's collect epochs
        self.store.freeze()
        execs = sorted(executions)
        groups = sorted({e // self.G for e in execs})
        scores = [self._score(g) for g in groups]
        trajs = [self.traj[e] for e in execs]
        breakdowns = [scores[groups.index(e // self.G)].breakdowns[e % self.G] for e in execs]
        now = time.monotonic()
        rec = {
            **rollout_metrics(trajs, breakdowns),
            **group_metrics(scores, self.grpo),
            **merged_update_metrics(**stats),
            "experience_ops": len(ops),
            "experience_epoch": self.store.epoch,
            # cell-seconds and driver seconds summed over the batch (cells overlap: not a wall-time split)
            "timing_s/env": sum(self._env_s.pop(e, [0.0])[0] for e in execs),
            "timing_s/gen": sum(self._gen_s.pop(e, 0.0) for e in execs),
            **{f"timing_s/{k}": v for k, v in timing.items()},
            "timing_s/step": now - self._last_sync,
            "step": version,
            "policy_version": version,
            "constrained": self.cfg.constrained,
        }
        self._last_sync = now
        for e in execs:
            del self.traj[e]
        for g in groups:
            del self._scores[g]
        return rec

    # ---- job checkpoints -----------------------------------------------------------------------
    _BOOKS = ("traj", "_scores", "_env_s", "_gen_s")

    def state(self) -> dict[str, Any]:
        """Finished trajectories not yet trained, the store, and each live episode's completions
        (live envs are not picklable: a resume replays the completions into a fresh env)."""
        return {
            **{k: getattr(self, k) for k in self._BOOKS},
            "store": self.store.to_dict(),
            "comps": {e: list(self._comps.get(e, [])) for e in self.live},
        }

    def restore(self, st: dict[str, Any]) -> None:
        from evoharness.harness.bpe import ExperienceStore

        for k in self._BOOKS:
            setattr(self, k, st[k])
        self.store = ExperienceStore.from_dict(st["store"])
        self.store.freeze()
        for e, comps in sorted(st["comps"].items()):
            self._replay(e, comps)

    def _replay(self, e: int, comps: list[dict]) -> None:
        """Rebuild live execution e from its recorded completions. The harness reads a scratch
        copy of the store meanwhile: the store's pending writes already hold these turns'."""
        from evoharness.harness.bpe import ExperienceStore

        env_s, gen_s = self._env_s.get(e, [0.0]), self._gen_s.get(e, 0.0)
        real, self.store = self.store, ExperienceStore.from_dict(self.store.to_dict())
        try:
            self.start(e)
            if e not in self.live:
                raise RuntimeError(f"execution {e}: its game no longer loads; cannot resume it")
            for c in comps:
                if not self._advance(e, self._request(self.live[e]), Completion(**c)):
                    raise RuntimeError(f"execution {e} ended while replaying its {len(comps)} recorded turns")
        finally:
            self.store = real
        lv = self.live[e]
        if hasattr(lv.harness, "experience"):
            lv.harness.experience = real
        self._comps[e], self._env_s[e], self._gen_s[e] = list(comps), env_s, gen_s

    def close(self) -> None:
        for lv in self.live.values():
            close_quietly(lv.env)
        self.live.clear()


# ---- a cell with the policy ----------------------------------------------------------------------


@dataclasses.dataclass
class PolicyCellFactory:
    """Builds a cell's `PolicyCell` where the cell runs (picklable: a config and a thread count);
    with ``runtime.rollout_engine = "vllm"`` a `recipes.vllm_cell.VLLMCell`.

    Attributes:
        cfg: the run's config.
        threads: torch threads in the cell (None: leave the process's setting).
    """

    cfg: RLConfig
    threads: int | None = None

    def __call__(self, cell: int, init_dir: str | None) -> Any:
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.cfg.runtime.rollout_engine == "vllm":  # vLLM answers the calls; the same trainer
            from evoharness.recipes.vllm_cell import VLLMCell

            return VLLMCell(self.cfg, init_dir)
        return PolicyCell(self.cfg, init_dir)


class PolicyCell(TrainedCell):
    """A cell's parts (`runtime.cell.CellParts`): the policy that answers calls, and the trainer
    of the same weights (`recipes.trained_cell.TrainedCell`, with the run's SFT anchor).

    Args:
        cfg: the run's config.
        init_dir: a checkpoint directory (weights; ``trainer_state.pt``: optimizer and RNG
            states; with LoRA ``adapter/``) to start from; None: ``cfg.model_path``.
    """

    def __init__(self, cfg: RLConfig, init_dir: str | None = None):
        from evoharness.policies.local import LocalHFPolicy
        from evoharness.train.precision import compute_dtype

        # fp32 master weights (with LoRA: the adapters); low precision only as autocast compute
        source, dtype = base_weights(cfg.model_path, init_dir, cfg.lora, compute_dtype(cfg.dtype, cfg.device))
        self.policy = LocalHFPolicy(
            source,
            device=cfg.device,
            dtype=dtype,
            # the static decoder fuses the projections' base weights once: it would skip adapters
            engine="hf" if cfg.lora.enabled else None,
            temperature=cfg.grpo.temperature,
            max_new_tokens=cfg.max_new_tokens,
            max_prompt_tokens=cfg.max_prompt_tokens,
            constrained=cfg.constrained,
            seed=cfg.seed,
            num_threads=cfg.decode_threads,
        )
        super().__init__(
            self.policy.model,
            self.policy.tokenizer,
            train_grpo(cfg),
            cfg.model_path,
            init_dir,
            device=cfg.device,
            dtype=cfg.dtype,
            ref_device=cfg.ref_device,
            anchor=cfg.sft_anchor,
            seed=cfg.seed,
            lora=adapt(self.policy.model, cfg.lora, cfg.seed, init_dir),
        )

    def serve(self, payloads: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
        self.policy.policy_version = version
        reqs = policy_requests(payloads)
        self.model.eval()
        with self.amp():
            return [dataclasses.asdict(c) for c in self.policy.act(reqs)]


def policy_requests(payloads: list[dict[str, Any]]) -> list[PolicyRequest]:
    """The policy's requests of a cell's call payloads (`AlfworldWorkload.request`): the harness
    travels as its meta verbs only (what constrained decoding needs)."""
    return [
        PolicyRequest(
            p["messages"],
            p["episode_id"],
            p["turn"],
            list(p["admissible_commands"]),
            harness=SimpleNamespace(meta_verbs=tuple(p["meta_verbs"])),
        )
        for p in payloads
    ]


def shuffled_order(n: int, seed: int) -> list[int]:
    """The run's game order: a seeded shuffle of ``range(n)``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


class _Evaluator:
    """`quick_eval` of published weights, with a policy of its own in the driver process."""

    def __init__(self, cfg: RLConfig):
        self.cfg, self.policy = cfg, None

    def __call__(self, weights: Path, version: int, store: Any) -> dict[str, float]:
        from safetensors.torch import load_file

        from evoharness.policies.local import LocalHFPolicy
        from evoharness.runtime.cell import load_sync_tensors
        from evoharness.train.precision import autocast, compute_dtype

        cfg = self.cfg
        if self.policy is None:
            source, dtype = base_weights(cfg.model_path, None, cfg.lora, compute_dtype(cfg.dtype, cfg.device))
            self.policy = LocalHFPolicy(
                source,
                device=cfg.device,
                dtype=dtype,
                engine="hf" if cfg.lora.enabled else None,  # as `PolicyCell`'s
                max_new_tokens=cfg.max_new_tokens,
                max_prompt_tokens=cfg.max_prompt_tokens,
                constrained=cfg.constrained,
                seed=cfg.seed,
                num_threads=cfg.decode_threads,
            )
            adapt(self.policy.model, cfg.lora, cfg.seed, None)  # with LoRA the published weights are adapters
        load_sync_tensors(self.policy.model, load_file(str(weights)), str(weights))
        self.policy.policy_version = version
        with autocast(cfg.device, compute_dtype(cfg.dtype, cfg.device)):
            return quick_eval(cfg, self.policy, store)


def alfworld_recipe(cfg: RLConfig) -> Any:
    """The ALFWorld part of an RL job (`recipes.base.Recipe`): the agents over `train_tasks` in a
    seeded order, from the given experience store, the policy cells and `quick_eval`.

    Raises:
        ValueError: a bad task filter or branch; GameDataError: a bad data path or split.
    """
    from evoharness.recipes.base import Recipe

    tasks = train_tasks(cfg)
    workload = AlfworldWorkload(
        cfg,
        tasks,
        shuffled_order(len(tasks), cfg.seed),
        load_experience_fresh(cfg.harness.experience_path),
        branch_starts(cfg),
    )
    return Recipe(workload, lambda threads: PolicyCellFactory(cfg, threads), _Evaluator(cfg))
