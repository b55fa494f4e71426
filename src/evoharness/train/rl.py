"""Stage 2: cost-aware GRPO with the EvoHarness reward (EvoHarness-RL §4, Table 4).

The loop, one RL step per epoch u of the reward's cosine schedule::

    for step u:
        freeze the experience store
        rollout: P train games x G samples, in lock-step, with the BPE harness
        reward:  Eq. 5-6 per trajectory (`rewards.trajectory_reward`)
        advantage: group-relative (GRPO), optionally GiGPO step-level
        update:  one PPO-clip step with KL to the frozen SFT reference
        consolidate the experience store (notes, pickup priors)
        evaluate every `eval_every` steps; checkpoint atomically

A checkpoint (``checkpoints/step_N``) holds the weights (fp32 safetensors),
optimizer and RNG states (``torch.load(weights_only=True)``), experience
store, step, game order and a copy of ``metrics.jsonl`` as of step N. A step
commits in this order: append its metrics record, write the checkpoint,
move ``checkpoints/latest``; `train_rl` with the same ``out_dir`` resumes from
the committed checkpoint (an unreadable one falls back to the previous, with
a warning) and restores its metrics copy, so after a kill at any point
``metrics.jsonl`` continues without gaps, duplicates or torn lines. A finished
run also writes ``report.md`` + ``rl_curves.png``.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from tqdm.auto import tqdm

from evoharness.config import Strict
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.factory import HarnessConfig, make_harness
from evoharness.harness.prompt import DEFAULT_MAX_PROMPT_TOKENS
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.runtime.rl_job import RuntimeConfig
from evoharness.train.advantages import std_floor_active, turn_advantages, valid_members
from evoharness.train.checkpoint import (
    append_jsonl, atomic_dir, atomic_write_text, failpoint, get_rng_state, load_checkpoint, load_model_weights,
    load_trainer_state, restore_metrics, set_rng_state, snapshot_metrics, check_resume_config,
)
from evoharness.train.grpo import GRPOConfig, TokenMasks, grpo_step, make_optimizer, turn_samples
from evoharness.train.tree_loss import trajectory_trees, tree_grpo_step
from evoharness.train.precision import autocast, compute_dtype, export_dtype, save_exported
from evoharness.train.rewards import trajectory_reward


class LLMConsolidatorConfig(Strict):
    """An OpenAI-compatible endpoint that consolidates the experience store's
    notes (`harness.bpe.llm_consolidator`); unset: the rule consolidator."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 2


class RLConfig(Strict):
    """``evoharness rl`` settings. Defaults: the paper's Table 4 (``grpo``) on
    ALFWorld train games with T_max = 70; the main job overrides the sizes for CPU."""

    model_path: str = ""  # the SFT model directory (policy init and KL reference)
    out_dir: str = "runs/rl"
    steps: int = 150
    split: str = "train"
    task_types: list[str] | None = None  # train (and evaluate) on these ALFWorld task types only; None: all six
    exclude_games: list[str] = []  # task ids never trained on (the main job's development set)
    data_path: str | None = None
    engine: Literal["textworld", "fast"] = "fast"
    # the placing-command wording played (envs/alfworld/wording.py): set it as the data it
    # continues from (collect --wording, eval env.wording), or RL trains on a wording SFT never saw
    wording: Literal["native", "put", "move"] = "native"
    max_steps: int = 70
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe"))
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    device: str = "cpu"
    # Forward compute dtype of rollouts and training (auto: bf16 on CUDA, fp32 on CPU). The
    # policy's parameters and AdamW state are fp32 master weights whatever this says
    # (`train.precision`); the frozen reference model is held in this dtype.
    dtype: str = "auto"
    ref_device: str | None = None  # the reference model's device (None: `device`), e.g. "cuda:1"
    # Default on: the policy acts through the action grammar, and the trainer scores that
    # masked distribution (forced tokens carry no gradient). Off: free decoding, where the
    # reward's invalid-action term does the work of the grammar.
    constrained: bool = True
    max_new_tokens: int = 96
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS  # shared with sft and eval (harness.prompt)
    decode_threads: int | None = None  # torch CPU threads while sampling (1 suits tiny models)
    threads: int | None = None  # torch CPU threads for the whole run (None: torch's default)
    seed: int = 0
    ckpt_every: int = 1
    keep_checkpoints: int = 2
    eval_every: int = 0  # 0: no periodic evaluation
    eval_split: str = "valid_seen"
    eval_limit: int | None = 42
    max_minutes: float | None = None
    llm_consolidator: LLMConsolidatorConfig | None = None
    # sample through a loopback OpenAI-compatible gateway on the live weights (`runtime.gateway.served_policy`):
    # the same trajectories as in-process, plus the gateway's call records in out_dir/gateway
    rollout_via_gateway: bool = False
    # where the steps run: "inprocess" (this module's loop) or a runtime schedule on K cell
    # processes (`runtime.rl_job`; colocate with 1 cell plays the same episodes and updates)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)


# settings a resumed run may change: how long and how it runs, not what it trains
RESUME_FREE = ("out_dir", "steps", "max_minutes", "threads", "decode_threads", "ckpt_every", "keep_checkpoints",
               "eval_every", "eval_split", "eval_limit", "rollout_via_gateway")


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


def _save(out: Path, step: int, policy, optimizer, store, order: list[int], keep: int) -> None:
    """Commit step `step`: checkpoint (with the metrics so far) written atomically, then ``latest``."""
    def write(tmp: Path) -> None:
        policy.model.save_pretrained(str(tmp), safe_serialization=True)
        policy.tokenizer.save_pretrained(str(tmp))
        failpoint("mid_checkpoint", step)
        torch.save({"optimizer": optimizer.state_dict(), "rng": get_rng_state()}, tmp / "trainer_state.pt")
        store.save(tmp / "experience.json")
        snapshot_metrics(out / "metrics.jsonl", tmp)
        (tmp / "state.json").write_text(json.dumps({"step": step, "order": order, "policy_version": policy.policy_version}))

    ckpts = out / "checkpoints"
    path = atomic_dir(ckpts / f"step_{step:07d}", write)
    failpoint("after_checkpoint", step)
    atomic_write_text(ckpts / "latest", path.name)
    import shutil

    for old in sorted(ckpts.glob("step_*"))[:-max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)


def _restore(ckpt: Path, policy, optimizer) -> tuple[dict, object]:
    """Load checkpoint `ckpt` into the policy and optimizer; returns (state.json, experience store).
    Reads only JSON, safetensors and weights-only tensors; raises on anything unreadable."""
    state = json.loads((ckpt / "state.json").read_text())
    trainer = load_trainer_state(ckpt / "trainer_state.pt")
    store = load_experience_fresh(ckpt / "experience.json")
    load_model_weights(policy.model, ckpt)
    optimizer.load_state_dict(trainer["optimizer"])
    set_rng_state(trainer["rng"])
    policy.policy_version = state["policy_version"]
    return state, store


def train_rl(cfg: RLConfig, progress: bool = True) -> Path:
    """Run (or resume) GRPO from ``cfg.model_path``; returns the final model directory.

    Raises:
        ValueError: no model path; GameDataError: bad data path or split.
    """
    from evoharness.models.init import load_model
    from evoharness.policies.local import LocalHFPolicy

    if not cfg.model_path:
        raise ValueError("rl needs model_path (the SFT model directory)")
    if cfg.runtime.schedule != "inprocess" and cfg.grpo.packing:
        raise ValueError("grpo.packing runs with runtime.schedule = 'inprocess' only (cells train turn rows)")
    if cfg.runtime.schedule != "inprocess":
        from evoharness.runtime.rl_job import train_rl_runtime

        return train_rl_runtime(cfg, progress)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any((out / "checkpoints").glob("step_*")):  # a resume continues the same run only (another model or recipe: error)
        check_resume_config(out / "rl_config.json", json.loads(cfg.model_dump_json()), RESUME_FREE)
    atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
    metrics_path = out / "metrics.jsonl"
    tasks = [t for t in select_tasks(discover_games(cfg.split, cfg.data_path), cfg.task_types)
             if t.task_id not in set(cfg.exclude_games)]
    g = cfg.grpo

    # fp32 master weights; low precision only as autocast compute (issue 10 fault 1)
    dtype = compute_dtype(cfg.dtype, cfg.device)

    def amp():
        return autocast(cfg.device, dtype)

    policy = LocalHFPolicy(cfg.model_path, device=cfg.device, dtype=torch.float32, temperature=g.temperature,
                           max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens,
                           constrained=cfg.constrained, seed=cfg.seed, num_threads=cfg.decode_threads)
    policy.model.train()
    ref = None
    if g.kl_beta > 0:
        ref = load_model(cfg.model_path, cfg.ref_device or cfg.device, dtype)
        ref.eval().requires_grad_(False)
    optimizer = make_optimizer(policy.model, g)
    # The trainer scores the distribution the engine sampled from (constraint masks included).
    masks = TokenMasks(policy.tokenizer, policy.model.get_output_embeddings().weight.shape[0])
    found = load_checkpoint(out, lambda path: _restore(path, policy, optimizer))
    if found:
        ckpt, (state, store) = found
        start, order = state["step"], state["order"]
        restore_metrics(metrics_path, ckpt, start)
    else:
        store = load_experience_fresh(cfg.harness.experience_path)
        start = 0
        order = list(range(len(tasks)))
        random.Random(cfg.seed).shuffle(order)

    consolidator = None
    if cfg.llm_consolidator:
        from evoharness.harness.bpe.llm_consolidator import LLMConsolidator

        consolidator = LLMConsolidator(**cfg.llm_consolidator.model_dump())
    rollout_policy, served = policy, contextlib.ExitStack()
    if cfg.rollout_via_gateway:
        from evoharness.runtime.gateway import served_policy

        rollout_policy = served.enter_context(served_policy(policy, records=out / "gateway"))
    t_start = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=start, desc="rl", unit="step", disable=not progress, dynamic_ncols=True)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        idx = [order[(step * g.prompts_per_step + i) % len(order)] for i in range(g.prompts_per_step)]
        specs = [EpisodeSpec(tasks[i], f"{tasks[i].task_id}#u{step}g{k}", cfg.seed) for i in idx for k in range(g.group_size)]
        env_clock = [0.0]
        store.freeze()
        policy.model.eval()
        with amp():
            trajs = run_episodes(
                specs, make_env=lambda task: TimedEnv(make_env(task, engine=cfg.engine, wording=cfg.wording), env_clock),
                make_harness=lambda: make_harness(cfg.harness, experience=store), policy=rollout_policy,
                max_steps=cfg.max_steps,
            )
        t_rollout = time.perf_counter() - t0
        groups = [trajs[i * g.group_size:(i + 1) * g.group_size] for i in range(g.prompts_per_step)]
        breakdowns = [[trajectory_reward(t, step, g.reward) for t in grp] for grp in groups]
        rewards = torch.tensor([[b.total for b in row] for row in breakdowns], dtype=torch.float32)
        valid = valid_members(groups)  # episodes an environment error ended take no part in the baseline
        adv_stats: dict[str, int] = {}  # GiGPO: step groups with a spread, and those the std floor set
        adv = turn_advantages(groups, rewards, g.advantage, stats=adv_stats)
        flat_adv = [a for ga in adv for a in ga]
        t1 = time.perf_counter()
        policy.model.train()
        if g.packing:  # trajectory trees, dedup-sampled and tree-packed (train/tree_loss.py)
            trees, call_adv = trajectory_trees(trajs, flat_adv)
            upd = tree_grpo_step(policy.model, optimizer, trees, call_adv, g, group_size=g.group_size, j_max=g.j_max,
                                 seed=step, max_tokens=g.pack_tokens, rows_per_micro=g.micro_batch_size,
                                 ref_model=ref, masks=masks, amp=amp) if any(t.n_trainable for t in trees) else {}
        else:
            samples = turn_samples(trajs, flat_adv, max_turns=g.max_train_turns, seed=step, group_size=g.group_size)
            upd = grpo_step(policy.model, optimizer, samples, g, ref_model=ref, group_size=g.group_size,
                            masks=masks, amp=amp) if samples else {}
        policy.policy_version += 1
        t_train = time.perf_counter() - t1
        store.unfreeze()
        ops = store.consolidate(consolidator)  # epoch + 1: continues from the store's collect epochs

        flat = [b for row in breakdowns for b in row]
        rec = {
            "step": step + 1,
            "success": sum(t.won for t in trajs) / len(trajs),
            "reward": float(rewards.mean()),
            **{f"reward/{k}": sum(float(b.as_dict()[k]) for b in flat) / len(flat)
               for k in flat[0].as_dict() if k not in ("solved",)},
            "steps_per_episode": sum(t.steps for t in trajs) / len(trajs),
            "completion_tokens_per_episode": sum(t.completion_tokens for t in trajs) / len(trajs),
            "invalid_per_episode": sum(t.invalid_actions for t in trajs) / len(trajs),
            # prompts over max_prompt_tokens: oldest history dropped (harness.prompt), counted per step
            "prompt/fitted_turns": sum(t.info.get("prompt_fit", {}).get("turns", 0) for t in trajs),
            "prompt/cut_tokens": sum(t.info.get("prompt_fit", {}).get("tokens_cut", 0) for t in trajs),
            **{f"harness/{v}_per_episode": sum(t.meta_calls[v] for t in trajs) / len(trajs)
               for v in ("track", "commit", "recall", "note")},
            **{f"train/{k}": v for k, v in upd.items()},
            # how often the std floor (not the paper's std) set a group's advantage scale
            "adv/signal_groups": int(sum(len(set(row[v].tolist())) > 1 for row, v in zip(rewards, valid))),
            "adv/std_floor_groups": int(std_floor_active(rewards, g.advantage, valid).sum()),
            "rollout/env_errors": int((~valid).sum()),
            **{f"adv/{k}": v for k, v in adv_stats.items()},
            "experience_ops": len(ops),
            "experience_epoch": store.epoch,
            "timing_s/rollout": t_rollout,
            "timing_s/env": env_clock[0],
            "timing_s/gen": t_rollout - env_clock[0],
            "timing_s/train": t_train,
            "timing_s/step": time.perf_counter() - t0,
            "policy_version": policy.policy_version,
            "constrained": cfg.constrained,
        }
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            with amp():
                rec.update(_quick_eval(cfg, policy, store))
        done_all = step + 1 == cfg.steps
        # step commit: metrics record, then the checkpoint that includes it (module docstring)
        failpoint("before_metrics", step + 1)
        append_jsonl(metrics_path, rec, step=step + 1)
        failpoint("after_metrics", step + 1)
        if (step + 1) % cfg.ckpt_every == 0 or done_all:
            _save(out, step + 1, policy, optimizer, store, order, cfg.keep_checkpoints)
        bar.update(1)
        bar.set_postfix(success=f"{rec['success']:.2f}", reward=f"{rec['reward']:.2f}")
        if cfg.max_minutes and (time.perf_counter() - t_start) / 60 > cfg.max_minutes:
            if not (step + 1) % cfg.ckpt_every == 0:
                _save(out, step + 1, policy, optimizer, store, order, cfg.keep_checkpoints)
            break
    bar.close()
    served.close()
    from evoharness.eval.run_report import write_rl_report

    write_rl_report(out, metrics_path)

    def write_final(tmp: Path) -> None:
        save_exported(policy.model, tmp, export_dtype(cfg.model_path))  # the SFT model's dtype, not fp32 masters
        policy.tokenizer.save_pretrained(str(tmp))
        store.save(tmp / "experience.json")

    return atomic_dir(out / "final", write_final)


def load_experience_fresh(path):
    """A trainable (unfrozen) experience store: from `path`, or the seeded default."""
    from evoharness.harness.bpe import ExperienceStore

    return ExperienceStore.load(path) if path else ExperienceStore()


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
    """``n`` tasks evenly spaced over the (type-sorted) list, so a short
    evaluation covers every type instead of the first one; all when None."""
    if not n or n >= len(tasks):
        return tasks
    return [tasks[i * len(tasks) // n] for i in range(n)]


def _quick_eval(cfg: RLConfig, policy, store) -> dict:
    """Greedy success on ``eval_limit`` games spread over the eval split (same task types as training).

    An evaluation changes no training state: it reads a frozen *copy* of the
    experience store (its notes, pickups and use counts are dropped with the
    copy, never consolidated into the training store), and the policy's
    temperature, train/eval mode and the global RNG states are restored.
    """
    from evoharness.harness.bpe import ExperienceStore

    tasks = spread(select_tasks(discover_games(cfg.eval_split, cfg.data_path), cfg.task_types), cfg.eval_limit)
    snapshot = ExperienceStore.from_dict(store.to_dict())
    snapshot.freeze()
    temp, training, rng = policy.temperature, policy.model.training, get_rng_state()
    policy.temperature = 0.0
    policy.model.eval()
    try:
        trajs = run_episodes([EpisodeSpec(t, f"{t.task_id}#eval", cfg.seed) for t in tasks],
                             make_env=lambda task: make_env(task, engine=cfg.engine, wording=cfg.wording),
                             make_harness=lambda: make_harness(cfg.harness, experience=snapshot), policy=policy,
                             max_steps=cfg.max_steps)
    finally:
        policy.temperature = temp
        policy.model.train(training)
        set_rng_state(rng)
    return {"eval/success": sum(t.won for t in trajs) / len(trajs), "eval/n": len(trajs),
            "eval/experience_writes_dropped": len(snapshot.pending)}
