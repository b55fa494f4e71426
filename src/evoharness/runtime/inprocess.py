"""The in-process runtime: one cell that is this process (``evoharness rl``'s default).

`InProcessBackend` is a `runtime.driver.Backend` of one cell driven by the
`runtime.schedulers.Colocate` scheduler like any other world: the scheduler
dispatches a step's GRPO groups and binds them to the cell, the cell plays
them in lock-step (`rollout.episode.run_episodes`, one batched policy call per
turn, optionally through a loopback gateway), the role switches are free
(the same weights serve and train), micro-batches are claimed, and the
optimizer step runs at the `SyncWeights` command over the whole step batch:
`train.grpo.grpo_step` (turn rows) or `train.tree_loss.tree_grpo_step`
(trajectory trees), with every GRPO lever, ``mini_batches`` / ``epochs`` > 1 (several
updates per batch) and the SFT anchor included, which is why the cell trains at the sync and
not per claimed micro-batch. One RL step (EvoHarness-RL §4, Table 4)::

    rollout: P train games x G samples with the BPE harness (experience store frozen)
    reward:  Eq. 5-6 per trajectory (`train.rewards.trajectory_reward`)
    advantage: group-relative (GRPO), optionally GiGPO step-level
    update:  PPO-clip step(s) with KL to the frozen SFT reference (and the SFT anchor's loss)
    consolidate the experience store (notes, pickup priors)

`InProcessRuntime` is what `train.rl.train_rl` drives: the steps' metrics
records, checkpoints, evaluation and the final export. A checkpoint
(``checkpoints/step_N``) holds the weights (fp32 safetensors), optimizer and
RNG states (``torch.load(weights_only=True)``), experience store, step, game
order and a copy of ``metrics.jsonl`` as of step N; a colocate schedule has
nothing in flight at a weight sync, so the step count is the scheduler's
whole state (`Colocate.resume_at`). An unreadable checkpoint falls back to
the previous one, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from evoharness.envs.alfworld import make_env
from evoharness.harness.factory import make_harness
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.runtime.driver import Driver
from evoharness.runtime.events import (Bind, Command, Dispatch, Event, ExecutionDispatched, ExecutionFinished,
                                       ExecutionStarted, MicroBatchDone, RoleSwitchDone, RunMicroBatch, SwitchRole,
                                       SyncWeights, WeightSyncDone)
from evoharness.train.advantages import std_floor_active, turn_advantages, valid_members
from evoharness.train.checkpoint import (check_resume_config, get_rng_state, load_checkpoint, load_model_weights, load_trainer_state, restore_metrics, set_rng_state, snapshot_metrics)
from evoharness.files import atomic_dir, atomic_write_text, failpoint
from evoharness.train.grpo import TokenMasks, grpo_step, lr_at, make_optimizer, set_lr, turn_samples
from evoharness.train.precision import autocast, compute_dtype, export_dtype, save_exported
from evoharness.train.rewards import trajectory_reward
from evoharness.train.tree_loss import trajectory_trees, tree_grpo_step


class TimedEnv:
    """Wraps an env and adds its reset/step wall time to a shared counter."""

    def __init__(self, env, clock: list[float]) -> None:
        self._env, self._clock, self.task = env, clock, env.task

    def reset(self):
        t = time.perf_counter()
        try:
            return self._env.reset()
        finally:
            self._clock[0] += time.perf_counter() - t

    def step(self, action):
        t = time.perf_counter()
        try:
            return self._env.step(action)
        finally:
            self._clock[0] += time.perf_counter() - t

    def facts(self):
        return self._env.facts()

    def close(self) -> None:
        self._env.close()


class InProcessBackend:
    """One cell in this process: the policy, its optimizer, the KL reference.

    Args:
        cfg: the RL config (`train.rl.RLConfig`).
        tasks / order: the games and their shuffled order (step u, group g plays
            ``tasks[order[(u·P + g) % len(order)]]``).
        store: the experience store every harness reads.
        policy / optimizer / ref / masks: the live policy (a `LocalHFPolicy` in
            train mode), its AdamW, the frozen reference (None: no KL) and the
            sampler's token masks.
        rollout_policy: who answers the rollout calls (the policy, or a gateway over it).
        consolidator: the experience store's LLM consolidator (None: rules).
        anchor: the SFT anchor (`train.sft_anchor.SFTAnchor`; None: GRPO alone).
        branches: ``(task, prefix)`` start states (`train.rl.branch_starts`); with any, every
            other group (the run's odd ones) starts from the next one, the even ones play
            ``tasks`` in `order` as above.
    """

    def __init__(self, cfg: Any, tasks: list, order: list[int], store: Any, policy: Any, optimizer: Any,
                 ref: Any, masks: TokenMasks, rollout_policy: Any = None, consolidator: Any = None,
                 anchor: Any = None, branches: list | None = None):
        self.cfg, self.tasks, self.order, self.store, self.anchor = cfg, tasks, order, store, anchor
        self.branches = branches
        self.policy, self.optimizer, self.ref, self.masks = policy, optimizer, ref, masks
        self.rollout_policy, self.consolidator = rollout_policy or policy, consolidator
        self.P, self.G = cfg.grpo.prompts_per_step, cfg.grpo.group_size
        self.N = self.P * self.G
        self.dtype = compute_dtype(cfg.dtype, cfg.device)
        self._events: list[Event] = []
        self._bound: list[int] = []                  # executions bound, not yet played
        self.traj: dict[int, Any] = {}               # step's finished executions
        self._clock = {"env": 0.0, "rollout": 0.0}
        self._t_step: float | None = None           # when the step's rollout began
        self.records: list[dict] = []                # one per weight sync

    def amp(self):
        return autocast(self.cfg.device, self.dtype)

    # ---- the Backend protocol ------------------------------------------------------
    def apply(self, c: Command) -> None:
        if isinstance(c, Dispatch):
            self._events += [ExecutionDispatched(e, c.group) for e in range(c.group * self.G, (c.group + 1) * self.G)]
        elif isinstance(c, Bind):
            self._bound.append(c.execution)
            self._events.append(ExecutionStarted(c.execution, c.cell))
        elif isinstance(c, SwitchRole):     # the same weights serve and train: nothing to move
            self._events.append(RoleSwitchDone(c.cell, c.role))
        elif isinstance(c, RunMicroBatch):  # claimed; the batch trains at the sync (module docstring)
            self._events.append(MicroBatchDone(c.cell, c.executions))
        elif isinstance(c, SyncWeights):
            self._update(c.version)
            self._events.append(WeightSyncDone(c.version))
        else:
            raise ValueError(f"the in-process backend cannot run {c!r}")

    def poll(self, timeout: float) -> list[Event]:
        if not self._events and self._bound:
            self._rollout(sorted(self._bound))
            self._bound = []
        out, self._events = self._events, []
        return out

    def state(self) -> dict[str, Any]:
        return {}                           # its checkpoint is `InProcessRuntime.save`'s

    def close(self) -> None:
        pass

    # ---- one step ---------------------------------------------------------------------
    def _spec(self, e: int) -> EpisodeSpec:
        step, i = divmod(e, self.N)
        g, k = divmod(i, self.G)
        n = step * self.P + g                    # the run's n-th group
        if self.branches:                        # odd groups start from the branches (`train.rl.Branch`)
            if n % 2:
                task, prefix = self.branches[n // 2 % len(self.branches)]
                return EpisodeSpec(task, f"{task.task_id}@{len(prefix)}#u{step}g{k}", self.cfg.seed, prefix)
            n //= 2
        task = self.tasks[self.order[n % len(self.order)]]
        return EpisodeSpec(task, f"{task.task_id}#u{step}g{k}", self.cfg.seed)

    def _rollout(self, execs: list[int]) -> None:
        """Play `execs` in lock-step with the store frozen; report each one finished."""
        from evoharness.train.rl import step_cap

        cfg, clock = self.cfg, [0.0]
        t0 = time.perf_counter()
        if self._t_step is None:
            self._t_step = t0
        self.store.freeze()
        self.policy.model.eval()
        specs = {e: self._spec(e) for e in execs}
        by_cap: dict[int, list[int]] = {}    # one lock-step batch per T_max (`train.rl.step_cap`)
        for e in execs:
            by_cap.setdefault(step_cap(cfg, e // self.N, e % self.N // self.G, len(specs[e].prefix)), []).append(e)
        trajs = {}
        with self.amp():
            for cap, group in by_cap.items():
                trajs.update(zip(group, run_episodes(
                    [specs[e] for e in group],
                    make_env=lambda task: TimedEnv(make_env(task, engine=cfg.engine, wording=cfg.wording), clock),
                    make_harness=lambda: make_harness(cfg.harness, experience=self.store),
                    policy=self.rollout_policy, max_steps=cap)))
        self._clock["rollout"] += time.perf_counter() - t0
        self._clock["env"] += clock[0]
        for e, t in sorted(trajs.items()):
            self.traj[e] = t
            tokens = sum(x.prompt_tokens + x.completion_tokens for x in t.turns)
            self._events.append(ExecutionFinished(e, 0, max(1, tokens)))

    def _update(self, version: int) -> None:
        """The optimizer step(s) on step `version - 1`'s batch, then consolidate the store."""
        g, step = self.cfg.grpo, version - 1
        trajs = [self.traj.pop(e) for e in range(step * self.N, version * self.N)]
        groups = [trajs[i * self.G:(i + 1) * self.G] for i in range(self.P)]
        breakdowns = [[trajectory_reward(t, step, g.reward) for t in grp] for grp in groups]
        rewards = torch.tensor([[b.total for b in row] for row in breakdowns], dtype=torch.float32)
        adv_stats: dict[str, int] = {}  # GiGPO: step groups with a spread, and those the std floor set
        adv = turn_advantages(groups, rewards, g.advantage, stats=adv_stats)
        if self.cfg.branch_advantage == "positive":  # branch groups reinforce their escapes only
            adv = [[[max(a, 0.0) for a in turns] for turns in ga] if self._spec(step * self.N + n * self.G).prefix
                   else ga for n, ga in enumerate(adv)]
        flat_adv = [a for ga in adv for a in ga]
        t1 = time.perf_counter()
        self.policy.model.train()
        relabelled = None
        if self.anchor and self.anchor.cfg.on_policy_coef > 0:  # the teacher's labels where the policy erred
            from evoharness.train.sft_anchor import relabel_states

            relabelled = relabel_states(trajs, self.cfg.seed, step, self.anchor.cfg.on_policy_states,
                                        self.anchor.cfg.on_policy_filter)
        anchor = self.anchor.for_step(self.policy.model, step, self.amp, relabelled) if self.anchor else None
        lr = lr_at(g, step, self.cfg.steps)
        set_lr(self.optimizer, lr)
        if g.packing:  # trajectory trees, dedup-sampled and tree-packed (train/tree_loss.py)
            trees, call_adv = trajectory_trees(trajs, flat_adv)
            upd = tree_grpo_step(self.policy.model, self.optimizer, trees, call_adv, g, group_size=self.G,
                                 j_max=g.j_max, seed=step, max_tokens=g.pack_tokens,
                                 rows_per_micro=g.micro_batch_size, ref_model=self.ref, masks=self.masks,
                                 amp=self.amp, anchor=anchor) if any(t.n_trainable for t in trees) else {}
        else:
            samples = turn_samples(trajs, flat_adv, max_turns=g.max_train_turns, seed=step, group_size=self.G)
            upd = grpo_step(self.policy.model, self.optimizer, samples, g, ref_model=self.ref, group_size=self.G,
                            masks=self.masks, amp=self.amp, anchor=anchor) if samples else {}
        self.policy.policy_version = version
        t_train = time.perf_counter() - t1
        self.store.unfreeze()
        ops = self.store.consolidate(self.consolidator)  # epoch + 1: continues from the store's collect epochs
        valid = valid_members(groups)  # episodes an environment error ended take no part in the baseline
        self.records.append({
            **step_metrics(trajs, [b for row in breakdowns for b in row]),
            "reward": float(rewards.mean()),
            **{f"train/{k}": v for k, v in upd.items()}, "train/lr": lr,
            # how often the std floor (not the paper's std) set a group's advantage scale
            "adv/signal_groups": int(sum(len(set(row[v].tolist())) > 1 for row, v in zip(rewards, valid))),
            "adv/std_floor_groups": int(std_floor_active(rewards, g.advantage, valid).sum()),
            "rollout/env_errors": int((~valid).sum()),
            **{f"adv/{k}": v for k, v in adv_stats.items()},
            "experience_ops": len(ops), "experience_epoch": self.store.epoch,
            "timing_s/rollout": self._clock["rollout"], "timing_s/env": self._clock["env"],
            "timing_s/gen": self._clock["rollout"] - self._clock["env"], "timing_s/train": t_train,
            "timing_s/step": time.perf_counter() - self._t_step,
            "step": version, "policy_version": version, "constrained": self.cfg.constrained,
        })
        self._clock = {"env": 0.0, "rollout": 0.0}
        self._t_step = None


def step_metrics(trajs: list, breakdowns: list) -> dict[str, float]:
    """A step's rollout metrics: success, reward and its terms, steps, tokens, invalid actions,
    prompt fitting and harness calls per episode (`train.rl`'s names)."""
    n = len(trajs)
    flat = [b.as_dict() for b in breakdowns]
    return {
        "success": sum(t.won for t in trajs) / n,
        "reward": float(torch.tensor([b["total"] for b in flat], dtype=torch.float32).mean()),
        **{f"reward/{k}": sum(float(b[k]) for b in flat) / n for k in flat[0] if k != "solved"},
        "steps_per_episode": sum(t.steps for t in trajs) / n,
        "completion_tokens_per_episode": sum(t.completion_tokens for t in trajs) / n,
        "invalid_per_episode": sum(t.invalid_actions for t in trajs) / n,
        # prompts over max_prompt_tokens: oldest history dropped (harness.prompt), counted per step
        "prompt/fitted_turns": sum(t.info.get("prompt_fit", {}).get("turns", 0) for t in trajs),
        "prompt/cut_tokens": sum(t.info.get("prompt_fit", {}).get("tokens_cut", 0) for t in trajs),
        **{f"harness/{v}_per_episode": sum(t.meta_calls[v] for t in trajs) / n
           for v in ("track", "commit", "recall", "note")},
    }


# settings a resumed run may change: how long and how it runs, not what it trains
RESUME_FREE = ("out_dir", "steps", "max_minutes", "threads", "decode_threads", "ckpt_every", "keep_checkpoints",
               "eval_every", "eval_split", "eval_limit", "rollout_via_gateway")


def experience_consolidator(cfg: Any) -> Any:
    """The consolidator an RL run applies to its experience store at each weight sync
    (`RLConfig`): none when ``consolidate_experience`` is off (the store stays fixed), the LLM
    consolidator when ``llm_consolidator`` names an endpoint, else None (the store's rules)."""
    if not cfg.consolidate_experience:
        from evoharness.harness.bpe.experience import NoConsolidation

        return NoConsolidation()
    if cfg.llm_consolidator:
        from evoharness.harness.bpe.llm_consolidator import LLMConsolidator

        return LLMConsolidator(**cfg.llm_consolidator.model_dump())
    return None


class InProcessRuntime:
    """`InProcessBackend` under the colocate scheduler, resumed from ``out_dir``'s last checkpoint.

    Raises:
        ValueError: an out_dir holding another run's checkpoints (the differing settings named).
    """

    def __init__(self, cfg: Any):
        from evoharness.models.init import load_model
        from evoharness.policies.local import LocalHFPolicy
        from evoharness.runtime.rl_job import sim_config
        from evoharness.runtime.sim import build_scheduler
        from evoharness.train.rl import branch_starts, load_experience_fresh, train_tasks

        self.cfg, g = cfg, cfg.grpo
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.out = out = Path(cfg.out_dir)
        if any((out / "checkpoints").glob("step_*")):  # a resume continues the same run only
            check_resume_config(out / "rl_config.json", json.loads(cfg.model_dump_json()), RESUME_FREE)
        atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
        tasks = train_tasks(cfg)
        # fp32 master weights; low precision only as autocast compute (issue 10 fault 1)
        policy = LocalHFPolicy(cfg.model_path, device=cfg.device, dtype=torch.float32, temperature=g.temperature,
                               max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens,
                               constrained=cfg.constrained, seed=cfg.seed, num_threads=cfg.decode_threads)
        policy.model.train()
        ref = None
        if g.kl_beta > 0:
            ref = load_model(cfg.model_path, cfg.ref_device or cfg.device, compute_dtype(cfg.dtype, cfg.device))
            ref.eval().requires_grad_(False)
        optimizer = make_optimizer(policy.model, g)
        # The trainer scores the distribution the engine sampled from (constraint masks included).
        masks = TokenMasks(policy.tokenizer, policy.model.get_output_embeddings().weight.shape[0])
        found = load_checkpoint(out, lambda path: self._restore(path, policy, optimizer))
        if found:
            ckpt, (state, store) = found
            self.step, self.order = state["step"], state["order"]
            restore_metrics(out / "metrics.jsonl", ckpt, self.step)
        else:
            store, self.step = load_experience_fresh(cfg.harness.experience_path), 0
            self.order = list(range(len(tasks)))
            random.Random(cfg.seed).shuffle(self.order)
        consolidator = experience_consolidator(cfg)
        self._served = contextlib.ExitStack()
        rollout_policy = policy
        if cfg.rollout_via_gateway:
            from evoharness.runtime.gateway import served_policy

            rollout_policy = self._served.enter_context(served_policy(policy, records=out / "gateway"))
        anchor = None
        if cfg.sft_anchor is not None:
            from evoharness.train.sft_anchor import SFTAnchor

            anchor = SFTAnchor(cfg.sft_anchor, policy.tokenizer, cfg.seed, g.epochs * g.mini_batches)
        self.backend = InProcessBackend(cfg, tasks, self.order, store, policy, optimizer, ref, masks,
                                        rollout_policy, consolidator, anchor, branch_starts(cfg))
        sched = build_scheduler("colocate", sim_config(cfg)).resume_at(self.step)
        self.driver = Driver(sched, self.backend, stall_s=cfg.runtime.stall_s)

    @staticmethod
    def _restore(ckpt: Path, policy: Any, optimizer: Any) -> tuple[dict, Any]:
        """Load checkpoint `ckpt` into the policy and optimizer; returns (state.json, experience store).
        Reads only JSON, safetensors and weights-only tensors; raises on anything unreadable."""
        from evoharness.train.rl import load_experience_fresh

        state = json.loads((ckpt / "state.json").read_text())
        trainer = load_trainer_state(ckpt / "trainer_state.pt")
        store = load_experience_fresh(ckpt / "experience.json")
        load_model_weights(policy.model, ckpt)
        optimizer.load_state_dict(trainer["optimizer"])
        set_rng_state(trainer["rng"])
        policy.policy_version = state["policy_version"]
        return state, store

    def steps(self):
        """Each step's metrics record, as its weights become the policy's."""
        for version in self.driver.steps():
            self.step = version
            yield self.backend.records.pop()

    def evaluate(self) -> dict[str, float]:
        from evoharness.train.rl import quick_eval

        with self.backend.amp():
            return quick_eval(self.cfg, self.backend.policy, self.backend.store)

    def save(self, step: int) -> None:
        """Commit step `step`: checkpoint (with the metrics so far) written atomically, then ``latest``."""
        be, out = self.backend, self.out

        def write(tmp: Path) -> None:
            be.policy.model.save_pretrained(str(tmp), safe_serialization=True)
            be.policy.tokenizer.save_pretrained(str(tmp))
            failpoint("mid_checkpoint", step)
            torch.save({"optimizer": be.optimizer.state_dict(), "rng": get_rng_state()}, tmp / "trainer_state.pt")
            be.store.save(tmp / "experience.json")
            snapshot_metrics(out / "metrics.jsonl", tmp)
            (tmp / "state.json").write_text(json.dumps({"step": step, "order": self.order,
                                                        "policy_version": be.policy.policy_version}))

        ckpts = out / "checkpoints"
        path = atomic_dir(ckpts / f"step_{step:07d}", write)
        failpoint("after_checkpoint", step)
        atomic_write_text(ckpts / "latest", path.name)
        for old in sorted(ckpts.glob("step_*"))[:-max(1, self.cfg.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> dict[str, Any]:
        """End the run; returns the runtime's measurements (none worth a file here)."""
        self._served.close()
        return {}

    def export(self, final: Path) -> Path:
        """The final model (the SFT model's dtype, not the fp32 masters), tokenizer and store."""
        be = self.backend

        def write(tmp: Path) -> None:
            save_exported(be.policy.model, tmp, export_dtype(self.cfg.model_path))
            be.policy.tokenizer.save_pretrained(str(tmp))
            be.store.save(tmp / "experience.json")

        return atomic_dir(final, write)

