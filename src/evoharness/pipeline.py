"""The main job: teacher traces -> tokenizer + model -> SFT (-> DAgger rounds) -> GRPO -> evaluations + learning curve -> report.

Each stage writes its outputs under ``out_dir`` and a ``.done`` marker; a rerun
skips finished stages and resumes a stage that was interrupted (trace
collection, SFT and RL all resume from their own files). A rerun with other
settings than the budget and worker counts is refused (it would report the
finished stages of the old settings as the new ones).

Budget: the training stages are sized in optimizer steps (``sft.max_steps``,
``dagger_sft_steps`` per DAgger round, ``rl.steps``), so the same command and
seed give the same model on a quiet or a loaded machine. ``budget_minutes``,
when set, additionally caps their wall time (SFT, DAgger and RL shares).

Data: ``dev_games`` train games (seeded, `dev_split`) are held out as the
development set: never in the teacher traces, DAgger rollouts or GRPO; every
choice (levers, the GRPO checkpoint) is made on it, valid_seen only reports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, model_validator

from evoharness.config.base import Strict
from evoharness.envs.alfworld.games import TASK_TYPES
from evoharness.eval.evaluate import evaluate, evaluate_many
from evoharness.config.env import EnvConfig
from evoharness.config.eval import EvalConfig
from evoharness.config.harness import HarnessConfig
from evoharness.files import read_jsonl
from evoharness.config.policy import PolicyConfig
from evoharness.rollout.episode import first_repeated_pair
from evoharness.rollout.records import Trajectory
from evoharness.train.rewards import spam_turns
from evoharness.train.rl import spread, train_rl
from evoharness.config.rl import Branch, RLConfig
from evoharness.config.sft import SFTConfig
from evoharness.config.sft import SFTAnchorConfig


def _default_sft() -> SFTConfig:
    # small batches, many steps (benchmarks/results/student/levers.md: at equal tokens 4K-token batches
    # beat 16K ones on the dev set); the prompt tokens trained too, at weight 2 (levers.md: the largest
    # lever measured); no packing: a 4K batch holds ~6 distinct states whose common prefix is 47 tokens
    # (9% of its tokens), and the tree mask cost more than that saved; the step budget, not the clock,
    # ends the stage. 2000 steps for the 45-minute job on the slower 2-core box (0.70-0.77 s/step: 23-26
    # min; the job 29.4 min in a fast hour, 47.8 min in a slow one, benchmarks/results/main_job/machine.txt):
    # 129/140 valid_seen and 54/60 dev, where 4000 steps (73.3 min) gave 137/140 and the same 54/60.
    # On the 540 bundled train games 4000 steps beat 5000 (57.9% vs 49.3% valid_seen) and all 3,493
    # ALFWorld train games at 4000 steps (33.6%): student/full_scale.md
    return SFTConfig(lr=2e-3, max_steps=2000, batch_tokens=4096, warmup_steps=20, max_prompt_tokens=1024,
                     max_completion_tokens=96, prompt_loss_weight=2.0, ckpt_every=1000, keep_checkpoints=100)


def _default_rl() -> RLConfig:
    """configs/rl_cpu.toml's settings (2 updates per batch) on every task type, at 4 groups (2 games and
    2 branches, below) x 8 samples per step, sampled at T = 1.5 on the screened games
    (`RunConfig.rl_screen_games`); 8 steps (354 s in all on the AMD 2-core box); the main job keeps
    the checkpoint best on the development set (`select_rl_checkpoint`). The SFT policy is near-deterministic (entropy ~0.01
    nats/token): at T = 0.6 on every game most groups had no success spread, at T = 1.0 its samples
    carried 0.01-0.05 nats/token, at 1.5 0.33-0.72. The experience store stays the teacher's:
    consolidating the student's own notes into it left every GRPO checkpoint below SFT on the
    development games (benchmarks/results/student/full_scale.md). 16 steps at T = 1.0 cost 549 s, 8
    at T = 1.5 479 s on the slower box. Measured from one SFT model (Intel box, 53/60 dev, 127/140
    valid_seen; benchmarks/results/student/rl_levers_anchor.md), 8 steps, RL seeds 0 / 1: this recipe
    54/60 (+1 / -0) and 54/60 (+2 / -1) dev, 129/140 (+2 / -0) and 127/140 (+3 / -3) valid_seen; with
    the SFT anchor (`sft_anchor`, PPO-ptx) 55/60 (+2 / -0) and 51/60 (+0 / -2), 130/140 and 124/140:
    not better, so off. The anchor does hold larger steps: lr 3e-4 alone 47/60 and 108/140 (+3 /
    -22), with it 53/60 and 127/140 (+6 / -6), with KL β 0.1 instead 55/60, 127/140 (+3 / -3); two
    PPO epochs 53/60, 130/140 (+5 / -2); RL on the lost games only 49/60, 118/140. From the AMD box's
    SFT model (54/60, 129/140; rl_levers8.md) this recipe gave 56/60 (+2 / -0), 133/140 (+4 / -0).

    The figures above are from 2 games per step without branches. Each step now plays 2 games and 2
    branches (`RunConfig.rl_branches`), a branch episode ending after 4 turns of its own
    (`branch_turns`). From another AMD SFT model (54/60 dev, 132/140 valid_seen;
    benchmarks/results/student/rl_levers_short_branch.md), RL seeds 0 / 1: 58/60 (+4 / -0) and 56/60
    (+2 / -0) dev, 132/140 (+3 / -3) and 136/140 (+5 / -1) valid_seen, where 2 games per step without
    branches gave 56/60 (+3 / -1) and 132/140 (+1 / -1) (student/main_job_amd/).

    Since then the run is a seed soup (`soup_seeds` 2, `train.soup`): RL seeds 0 and 1, each with the
    SFT anchor, and the policy their weight average, at twice the RL time (685 s in the main job on
    the AMD box, benchmarks/results/main_job/). From that SFT model (student/rl_levers_soup.md) it
    wins 58/60 (+4 / -0) dev and 137/140 (+5 / -0) valid_seen; its two runs alone 57/60 and 56/60,
    134/140 (+4 / -2) and 137/140. On the development games it ties the best arm of that table
    (58/60: the positive-only soup and three single runs, among them the previous default, whose RL
    seed 1 gave 56/60); across four recipes the soups lost 1 valid_seen game SFT won where their
    eight single runs lost 8. The lr stays constant: a cosine decay over 16 steps (Intel box, three
    seeds' SFT models) won 386/420 valid_seen against this recipe's 389/420, both 161/180 dev
    (student/rl_levers_cos.md)."""
    rl = RLConfig(steps=8, max_steps=30, max_new_tokens=48, max_prompt_tokens=1024, eval_every=0, decode_threads=1,
                  task_types=list(TASK_TYPES), ckpt_every=8, keep_checkpoints=100, consolidate_experience=False,
                  branch_turns=4, sft_anchor=SFTAnchorConfig(coef=1.0), soup_seeds=2)
    g = rl.grpo
    g.group_size, g.prompts_per_step, g.max_train_turns, g.mini_batches = 8, 4, 8, 2
    g.lr, g.temperature, g.micro_batch_size = 1e-4, 1.5, 16
    g.reward.t_max, g.reward.div_epochs = 30, 30
    return rl


# settings a rerun may change (how long and on how many workers), not what the stages compute
RESUME_FREE = ("out_dir", "budget_minutes", "threads", "eval_workers", "eval_batch", "sft.max_minutes",
               "sft.progress", "rl.max_minutes", "rl.threads", "rl.decode_threads", "curve_games")


class RunConfig(Strict):
    """The whole pipeline. Defaults: the embedded CPU default (bundled games, a
    from-scratch 'mini' model), budgeted in optimizer steps: evaluations included, 25.9 min on the
    quiet 2-core Intel box of benchmarks/results/main_job/; 32.4 min on the slower 2-core AMD box
    (git show de21ecc:benchmarks/results/main_job/), about 58 min at that box's slowest measured
    SFT speed."""

    out_dir: str = "runs/main"
    seed: int = 0
    # optional wall-clock cap (minutes) on the training stages (SFT, DAgger, RL; shares below);
    # None: they run their step budgets, the same model on any machine
    budget_minutes: float | None = None
    dev_games: int = 60  # train games held out as the development set (seeded; never trained on)
    # student rollouts labelled by the teacher, then more SFT (train/dagger.py). Off by default: at the
    # scales measured (benchmarks/results/student/levers.md) it did not beat the same steps on teacher traces
    dagger_rounds: int = 0
    dagger_games: int = 100  # train games the student plays per round
    dagger_beta: float = 0.0  # probability the teacher's action is executed instead of the student's
    dagger_sft_steps: int = 300  # SFT steps per round on teacher + all DAgger examples so far
    # peak lr of a round's SFT: about where the first SFT stage's cosine ended (sft.lr 2e-3 x 0.1). A
    # round fine-tunes a converged model; re-warmed to sft.lr it lost games (50/60 dev against SFT's 53;
    # at 2e-4 54/60: benchmarks/results/student/dagger90_lr2e3/, dagger90/)
    dagger_lr: float = Field(2e-4, gt=0)
    stop_repeats: int = 3  # evaluation/DAgger: end an episode whose (prompt, completion) repeats K times
    curve_games: int = 20  # dev games each saved checkpoint plays for the learning curve (0: no curve)
    # before RL the SFT model plays this many training games (greedy, once); RL then trains on the ones
    # it lost, mixed 1:1 with ones it won (`rl_games.json`): a group of a game the near-deterministic
    # SFT policy always wins has no success spread, so no GRPO signal (0: RL on every training game)
    rl_screen_games: int = Field(160, ge=0)
    # every other GRPO group starts from a state where a lost screened game began to loop
    # (`rl_games.json` "branches", `train.rl.Branch`) instead of a game's first turn; with no
    # branch found (no lost screened game repeated an action) every group plays a game
    rl_branches: bool = True
    # branches also from lost screened episodes that cycle through states (`screened_games` cycles).
    # Off: as a seed soup it won 57/60 dev against 58/60 without (student/rl_levers_soup.md), and
    # 161/180 like the default over the Intel box's three seeds (student/rl_levers_cyc_seeds.md)
    rl_branch_cycles: bool = False
    select_rl_checkpoint: bool = True  # SFT+GRPO = the RL checkpoint best on the dev games (SFT if strictly better)
    env: EnvConfig = Field(default_factory=lambda: EnvConfig(engine="fast"))
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe", system_prompt="compact"))
    teacher: PolicyConfig = Field(default_factory=lambda: PolicyConfig(kind="teacher"))
    train_split: str = "train"
    train_games: int | None = None  # None: every train game available
    teacher_samples: int = 1
    # fraction of the teacher's goal-search steps that also get a minimal-pair twin: the goal object
    # removed from / inserted into the observation, relabelled by the teacher (train/counterfactual.py)
    counterfactual_rate: float = Field(0.0, ge=0.0, le=1.0)
    # fraction of the teacher's examples replaced by a rewrite whose receptacle instances carry numbers
    # shifted by up to `renumber_max_shift` per type, kept where the teacher labels it so (train/renumber.py).
    # Off: at 0.5 SFT won 97/140 valid_seen against 127/140, at 0.1 128/140 (student/main_job_renumber*/)
    renumber_rate: float = Field(0.0, ge=0.0, le=1.0)
    renumber_max_shift: int = Field(10, ge=1)
    max_steps: int = 50
    model_path: str | None = None  # an existing HF model directory; None: a new one from scratch
    model_preset: Literal["mini", "tiny", "small", "base"] = "mini"
    # Qwen3Config fields over the preset's, e.g. --set model_overrides.head_dim=64 (misspelt fields are refused)
    model_overrides: dict[str, int | float | bool] = Field(default_factory=dict)
    vocab_size: int = 2048
    sft: SFTConfig = Field(default_factory=_default_sft)
    rl: RLConfig = Field(default_factory=_default_rl)
    skip_rl: bool = False
    eval_teacher_only_sft: bool = False  # also evaluate the SFT model before DAgger (the DAgger comparison)
    eval_split: str = "valid_seen"
    eval_limit: int | None = None  # N eval_split games, round-robin across task types (smoke runs); None: all
    dev_eval_limit: int | None = None  # first N development games for the dev evaluations (None: all)
    eval_batch: int = 100  # episodes per lock-step batch: valid_seen + dev (200) in one batch per worker
    eval_workers: int = 2  # evaluation processes (1 thread each): both cores of a quiet machine
    constrained: bool = True
    sft_budget_share: float = 0.55  # of budget_minutes, when set (DAgger rounds included)
    rl_budget_share: float = 0.12
    # torch CPU threads for the whole job (evaluations run in `eval_workers` 1-thread processes).
    # 2: SFT runs 1.7x faster than on 1 on a quiet 2-core machine (student/step_costs.md) (the setting the step budgets
    # are sized for). With another busy process, OpenMP spin-waiting made 2 threads 2.5x slower
    # than 1 (machine-notes.md): set 1 on a shared box.
    threads: int | None = 2

    @model_validator(mode="after")
    def _one_prompt_recipe(self) -> "RunConfig":
        # SFT trains on the prompts RL and evaluation show: one harness config
        # (``harness``) and one prompt budget for every stage.
        if self.rl.max_prompt_tokens != self.sft.max_prompt_tokens:
            raise ValueError(f"rl.max_prompt_tokens ({self.rl.max_prompt_tokens}) must equal sft.max_prompt_tokens "
                             f"({self.sft.max_prompt_tokens}): the student must see the prompts it was trained on")
        if self.rl.harness != HarnessConfig(kind="bpe"):
            raise ValueError("set the harness for every stage with `harness.*`, not `rl.harness.*`")
        if self.rl_branches and self.rl.runtime.schedule != "inprocess":  # refused here, not after SFT
            raise ValueError(f"rl_branches runs with rl.runtime.schedule = 'inprocess' only (got "
                             f"{self.rl.runtime.schedule!r}): set rl_branches=false")
        return self


def dev_split(cfg: RunConfig) -> tuple[list, list]:
    """(training games, development games) of ``cfg.train_split``: `dev_games` of them
    drawn with ``cfg.seed`` as the development set (stratified by task type, types
    interleaved), the rest (first
    `train_games`) to train on."""
    import random

    from evoharness.envs.alfworld.games import discover_games

    tasks = discover_games(cfg.train_split, cfg.env.data_path)
    if cfg.dev_games >= len(tasks):
        raise ValueError(f"dev_games={cfg.dev_games} leaves no training game of {len(tasks)} in {cfg.train_split!r}")
    # stratified by task type, interleaved: any prefix (dev_eval_limit, curve_games) is balanced across types
    rng, by_id = random.Random(f"dev:{cfg.seed}"), {t.task_id: t for t in tasks}
    types = sorted({t.task_type for t in tasks})
    pools = {tt: rng.sample(sorted(t.task_id for t in tasks if t.task_type == tt),
                            sum(t.task_type == tt for t in tasks)) for tt in types}
    dev_ids = [pools[types[i % len(types)]][i // len(types)] for i in range(cfg.dev_games)]
    train = [t for t in tasks if t.task_id not in set(dev_ids)]
    return (train[: cfg.train_games] if cfg.train_games else train), [by_id[i] for i in dev_ids]


def dev_teacher_examples(cfg: RunConfig, store: Path, traces: Path, n_games: int | None = None) -> list[dict]:
    """The scripted teacher's turns on the first `n_games` development games of `cfg` (all when
    None) as SFT example dicts, for probes that must not see training states. The teacher starts
    from an in-memory copy of the experience store at `store` (the file is never written);
    trajectories are written to `traces`."""
    from evoharness.envs.alfworld import make_env
    from evoharness.harness.bpe import ExperienceStore
    from evoharness.harness.factory import make_harness
    from evoharness.policies.factory import make_policy
    from evoharness.rollout.collect import collect_traces, traces_to_sft

    traces.unlink(missing_ok=True)  # collect_traces resumes a file; these are always played afresh
    collect_traces(dev_split(cfg)[1][:n_games], make_policy(cfg.teacher), lambda s: make_harness(cfg.harness, experience=s),
                   lambda t: make_env(t, engine=cfg.env.engine, wording=cfg.env.wording), traces,
                   max_steps=cfg.max_steps, batch_size=32, experience=ExperienceStore.load(store), seed=cfg.seed,
                   progress=False)
    return traces_to_sft(traces)


def balanced_subset(split: str, data_path: str | None, n: int) -> list[str]:
    """`n` task ids of `split` taken round-robin across task types, each type in panel order
    (a smoke-size panel that still has every type)."""
    from evoharness.envs.alfworld.games import discover_games

    tasks = discover_games(split, data_path)
    pools = [[t.task_id for t in tasks if t.task_type == tt] for tt in dict.fromkeys(t.task_type for t in tasks)]
    out = []
    for i in range(max(map(len, pools), default=0)):
        out += [p[i] for p in pools if i < len(p)]
    return out[:n]


def sft_dirs(cfg: RunConfig, out: Path) -> list[Path]:
    """The SFT stages' run directories: ``sft`` then ``sft_dagger<r>`` per DAgger round."""
    return [out / "sft"] + [out / f"sft_dagger{r}" for r in range(1, cfg.dagger_rounds + 1)]


def rl_config(cfg: RunConfig, out: Path) -> RLConfig:
    """The RL stage's config: ``cfg.rl`` with the run's harness (and the teacher's
    experience store), engine, data, wording, constraint, seed and held-out games (the
    screened games, ``rl_games.json``, are the RL stage's to add)."""
    rl_cfg = cfg.rl.model_copy(deep=True)
    rl_cfg.model_path, rl_cfg.out_dir = str(sft_dirs(cfg, out)[-1] / "final"), str(out / "rl")
    rl_cfg.engine, rl_cfg.data_path, rl_cfg.wording = cfg.env.engine, cfg.env.data_path, cfg.env.wording
    rl_cfg.harness = cfg.harness.model_copy(update={"experience_path": str(out / "experience.json")})
    rl_cfg.constrained, rl_cfg.seed = cfg.constrained, cfg.seed
    rl_cfg.split = cfg.train_split
    rl_cfg.exclude_games = sorted(t.task_id for t in dev_split(cfg)[1])
    if rl_cfg.sft_anchor is not None and not rl_cfg.sft_anchor.data_path:  # the teacher rows SFT trained on
        rl_cfg.sft_anchor = rl_cfg.sft_anchor.model_copy(update={
            "data_path": str(out / "sft_examples.jsonl"), "max_prompt_tokens": cfg.sft.max_prompt_tokens,
            "max_completion_tokens": cfg.sft.max_completion_tokens})
    if rl_cfg.max_minutes is None and cfg.budget_minutes is not None:
        rl_cfg.max_minutes = cfg.budget_minutes * cfg.rl_budget_share
    return rl_cfg


def screen_rl_games(cfg: RunConfig, run: Path, n: int, out: Path | None = None) -> dict:
    """The SFT model of the main job in `run` (its last SFT stage, its experience store) plays `n`
    training games drawn with the run's seed (never a development game; greedy, once each; the
    episodes in ``<out or run>/eval/rl_screen``); returns `screened_games` of them."""
    import random

    out = out or run
    train = dev_split(cfg)[0]
    picked = random.Random(f"rl_screen:{cfg.seed}").sample(train, min(n, len(train)))
    evaluate(eval_config(cfg, out, "rl_screen", model_policy(cfg, sft_dirs(cfg, run)[-1] / "final"),
                         run / "experience.json", [t.task_id for t in picked]))
    return screened_games(read_jsonl(out / "eval" / "rl_screen" / "episodes.jsonl"), cfg.rl_branch_cycles)


def screened_games(episodes: list[dict], cycles: bool = False) -> dict:
    """RL's games from the SFT model's screening episodes (one per game, panel order): every
    game it lost, then as many it won, evenly spaced over the panel so every task type keeps
    some (`train.rl.spread`), so RL also rehearses what SFT already does right. When it lost
    none: every screened game. Each lost episode that repeated an action with nothing changed
    (`train.rewards.spam_turns`) also gives a branch (`train.rl.Branch`): its completions up to
    that first repeat, the state where it started to loop. `cycles`: also a lost episode that
    cycles (`rollout.episode.first_repeated_pair`: a state met again and answered the same, e.g.
    ``go to shelf 7``, ``go to shelf 8``, ``go to shelf 7``), from whichever repeat comes first.

    Returns ``{"games": [task ids], "lost": [task ids], "screened": number of episodes,
    "branches": [{"task_id", "prefix"}]}``.
    """
    lost = [e["task_id"] for e in episodes if not e["won"]]
    won = [e["task_id"] for e in episodes if e["won"]]
    branches = []
    for e in episodes:
        if e["won"] or e.get("stop_reason") == "error" or not e.get("turns"):
            continue
        traj = Trajectory.from_dict(e)
        starts = spam_turns(traj)[:1] + ([first_repeated_pair(traj)] if cycles else [])
        if (start := min((i for i in starts if i), default=0)) > 0:
            branches.append({"task_id": traj.task_id, "prefix": [t.completion for t in traj.turns[:start]]})
    return {"games": lost + spread(won, len(lost)) if lost else won, "lost": lost, "screened": len(episodes),
            "branches": branches}


def model_policy(cfg: RunConfig, path: Path, temperature: float = 0.0) -> PolicyConfig:
    """A trained model as the evaluation policy, with the prompt budget SFT trained on."""
    return PolicyConfig(kind="hf", model_path=str(path), temperature=temperature, constrained=cfg.constrained,
                        max_tokens=cfg.rl.max_new_tokens, max_prompt_tokens=cfg.sft.max_prompt_tokens,
                        seed=cfg.seed, num_threads=cfg.rl.decode_threads)


def eval_config(cfg: RunConfig, out: Path, name: str, policy: PolicyConfig, store: Path,
                games: list[str] | None = None) -> EvalConfig:
    """An evaluation stage's config: the run's harness with experience store `store`;
    `games` (train-split task ids): the development set instead of ``eval_split``."""
    harness = cfg.harness.model_copy(update={"experience_path": str(store)})
    split = cfg.train_split if games is not None else cfg.eval_split
    if games is None and cfg.eval_limit:
        games = balanced_subset(cfg.eval_split, cfg.env.data_path, cfg.eval_limit)
    return EvalConfig(split=split, games=games, seed=cfg.seed, max_steps=cfg.max_steps,
                      workers=cfg.eval_workers, batch_size=cfg.eval_batch, out_dir=str(out / "eval" / name),
                      env=cfg.env, harness=harness, policy=policy, stop_repeats=cfg.stop_repeats)


class Stage:
    """Runs a pipeline stage once: skipped when its ``.done`` marker exists (it holds the
    stage's wall seconds, which the report lists)."""

    def __init__(self, out: Path, log: Callable[[str], None]) -> None:
        self.out, self.log = out, log

    def __call__(self, name: str, fn: Callable[[], object], outputs: tuple[Path, ...] = ()) -> None:
        """Run `fn` unless the stage finished earlier and every one of `outputs` exists."""
        marker = self.out / f".{name}.done"
        if marker.exists() and all(p.exists() for p in outputs):
            self.log(f"[{name}] done earlier, skipped")
            return
        self.log(f"[{name}] ...")
        t = time.perf_counter()
        fn()
        marker.write_text(f"{time.perf_counter() - t:.1f}")
        self.log(f"[{name}] finished in {time.perf_counter() - t:.0f} s")

    def times(self) -> dict[str, float]:
        """Wall seconds of every finished stage (from the markers), in finishing order."""
        out: dict[str, float] = {}
        for m in sorted(self.out.glob(".*.done"), key=lambda p: p.stat().st_mtime):
            name = "learning curve (checkpoint evals)" if m.name.startswith(".curve_") else m.name[1:-5]
            out[name] = out.get(name, 0.0) + float(m.read_text() or 0)
        return out


def run_pipeline(cfg: RunConfig, log: Callable[[str], None] = print) -> Path:
    """Run (or resume) the main job; returns the report path."""
    from evoharness.envs.alfworld import make_env
    from evoharness.eval.run_report import write_run_report
    from evoharness.harness.factory import make_harness
    from evoharness.policies.factory import make_policy
    from evoharness.rollout.collect import collect_traces, traces_to_sft, write_jsonl_atomic

    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob(".*.done")):  # a rerun resumes the same job only: finished stages are not redone
        from evoharness.train.checkpoint import check_resume_config

        check_resume_config(out / "run_config.json", json.loads(cfg.model_dump_json()), RESUME_FREE)
    (out / "run_config.json").write_text(cfg.model_dump_json(indent=2))
    stage = Stage(out, log)
    t0 = time.perf_counter()
    traces, sft_data = out / "teacher_traces.jsonl", out / "sft_examples.jsonl"
    model_dir, rl_dir = out / "model_init", out / "rl"
    sfts = sft_dirs(cfg, out)
    # The experience store the teacher built on the train games: the student starts from it.
    experience = out / "experience.json"
    train_tasks, dev_tasks = dev_split(cfg)
    dev_ids = [t.task_id for t in dev_tasks]
    (out / "dev_games.json").write_text(json.dumps(dev_ids, indent=1))
    sft_minutes = None if cfg.budget_minutes is None else cfg.budget_minutes * cfg.sft_budget_share / (1 + cfg.dagger_rounds)

    def make_game(task):
        return make_env(task, engine=cfg.env.engine, wording=cfg.env.wording)

    def collect() -> None:
        stats = collect_traces(train_tasks, make_policy(cfg.teacher), lambda store: make_harness(cfg.harness, experience=store),
                               make_game, traces, samples=cfg.teacher_samples, max_steps=cfg.max_steps, batch_size=32,
                               experience_path=experience, seed=cfg.seed, wording=cfg.env.wording)
        examples = traces_to_sft(traces)
        n_teacher = len(examples)
        if cfg.renumber_rate:
            from evoharness.train.renumber import renumber_examples

            examples, n_renumbered = renumber_examples(examples, cfg.renumber_rate, cfg.renumber_max_shift, cfg.seed)
            log(f"  {n_renumbered} of {n_teacher} teacher examples renumbered")
        if cfg.counterfactual_rate:
            from evoharness.train.counterfactual import add_counterfactuals

            examples = add_counterfactuals(examples, cfg.counterfactual_rate, seed=cfg.seed)
        write_jsonl_atomic(sft_data, examples)
        log(f"  teacher won {stats.won}/{stats.played} train episodes; {n_teacher} SFT examples"
            + (f" + {len(examples) - n_teacher} counterfactual twins" if len(examples) > n_teacher else ""))

    def build_model() -> None:
        from evoharness.models.init import PRESETS, count_params, init_model
        from evoharness.models.tokenizer import build_tokenizer

        examples = read_jsonl(sft_data)
        corpus = [m["content"] for ex in examples for m in ex["messages"]] + [ex["completion"] for ex in examples]
        tok = build_tokenizer(corpus, model_dir, vocab_size=cfg.vocab_size)
        arch = {**PRESETS[cfg.model_preset], **cfg.model_overrides}
        model = init_model(arch, tok, out_dir=model_dir, seed=cfg.seed)
        log(f"  tokenizer: {len(tok)} tokens; model: Qwen3 '{cfg.model_preset}', {count_params(model) / 1e6:.2f}M params")

    def sft(r: int) -> Callable[[], None]:
        def run() -> None:
            from evoharness.train.sft import train_sft

            sft_cfg = cfg.sft.model_copy()
            if r > 0:
                sft_cfg.max_steps = cfg.dagger_sft_steps
                sft_cfg.lr = cfg.dagger_lr
            if sft_cfg.max_minutes is None:
                sft_cfg.max_minutes = sft_minutes
            data = read_jsonl(sft_data) + [ex for k in range(1, r + 1) for ex in read_jsonl(out / f"dagger{k}.jsonl")]
            start = (cfg.model_path or model_dir) if r == 0 else sfts[r - 1] / "final"
            train_sft(sft_cfg, data, start, sfts[r])
        return run

    def dagger(r: int) -> Callable[[], None]:
        def run() -> None:
            import random

            from evoharness.harness.factory import load_experience
            from evoharness.train.dagger import dagger_round

            tasks = random.Random(f"dagger:{cfg.seed}:{r}").sample(train_tasks, min(cfg.dagger_games, len(train_tasks)))
            store = load_experience(str(experience))
            student = make_policy(model_policy(cfg, sfts[r - 1] / "final"))
            try:
                st = dagger_round(tasks, student, lambda: make_harness(cfg.harness, experience=store), make_game,
                                  out / f"dagger{r}.jsonl", beta=cfg.dagger_beta, seed=cfg.seed + r,
                                  max_steps=cfg.max_steps, batch_size=cfg.eval_batch, stop_repeats=cfg.stop_repeats,
                                  episode_prefix=f"dagger{r}")
            finally:
                student.close()
            log(f"  student won {st.won}/{st.played} train games; {st.examples} labelled states "
                f"(agreement with the teacher {st.agreement:.0%})")
        return run

    def rl_screen() -> None:
        from evoharness.files import atomic_write_text

        games = screen_rl_games(cfg, out, cfg.rl_screen_games)
        atomic_write_text(out / "rl_games.json", json.dumps(games, indent=1))
        log(f"  RL games: the {len(games['lost'])} of {games['screened']} screened training games the SFT model "
            f"lost + {len(games['games']) - len(games['lost'])} it won")

    def rl() -> None:
        rl_cfg = rl_config(cfg, out)
        if cfg.rl_screen_games:  # the rl_screen stage's choice
            screened = json.loads((out / "rl_games.json").read_text())
            rl_cfg.games = screened["games"]
            if cfg.rl_branches:
                rl_cfg.branches = [Branch(**b) for b in screened["branches"]]
        train_rl(rl_cfg)

    dev_games = dev_ids[: cfg.dev_eval_limit]

    def evaluate_system(name: str, policy: PolicyConfig, store: Path = experience) -> None:
        """Stage ``eval_<name>``: the system on both panels in one pool of lock-step batches
        (`evaluate_many`), into ``eval/<name>`` and ``eval/dev_<name>``."""
        def run() -> None:
            for s, panel in zip(evaluate_many([eval_config(cfg, out, name, policy, store),
                                               eval_config(cfg, out, f"dev_{name}", policy, store, dev_games)]),
                                (cfg.eval_split, "dev")):
                log(f"  {name} {panel}: {s['overall']['won']}/{s['overall']['n']} = {s['overall']['success']}%"
                    f" ({s['overall'].get('stopped_early', 0)} stopped early)")
        stage(f"eval_{name}", run, (out / "eval" / name / "summary.json", out / "eval" / f"dev_{name}" / "summary.json"))

    stage("collect", collect)
    if cfg.model_path is None:
        stage("model", build_model)
    stage("sft", sft(0))
    for r in range(1, cfg.dagger_rounds + 1):
        stage(f"dagger{r}", dagger(r))
        stage(f"sft_dagger{r}", sft(r))
    sft_final = sfts[-1] / "final"
    if not cfg.skip_rl:
        if cfg.rl_screen_games:
            stage("rl_screen", rl_screen)
        stage("rl", rl)
    evaluate_system("random", PolicyConfig(kind="random", seed=cfg.seed))
    evaluate_system("scripted_teacher", cfg.teacher)
    if cfg.dagger_rounds and cfg.eval_teacher_only_sft:
        evaluate_system("sft_teacher_only", model_policy(cfg, sfts[0] / "final"))
    evaluate_system("sft", model_policy(cfg, sft_final))
    # The checkpoints the final models are (the SFT stage's last, RL's last) get their curve points
    # from these full development-set evaluations instead of playing the curve games again.
    reuse = {}
    last_sft = _last_checkpoint(sfts[-1])
    if last_sft is not None and _last_step(sfts[-1]) == int(last_sft.name.split("_")[1]):
        reuse[last_sft] = out / "eval" / "dev_sft"  # final/ is this checkpoint's weights (in the model's dtype)
    select = bool(cfg.curve_games and cfg.select_rl_checkpoint and not cfg.skip_rl)
    last_rl = _last_checkpoint(rl_dir) if select else None
    if last_rl is not None:  # the usual choice: evaluated before the choice, both panels at once
        evaluate_system("rl_last", model_policy(cfg, last_rl), last_rl / "experience.json")
        reuse[last_rl] = out / "eval" / "dev_rl_last"
    curve = learning_curve(cfg, out, stage, dev_ids[: cfg.curve_games], log, reuse) if cfg.curve_games else None
    grpo_eval = "sft_grpo"  # the eval directory of the system reported as SFT + GRPO
    if select and curve:
        best, grpo_eval = chosen_rl(curve["points"], last_rl)
        curve["rl_selected"] = best
        # the games that chose it: a paired comparison on them is not a test (eval.run_report)
        curve["chosen_on"] = dev_ids if selection_key(curve["points"]) == "dev_success" else curve["game_ids"]
        (out / "curve.json").write_text(json.dumps(curve, indent=1))
        if grpo_eval.startswith("rl_step"):
            evaluate_system(grpo_eval, model_policy(cfg, Path(best["path"])), Path(best["path"]) / "experience.json")
    elif not cfg.skip_rl and (rl_dir / "final").exists():
        evaluate_system("sft_grpo", model_policy(cfg, rl_dir / "final"), rl_dir / "final" / "experience.json")
    evals = {"random": "random", "scripted_teacher": "scripted_teacher"}  # display order; each model row is compared with the one above
    if cfg.dagger_rounds and cfg.eval_teacher_only_sft:
        evals["sft_teacher_only"] = "sft_teacher_only"
    evals["sft"] = "sft"
    if not cfg.skip_rl and (out / "eval" / grpo_eval / "summary.json").exists():
        evals["sft_grpo"] = grpo_eval
    # which evaluation each reported system is (eval/<dir> valid_seen, eval/dev_<dir> development set)
    (out / "systems.json").write_text(json.dumps(evals, indent=1))
    labels = {"random": "random", "scripted_teacher": "scripted teacher (non-privileged)",
              "sft_teacher_only": "SFT on teacher traces only", "sft": "SFT" + (" + DAgger" if cfg.dagger_rounds else ""),
              "sft_grpo": "SFT" + (" + DAgger" if cfg.dagger_rounds else "") + " + GRPO"}
    summaries = {labels[n]: out / "eval" / e for n, e in evals.items()}
    dev = {labels[n]: out / "eval" / f"dev_{e}" for n, e in evals.items()}
    rl_note = ""
    if curve and "rl_selected" in curve:
        sel = curve["rl_selected"]
        key = selection_key(curve["points"])
        rl_note = (f"SFT + GRPO is the checkpoint best on {len(curve['chosen_on'])} development games "
                   f"({'all' if key == 'dev_success' else 'the curve'} games): "
                   + ("the SFT model itself (every RL checkpoint did worse; its rows repeat the SFT evaluation)"
                      if sel["stage"] != "rl" else f"RL step {sel['step']}")
                   + f" ({sel[key]:.1f}%).")
        rl_note += unchosen_last_rl(out, grpo_eval)
    notes = [
        f"Model: Qwen3-architecture '{cfg.model_preset}'{_fields(cfg.model_overrides)} initialised from scratch, "
        f"tokenizer trained locally (vocab {cfg.vocab_size}); decoding {'constrained to admissible commands / meta-actions' if cfg.constrained else 'free'}, greedy.",
        f"SFT: {cfg.sft.batch_tokens}-token batches, lr {cfg.sft.lr:g} (cosine), loss on the completion"
        + (f" + {cfg.sft.prompt_loss_weight:g} x the prompt-token loss" if cfg.sft.prompt_loss_weight else " tokens only")
        + f"; GRPO on {', '.join(cfg.rl.task_types) if cfg.rl.task_types else 'every task type'}; torch threads {cfg.threads}.",
        f"Budget in optimizer steps: SFT {cfg.sft.max_steps}, DAgger {cfg.dagger_rounds} round(s) x {cfg.dagger_games} games "
        f"+ {cfg.dagger_sft_steps} SFT steps{f' at lr {cfg.dagger_lr:g}' if cfg.dagger_rounds else ''}, "
        f"GRPO {0 if cfg.skip_rl else cfg.rl.steps}"
        + (f" x {cfg.rl.soup_seeds} RL seeds (the policy their weight average)" if cfg.rl.soup_seeds > 1 else "")
        + (f"; wall cap {cfg.budget_minutes:.0f} min" if cfg.budget_minutes else "; no wall cap")
        + f". The stages took {sum(stage.times().values()) / 60:.1f} min in all (table below); this invocation "
        f"{(time.perf_counter() - t0) / 60:.1f} min (a rerun resumes: finished stages are not redone).",
        f"Development set: {len(dev_ids)} train games held out (seed {cfg.seed}; `dev_games.json`), never trained on.",
        f"Engine `{cfg.env.engine}`, step cap {cfg.max_steps}, eval split `{cfg.eval_split}`"
        + (f" ({cfg.eval_limit} games, round-robin across types)" if cfg.eval_limit else " (full panel)")
        + f"; an episode whose (prompt, completion) repeats {cfg.stop_repeats} times is stopped early and counts as a failure.",
    ] + ([rl_note] if rl_note else [])
    return write_run_report(out, summaries, dev, [d / "metrics.jsonl" for d in sfts],
                            None if cfg.skip_rl else rl_dir / "metrics.jsonl", notes, stage.times(), curve)


def unchosen_last_rl(out: Path, grpo_eval: str) -> str:
    """What the GRPO stage's last checkpoint did when the development games chose another model as
    SFT + GRPO (`chosen_rl`): its valid_seen and dev wins, paired per game against SFT
    (`eval.run_report.paired`; dev is the set that chose against it), as a sentence starting with a
    space; "" when it is the reported model or was not evaluated (``eval/rl_last``)."""
    from evoharness.eval.run_report import paired

    if grpo_eval == "rl_last" or not (out / "eval" / "rl_last" / "episodes.jsonl").is_file():
        return ""
    parts = []
    for panel, prefix in (("valid_seen", ""), ("dev", "dev_")):
        sft = read_jsonl(out / "eval" / f"{prefix}sft" / "episodes.jsonl")
        last = read_jsonl(out / "eval" / f"{prefix}rl_last" / "episodes.jsonl")
        c = paired(sft, last)
        parts.append(f"{sum(e['won'] for e in last)}/{len(last)} {panel} (+{c['b_only']} / -{c['a_only']} "
                     f"against SFT, p = {c['p']:.3g})")
    return " The GRPO stage's last checkpoint, not chosen, won " + " and ".join(parts) + "."


def selection_key(points: list[dict]) -> str:
    """What `chosen_rl` ranks on: ``dev_success`` (the whole development set) when every candidate
    (``stage`` "rl" or "sft_final") played it, as the SFT model and the last RL checkpoint do by
    default; else ``success`` (the curve's games, which every checkpoint plays)."""
    cands = [p for p in points if p["stage"] in ("rl", "sft_final")]
    return "dev_success" if cands and all("dev_success" in p for p in cands) else "success"


def chosen_rl(points: list[dict], last_rl: Path | None) -> tuple[dict, str]:
    """The model reported as SFT + GRPO: the RL checkpoint best on the development games
    (`selection_key`; ties among RL checkpoints: the earlier in training minutes), or the SFT model
    when it beats every RL checkpoint there. A tie with SFT goes to RL: stage 2 is the product, the
    60 development games tie often (three of five seeds of today's default), and on the development
    games alone the last RL checkpoint beat or tied SFT from each of four earlier SFT models, pooled
    +8 / -1 (`benchmarks/results/student/rl_levers_seeds.md`), and from four of today's five, +2 / -2
    (`benchmarks/results/student/main_job_seeds_next.md`). Returns it and the evaluation directory that holds it:
    ``sft`` (its rows repeat the SFT evaluation),
    ``rl_last`` (the last RL checkpoint, evaluated before the choice) or ``rl_step<N>`` (an earlier
    one, named by its step so a rerun that chooses another one plays that one).

    Args:
        points: `learning_curve` points (``stage`` "rl" or "sft_final" are candidates).
        last_rl: the last RL checkpoint directory, or None.
    """
    key = selection_key(points)
    best = max((p for p in points if p["stage"] in ("rl", "sft_final")),
               key=lambda p: (p[key], p["stage"] == "rl", -p["minutes"]))
    if best["stage"] == "sft_final":
        return best, "sft"
    if last_rl is not None and Path(best["path"]) == last_rl:
        return best, "rl_last"
    return best, f"rl_step{best['step']}"


def learning_curve(cfg: RunConfig, out: Path, stage: Stage, games: list[str], log: Callable[[str], None],
                   reuse: dict[Path, Path] | None = None) -> dict:
    """Dev success of every saved checkpoint against cumulative training minutes.

    Each SFT/DAgger checkpoint (``checkpoints/step_N``) and each RL checkpoint plays
    `games` (development games, greedy, early stopping); minutes are the stages'
    training wall time up to that step (DAgger rollouts included). A checkpoint in `reuse`
    (checkpoint -> an evaluation directory of its weights on a development set holding every
    one of `games`) takes its point from that evaluation's episodes on `games` instead, and its
    success on that whole set as ``dev_success`` (%, ``dev_games`` games).
    Written to ``curve.json``: ``{"games", "game_ids", "points": [{"stage", "step", "minutes",
    "success", "path"[, "dev_success", "dev_games"]}]}``.
    """
    points, offset, reuse = [], 0.0, reuse or {}
    small = cfg.model_copy(update={"eval_workers": 1})  # a few games: worker start-up would cost more than play
    stages = [(d.name, d) for d in sft_dirs(cfg, out)]
    if not cfg.skip_rl:
        stages.append(("rl", out / "rl"))
    for name, d in stages:
        if name.startswith("sft_dagger"):
            offset += float((out / f".dagger{name[len('sft_dagger'):]}.done").read_text() or 0) / 60
        elapsed = _elapsed(d)
        for ck in sorted((d / "checkpoints").glob("step_*")):
            step = int(ck.name.split("_")[1])
            won = _won_on(reuse[ck], games) if ck in reuse else None
            if won is None:
                store = ck / "experience.json" if name == "rl" else out / "experience.json"
                ename = f"curve/{name}_{step:05d}"
                stage(f"curve_{name}_{step}", lambda ck=ck, store=store, ename=ename: evaluate(
                    eval_config(small, out, ename, model_policy(cfg, ck), store, games), progress=False))
                won = _won_on(out / "eval" / ename, games)
            points.append({"stage": name, "step": step, "minutes": round(offset + elapsed.get(step, 0) / 60, 2),
                           "success": round(100 * sum(won) / max(1, len(won)), 1), "path": str(ck)})
            if ck in reuse:
                full = [e["won"] for e in read_jsonl(reuse[ck] / "episodes.jsonl")]
                points[-1].update(dev_success=round(100 * sum(full) / len(full), 1), dev_games=len(full))
        offset += max(elapsed.values(), default=0) / 60
        if name == sft_dirs(cfg, out)[-1].name:
            last = max((p for p in points if p["stage"] == name), key=lambda p: p["step"], default=None)
            if last is not None:
                points.append({**last, "stage": "sft_final"})
    curve = {"games": len(games), "game_ids": list(games), "points": points}
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    log("  learning curve: " + ", ".join(f"{p['stage']}@{p['step']}={p['success']:.0f}%" for p in points))
    return curve


def _elapsed(stage_dir: Path) -> dict[int, float]:
    """step -> training seconds of a stage (SFT logs elapsed_s, RL per-step timing_s/step)."""
    elapsed, cum = {}, 0.0
    for rec in read_jsonl(stage_dir / "metrics.jsonl"):
        if "step" in rec and "elapsed_s" in rec:
            elapsed[rec["step"]] = rec["elapsed_s"]
        elif "step" in rec and "timing_s/step" in rec:
            cum += rec["timing_s/step"]
            elapsed[rec["step"]] = cum
    return elapsed


def _last_step(stage_dir: Path) -> int:
    """The last optimizer step a training stage logged (0: none)."""
    return max(_elapsed(stage_dir), default=0)


def _last_checkpoint(stage_dir: Path) -> Path | None:
    cks = sorted((stage_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return cks[-1] if cks else None


def _won_on(eval_dir: Path, games: list[str]) -> list[bool] | None:
    """Won / lost per game of `games` in an evaluation's episodes; None when one is missing."""
    won = {e["task_id"]: e["won"] for e in read_jsonl(eval_dir / "episodes.jsonl")}
    return [won[g] for g in games] if all(g in won for g in games) else None


def _fields(fields: dict) -> str:
    return " with " + ", ".join(f"{k}={v}" for k, v in fields.items()) if fields else ""


def _slug(name: str) -> str:
    return name.replace(" ", "_")
