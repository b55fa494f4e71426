"""Stage 2: cost-aware GRPO with the EvoHarness reward (EvoHarness-RL §4, Table 4).

`train_rl` is the whole loop: build the runtime from the config (resuming
from ``out_dir``'s last checkpoint), run its steps, write one metrics record
per step and the checkpoints, then the report and the final model. What a step
does (rollout, reward, advantage, update, experience consolidation) and where
(which cell, when) is the runtime's business:

- ``runtime.schedule = "inprocess"`` (default): the colocate schedule on one
  cell that is this process (`runtime.inprocess`): every GRPO lever
  (mini-batches, tree packing, KL), gateway rollouts, periodic evaluation.
- ``colocate | async | elastic | elastic-async``: K cell processes
  (`runtime.rl_job`); colocate on 1 cell plays the same episodes and updates.

A step commits in this order: append its metrics record, write the
checkpoint, move the ``latest`` pointer; after a kill at any point the same
command resumes from the committed checkpoint and ``metrics.jsonl`` continues
without gaps, duplicates or torn lines. A finished run also writes
``report.md`` + ``rl_curves.png``.
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm.auto import tqdm

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.factory import make_harness
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.checkpoint import get_rng_state, set_rng_state
from evoharness.files import append_jsonl, failpoint
from evoharness.config.rl import RLConfig


def train_rl(cfg: RLConfig, progress: bool = True) -> Path:
    """Run (or resume) GRPO from ``cfg.model_path``; returns the final model directory (with
    ``soup_seeds`` > 1: the seeds' weight average, `train.soup.train_soup`).

    Raises:
        ValueError: no model path, a setting the runtime cannot honour, another run's
            checkpoints in out_dir; GameDataError: bad data path or split.
    """
    from evoharness.eval.run_report import write_rl_report
    from evoharness.runtime.rl_job import build_runtime

    if not cfg.model_path:
        raise ValueError("rl needs model_path (the SFT model directory)")
    if cfg.soup_seeds > 1:
        from evoharness.train.soup import train_soup

        return train_soup(cfg, progress)
    out, t_start = Path(cfg.out_dir), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    runtime = build_runtime(cfg)                   # resumes from the last checkpoint
    bar = tqdm(total=cfg.steps, initial=runtime.step, desc=f"rl[{cfg.runtime.schedule}]", unit="step",
               disable=not progress, dynamic_ncols=True)
    try:
        for rec in runtime.steps():
            step = rec["step"]
            if cfg.eval_every and step % cfg.eval_every == 0:
                rec.update(runtime.evaluate())
            failpoint("before_metrics", step)
            append_jsonl(metrics_path, rec, step=step)
            failpoint("after_metrics", step)
            late = bool(cfg.max_minutes) and (time.perf_counter() - t_start) / 60 > cfg.max_minutes
            if step % cfg.ckpt_every == 0 or step == cfg.steps or late:
                runtime.save(step)
            bar.update(1)
            bar.set_postfix(success=f"{rec['success']:.2f}", reward=f"{rec['reward']:.2f}")
            if late:
                break
    finally:
        bar.close()
        runtime.close()
    write_rl_report(out, metrics_path)
    return runtime.export(out / "final")


def load_experience_fresh(path):
    """A trainable (unfrozen) experience store: from `path`, or the seeded default."""
    from evoharness.harness.bpe import ExperienceStore

    return ExperienceStore.load(path) if path else ExperienceStore()


def train_tasks(cfg: RLConfig) -> list:
    """The games RL trains on: ``cfg.split`` of the given task types, less ``exclude_games``, and
    only ``games`` when set.

    Raises:
        ValueError: ``games`` names a task id not in the split (or excluded, or of another type).
    """
    excluded = set(cfg.exclude_games)
    tasks = [t for t in select_tasks(discover_games(cfg.split, cfg.data_path), cfg.task_types)
             if t.task_id not in excluded]
    if cfg.games is None:
        return tasks
    wanted = set(cfg.games)
    tasks = [t for t in tasks if t.task_id in wanted]
    if len(tasks) != len(wanted):
        raise ValueError(f"{len(wanted) - len(tasks)} of the {len(wanted)} RL games are not trainable games of "
                         f"split {cfg.split!r} (unknown, excluded, or not of task_types)")
    return tasks


def branch_starts(cfg: RLConfig) -> list[tuple]:
    """``cfg.branches`` as ``(TaskSpec, prefix)`` pairs, each game looked up in ``cfg.split``.

    Raises:
        ValueError: a branch of a game not in the split, or of an excluded (development) game.
    """
    by_id = {t.task_id: t for t in discover_games(cfg.split, cfg.data_path)}
    excluded = set(cfg.exclude_games)
    bad = sorted({b.task_id for b in cfg.branches if b.task_id not in by_id or b.task_id in excluded})
    if bad:
        raise ValueError(f"{len(bad)} branch game(s) are not trainable games of split {cfg.split!r} "
                         f"(unknown or excluded): {bad[:3]}")
    return [(by_id[b.task_id], tuple(b.prefix)) for b in cfg.branches]


def step_cap(cfg: RLConfig, step: int, group: int, replayed: int = 0) -> int:
    """T_max of group `group` (0..P-1) of RL step `step`: ``max_steps``, or the ``step_caps`` mix; for a
    branch that replays `replayed` turns, at most ``replayed + branch_turns`` (when set)."""
    caps = cfg.step_caps
    cap = caps[(step * cfg.grpo.prompts_per_step + group) % len(caps)] if caps else cfg.max_steps
    return min(cap, replayed + cfg.branch_turns) if replayed and cfg.branch_turns else cap


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


def quick_eval(cfg: RLConfig, policy, store) -> dict:
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
