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
from typing import Literal

from pydantic import Field, model_validator
from tqdm.auto import tqdm

from evoharness.config import Strict
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.envs.repo.scaffold import AgentConfig
from evoharness.harness.factory import HarnessConfig, make_harness
from evoharness.harness.prompt import DEFAULT_MAX_PROMPT_TOKENS
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.runtime.rl_job import RuntimeConfig
from evoharness.train.checkpoint import append_jsonl, failpoint, get_rng_state, set_rng_state
from evoharness.train.grpo import GRPOConfig
from evoharness.train.sft_anchor import SFTAnchorConfig


class LLMConsolidatorConfig(Strict):
    """An OpenAI-compatible endpoint that consolidates the experience store's
    notes (`harness.bpe.llm_consolidator`); unset: the rule consolidator."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 2


class RepoRLConfig(Strict):
    """``env = "repo"``: GRPO on repository tasks over the runtime cells (`runtime.repo_backend`;
    docs/repo_env.md). Each execution's call records are trained as a trajectory tree
    (``grpo.j_max`` paths per tree; None: every trainable token once)."""

    tasks: str = "pack"                   # "pack", a task directory, or a directory of tasks
    task_ids: list[str] = []              # only these (default: all of `tasks`)
    agent: AgentConfig = Field(default_factory=AgentConfig)


class Branch(Strict):
    """A GRPO group's start state: game `task_id` after its first turns replay `prefix` (an
    earlier episode's completions up to where it went wrong, `pipeline.screened_games`); the
    group's samples share that state and only their own turns are trained (`grpo.turn_samples`).
    Branching from the states where the SFT model loops puts the group's whole reward spread on
    the decision it gets wrong, where a group started from the game's first turn reaches that
    state in few samples and trains it in few of its drawn turns."""

    task_id: str
    prefix: list[str] = Field(min_length=1)


class RLConfig(Strict):
    """``evoharness rl`` settings. Defaults: the paper's Table 4 (``grpo``) on
    ALFWorld train games with T_max = 70; the main job overrides the sizes for CPU."""

    model_path: str = ""  # the SFT model directory (policy init and KL reference)
    out_dir: str = "runs/rl"
    steps: int = 150
    split: str = "train"
    task_types: list[str] | None = None  # train (and evaluate) on these ALFWorld task types only; None: all six
    exclude_games: list[str] = []  # task ids never trained on (the main job's development set)
    # train on these task ids only (the main job's screened games, `pipeline.screen_rl_games`); None: all
    games: list[str] | None = Field(None, min_length=1)
    # with branches, every other GRPO group starts from the next branch (in this order, cycling)
    # instead of the next game's first turn (runtime.schedule = "inprocess" only)
    branches: list[Branch] = []
    # a branch episode ends after this many turns of its own (after its prefix; None: at the run's
    # T_max): the decision it branches for comes first, so a short episode trains it at a fraction
    # of a full one's cost
    branch_turns: int | None = Field(None, gt=0)
    # "positive": a branch group's negative advantages are set to 0, so its samples that stay in the
    # loop are not pushed down (the loop action, e.g. tracking the lamp, is right in states no branch
    # starts from). A lever, off by default (benchmarks/results/student/rl_levers_short_branch.md).
    branch_advantage: Literal["both", "positive"] = "both"
    data_path: str | None = None
    engine: Literal["textworld", "fast"] = "fast"
    # the placing-command wording played (envs/alfworld/wording.py): set it as the data it
    # continues from (collect --wording, eval env.wording), or RL trains on a wording SFT never saw
    wording: Literal["native", "put", "move"] = "native"
    max_steps: int = 70
    # T_max per GRPO group instead, cycling over the run's groups (group g of step u plays
    # step_caps[(u·P + g) % len]): a step-cap mix gives long-tail episodes (benchmarks/rl_runtime.py)
    step_caps: list[int] | None = Field(None, min_length=1)
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe"))
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    # each GRPO update also descends the SFT loss on these teacher examples (PPO-ptx; train.sft_anchor)
    sft_anchor: SFTAnchorConfig | None = None
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
    ckpt_every: int = Field(1, ge=1)  # a checkpoint every N steps (and at the last)
    keep_checkpoints: int = 2
    eval_every: int = 0  # 0: no periodic evaluation
    eval_split: str = "valid_seen"
    eval_limit: int | None = 42
    max_minutes: float | None = None
    llm_consolidator: LLMConsolidatorConfig | None = None
    # consolidate the rollouts' notes, pickups and use counts into the experience store after each
    # step (the paper's epoch boundary); False: they are dropped and the store RL starts from stays fixed
    consolidate_experience: bool = True
    # sample through a loopback OpenAI-compatible gateway on the live weights (`runtime.gateway.served_policy`):
    # the same trajectories as in-process, plus the gateway's call records in out_dir/gateway
    rollout_via_gateway: bool = False
    # where the steps run: "inprocess" (this module's loop) or a runtime schedule on K cell
    # processes (`runtime.rl_job`; colocate with 1 cell plays the same episodes and updates)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    # the RL workload: ALFWorld games, or repository tasks (`repo`; runtime schedules only)
    env: Literal["alfworld", "repo"] = "alfworld"
    repo: RepoRLConfig = Field(default_factory=RepoRLConfig)
    # N > 1: the run once per seed (seed, seed + 1, ...) and the policy their weight average
    # (`train.soup`); each seed's run in out_dir/seed<s>
    soup_seeds: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _soup_needs_fixed_store(self) -> "RLConfig":
        if self.soup_seeds > 1 and self.consolidate_experience:  # refused before any seed trains
            raise ValueError("soup_seeds > 1 needs consolidate_experience = false: each seed would consolidate "
                             "its own experience store, and stores have no average")
        return self

    @model_validator(mode="after")
    def _teacher_labels_need_bpe(self) -> "RLConfig":
        if self.sft_anchor is not None and self.sft_anchor.on_policy_coef > 0 and self.harness.kind != "bpe":
            raise ValueError("sft_anchor.on_policy_coef > 0 needs harness.kind = 'bpe': the scripted teacher "
                             "labels BPE-harness prompts only")
        return self


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
