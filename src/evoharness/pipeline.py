"""The main job: teacher traces -> tokenizer + model -> SFT (-> DAgger rounds) -> GRPO ->
evaluations + learning curve -> report.

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
Unseen rooms: the floor plans (scenes) of the ``unseen_split`` panel's games
(`heldout_scenes`, the bundled ``valid_unseen_scenes``) are left out of every
train-split list (training, teacher, DAgger, screening, RL, development set); the panel
is evaluated beside valid_seen and the development set, and the GRPO checkpoint is
chosen on the development and unseen-room games together.

Settings: configs/main_job.toml (`evoharness.config.run.RunConfig`); why they are what they
are: docs/main_job.md. `run_pipeline` lists the stages; each is a function below.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evoharness.config.eval import EvalConfig
from evoharness.config.policy import PolicyConfig
from evoharness.config.recipe import ModelRecipe, write_recipe
from evoharness.config.rl import Branch, RLConfig
from evoharness.config.run import RESUME_FREE, RunConfig
from evoharness.config.sft import SFTConfig
from evoharness.eval.evaluate import evaluate, evaluate_many
from evoharness.files import read_jsonl
from evoharness.recipes.alfworld import spread
from evoharness.recipes.rl import train_rl
from evoharness.rollout.episode import first_repeated_pair
from evoharness.rollout.records import Trajectory
from evoharness.train.rewards import spam_turns

__all__ = ["RESUME_FREE", "RunConfig", "run_pipeline"]  # RunConfig lives in evoharness.config.run


def heldout_scenes(cfg: RunConfig) -> set[int]:
    """The floor plans (`envs.alfworld.games.scene_of`) of every game of the unseen-room panel
    ``cfg.unseen_split`` (all of it, whatever ``eval_limit``); empty when it is unset."""
    from evoharness.envs.alfworld.games import discover_games, scene_of

    if not cfg.unseen_split:
        return set()
    return {scene_of(t.task_id) for t in discover_games(cfg.unseen_split, cfg.env.data_path)} - {None}


def unseen_room_games(cfg: RunConfig) -> list[str]:
    """Task ids of ``cfg.train_split`` games of a held-out floor plan (`heldout_scenes`): never
    trained, taught, screened, used for RL or developed on."""
    from evoharness.envs.alfworld.games import discover_games, scene_of

    held = heldout_scenes(cfg)
    return [t.task_id for t in discover_games(cfg.train_split, cfg.env.data_path) if scene_of(t.task_id) in held]


def dev_split(cfg: RunConfig) -> tuple[list, list]:
    """(training games, development games) of ``cfg.train_split`` less every game of a held-out
    floor plan (`unseen_room_games`): `dev_games` of them drawn with ``cfg.seed`` as the
    development set (stratified by task type, types interleaved), the rest (first
    `train_games`) to train on."""
    import random

    from evoharness.envs.alfworld.games import discover_games

    unseen = set(unseen_room_games(cfg))
    tasks = [t for t in discover_games(cfg.train_split, cfg.env.data_path) if t.task_id not in unseen]
    if cfg.dev_games >= len(tasks):
        raise ValueError(f"dev_games={cfg.dev_games} leaves no training game of {len(tasks)} in {cfg.train_split!r}")
    # stratified by task type, interleaved: any prefix (dev_eval_limit, curve_games) is balanced across types
    rng, by_id = random.Random(f"dev:{cfg.seed}"), {t.task_id: t for t in tasks}
    types = sorted({t.task_type for t in tasks})
    pools = {
        tt: rng.sample(sorted(t.task_id for t in tasks if t.task_type == tt), sum(t.task_type == tt for t in tasks))
        for tt in types
    }
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
    collect_traces(
        dev_split(cfg)[1][:n_games],
        make_policy(cfg.teacher),
        lambda s: make_harness(cfg.harness, experience=s),
        lambda t: make_env(t, engine=cfg.env.engine, wording=cfg.env.wording),
        traces,
        max_steps=cfg.max_steps,
        batch_size=32,
        experience=ExperienceStore.load(store),
        seed=cfg.seed,
        progress=False,
    )
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
    experience store), engine, data, wording, constraint, seed and held-out games (the development
    set and every game of a held-out floor plan; the screened games, ``rl_games.json``, are the RL
    stage's to add)."""
    rl_cfg = cfg.rl.model_copy(deep=True)
    rl_cfg.model_path, rl_cfg.out_dir = str(sft_dirs(cfg, out)[-1] / "final"), str(out / "rl")
    rl_cfg.engine, rl_cfg.data_path, rl_cfg.wording = cfg.env.engine, cfg.env.data_path, cfg.env.wording
    rl_cfg.harness = cfg.harness.model_copy(update={"experience_path": str(out / "experience.json")})
    rl_cfg.constrained, rl_cfg.seed, rl_cfg.device = cfg.constrained, cfg.seed, cfg.device
    rl_cfg.split = cfg.train_split
    rl_cfg.exclude_games = sorted({t.task_id for t in dev_split(cfg)[1]} | set(unseen_room_games(cfg)))
    if rl_cfg.sft_anchor is not None and not rl_cfg.sft_anchor.data_path:  # the teacher rows SFT trained on
        rl_cfg.sft_anchor = rl_cfg.sft_anchor.model_copy(
            update={
                "data_path": str(out / "sft_examples.jsonl"),
                "max_prompt_tokens": cfg.sft.max_prompt_tokens,
                "max_completion_tokens": cfg.sft.max_completion_tokens,
            }
        )
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
    evaluate(
        eval_config(
            cfg,
            out,
            "rl_screen",
            model_policy(cfg, sft_dirs(cfg, run)[-1] / "final"),
            run / "experience.json",
            [t.task_id for t in picked],
        )
    )
    return screened_games(read_jsonl(out / "eval" / "rl_screen" / "episodes.jsonl"), cfg.rl_branch_cycles)


def screened_games(episodes: list[dict], cycles: bool = False) -> dict:
    """RL's games from the SFT model's screening episodes (one per game, panel order): every
    game it lost, then as many it won, evenly spaced over the panel so every task type keeps
    some (`recipes.alfworld.spread`), so RL also rehearses what SFT already does right. When it lost
    none: every screened game. Each lost episode that repeated an action with nothing changed
    (`train.rewards.spam_turns`) also gives a branch (`config.rl.Branch`): its completions up to
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
    return {
        "games": lost + spread(won, len(lost)) if lost else won,
        "lost": lost,
        "screened": len(episodes),
        "branches": branches,
    }


def model_recipe(cfg: RunConfig) -> ModelRecipe:
    """The harness recipe of the job's models (`config.recipe`): what `model_policy` plays them with."""
    return ModelRecipe(
        harness=cfg.harness,
        max_prompt_tokens=cfg.sft.max_prompt_tokens,
        max_new_tokens=cfg.rl.max_new_tokens,
        constrained=cfg.constrained,
        wording=cfg.env.wording,
    )


def model_policy(cfg: RunConfig, path: Path, temperature: float = 0.0) -> PolicyConfig:
    """A trained model as the evaluation policy, with the prompt budget SFT trained on."""
    return PolicyConfig(
        kind="hf",
        model_path=str(path),
        temperature=temperature,
        constrained=cfg.constrained,
        max_tokens=cfg.rl.max_new_tokens,
        max_prompt_tokens=cfg.sft.max_prompt_tokens,
        seed=cfg.seed,
        num_threads=cfg.rl.decode_threads,
        device=cfg.device,
    )


def eval_config(
    cfg: RunConfig,
    out: Path,
    name: str,
    policy: PolicyConfig,
    store: Path,
    games: list[str] | None = None,
    split: str | None = None,
) -> EvalConfig:
    """An evaluation stage's config: the run's harness with experience store `store`;
    `games` (train-split task ids): the development set instead of ``eval_split``; `split` (and
    no `games`): that panel instead (the unseen-room panel), ``eval_limit`` games of it when set."""
    harness = cfg.harness.model_copy(update={"experience_path": str(store)})
    split = cfg.train_split if games is not None else split or cfg.eval_split
    if games is None and cfg.eval_limit:
        games = balanced_subset(split, cfg.env.data_path, cfg.eval_limit)
    return EvalConfig(
        split=split,
        games=games,
        seed=cfg.seed,
        max_steps=cfg.max_steps,
        workers=cfg.eval_workers,
        batch_size=cfg.eval_batch,
        out_dir=str(out / "eval" / name),
        env=cfg.env,
        harness=harness,
        policy=policy,
        stop_repeats=cfg.stop_repeats,
    )


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
    """Run (or resume) the main job; returns the report path. Every stage is skipped when its
    ``.done`` marker says it finished (`Stage`)."""
    job = start_job(cfg, log)
    stage = job.stage
    stage("collect", lambda: collect(job))
    if cfg.model_path is None:
        stage("model", lambda: build_model(job))
    stage("sft", lambda: sft(job, 0))
    for r in range(1, cfg.dagger_rounds + 1):
        stage(f"dagger{r}", lambda r=r: dagger(job, r))
        stage(f"sft_dagger{r}", lambda r=r: sft(job, r))
    for d in job.sfts:  # the recipe the SFT models were trained under travels with them
        write_recipe(d / "final", model_recipe(cfg), job.experience if job.experience.is_file() else None)
    if not cfg.skip_rl:
        if cfg.rl_screen_games:
            stage("rl_screen", lambda: rl_screen(job))
        stage("rl", lambda: rl(job))
    evaluate_system(job, "random", PolicyConfig(kind="random", seed=cfg.seed))
    evaluate_system(job, "scripted_teacher", cfg.teacher)
    if cfg.dagger_rounds and cfg.eval_teacher_only_sft:
        evaluate_system(job, "sft_teacher_only", model_policy(cfg, job.sfts[0] / "final"))
    evaluate_system(job, "sft", model_policy(cfg, job.sfts[-1] / "final"))
    curve, grpo_eval = choose_sft_grpo(job)
    return write_report(job, reported_systems(job, grpo_eval), curve, grpo_eval)


@dataclass
class Job:
    """One invocation of the main job: what every stage shares."""

    cfg: RunConfig
    out: Path
    log: Callable[[str], None]
    stage: Stage
    t0: float  # when this invocation's stages began (the report's wall time)
    train_tasks: list  # the games to train on (`dev_split`)
    dev_ids: list[str]  # the development games' task ids
    unseen_ids: list[str]  # the unseen-room panel's games the job plays (``unseen_split``; [] without one)

    @property
    def traces(self) -> Path:
        return self.out / "teacher_traces.jsonl"

    @property
    def sft_data(self) -> Path:
        return self.out / "sft_examples.jsonl"

    @property
    def model_dir(self) -> Path:
        return self.out / "model_init"

    @property
    def rl_dir(self) -> Path:
        return self.out / "rl"

    @property
    def experience(self) -> Path:
        """The experience store the teacher built on the train games: the student starts from it."""
        return self.out / "experience.json"

    @property
    def sfts(self) -> list[Path]:
        return sft_dirs(self.cfg, self.out)

    def make_game(self, task):
        from evoharness.envs.alfworld import make_env

        return make_env(task, engine=self.cfg.env.engine, wording=self.cfg.env.wording)


def start_job(cfg: RunConfig, log: Callable[[str], None]) -> Job:
    """Set the torch threads, create ``out_dir``, refuse a rerun with other settings (`RESUME_FREE`
    may change), write ``run_config.json``, the development games (``dev_games.json``) and the
    unseen-room games played (``unseen_games.json``, with their floor plans)."""
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob(".*.done")):  # a rerun resumes the same job only: finished stages are not redone
        from evoharness.train.checkpoint import check_resume_config

        check_resume_config(out / "run_config.json", json.loads(cfg.model_dump_json()), RESUME_FREE)
    (out / "run_config.json").write_text(cfg.model_dump_json(indent=2))
    stage, t0 = Stage(out, log), time.perf_counter()
    train_tasks, dev_tasks = dev_split(cfg)
    dev_ids = [t.task_id for t in dev_tasks]
    old = out / "dev_games.json"
    if any(out.glob(".*.done")) and old.is_file() and json.loads(old.read_text()) != dev_ids:
        # e.g. a job started before the unseen-room floor plans were held out: its stages trained on them
        raise ValueError(f"{out} holds stages of a job with another development set ({old}); use a new out_dir")
    old.write_text(json.dumps(dev_ids, indent=1))
    unseen_ids = unseen_panel(cfg)
    (out / "unseen_games.json").write_text(
        json.dumps({"split": cfg.unseen_split, "scenes": sorted(heldout_scenes(cfg)), "games": unseen_ids}, indent=1)
    )
    return Job(cfg, out, log, stage, t0, train_tasks, dev_ids, unseen_ids)


def unseen_panel(cfg: RunConfig) -> list[str]:
    """The task ids of the unseen-room panel the job plays: every game of ``unseen_split``, or
    ``eval_limit`` of them round-robin across task types; [] when it is unset."""
    if not cfg.unseen_split:
        return []
    if cfg.eval_limit:
        return balanced_subset(cfg.unseen_split, cfg.env.data_path, cfg.eval_limit)
    from evoharness.envs.alfworld.games import discover_games

    return [t.task_id for t in discover_games(cfg.unseen_split, cfg.env.data_path)]


def collect(job: Job) -> None:
    """Stage ``collect``: the teacher plays the training games (building the experience store);
    its turns become the SFT examples."""
    from evoharness.harness.factory import make_harness
    from evoharness.policies.factory import make_policy
    from evoharness.rollout.collect import collect_traces, traces_to_sft, write_jsonl_atomic

    cfg = job.cfg
    stats = collect_traces(
        job.train_tasks,
        make_policy(cfg.teacher),
        lambda store: make_harness(cfg.harness, experience=store),
        job.make_game,
        job.traces,
        samples=cfg.teacher_samples,
        max_steps=cfg.max_steps,
        batch_size=32,
        experience_path=job.experience,
        seed=cfg.seed,
        wording=cfg.env.wording,
    )
    examples = traces_to_sft(job.traces)
    write_jsonl_atomic(job.sft_data, examples)
    job.log(f"  teacher won {stats.won}/{stats.played} train episodes; {len(examples)} SFT examples")


def build_model(job: Job) -> None:
    """Stage ``model``: a tokenizer trained on the SFT examples and a new model of the preset."""
    from evoharness.models.init import PRESETS, count_params, init_model
    from evoharness.models.tokenizer import build_tokenizer

    cfg = job.cfg
    examples = read_jsonl(job.sft_data)
    corpus = [m["content"] for ex in examples for m in ex["messages"]] + [ex["completion"] for ex in examples]
    tok = build_tokenizer(corpus, job.model_dir, vocab_size=cfg.vocab_size)
    arch = {**PRESETS[cfg.model_preset], **cfg.model_overrides}
    model = init_model(arch, tok, out_dir=job.model_dir, seed=cfg.seed)
    job.log(
        f"  tokenizer: {len(tok)} tokens; model: Qwen3 '{cfg.model_preset}', {count_params(model) / 1e6:.2f}M params"
    )


def sft(job: Job, r: int) -> None:
    """Stage ``sft`` (r = 0: the teacher's examples, from the new or given model) or
    ``sft_dagger<r>`` (the previous SFT model on them + DAgger rounds 1..r, at ``dagger_lr``)."""
    from evoharness.train.sft import train_sft

    cfg, sfts = job.cfg, job.sfts
    data = read_jsonl(job.sft_data) + [ex for k in range(1, r + 1) for ex in read_jsonl(job.out / f"dagger{k}.jsonl")]
    start = (cfg.model_path or job.model_dir) if r == 0 else sfts[r - 1] / "final"
    train_sft(sft_config(cfg, r), data, start, sfts[r])


def sft_config(cfg: RunConfig, r: int) -> SFTConfig:
    """SFT stage `r`'s config (`sft`): ``cfg.sft`` on the job's device, a DAgger round's (r > 0) at
    ``dagger_sft_steps`` / ``dagger_lr``, capped at its share of ``budget_minutes`` when that is set."""
    sft_cfg = cfg.sft.model_copy(update={"device": cfg.device})
    if r > 0:
        sft_cfg.max_steps = cfg.dagger_sft_steps
        sft_cfg.lr = cfg.dagger_lr
    if sft_cfg.max_minutes is None:  # the SFT share of budget_minutes, split over the SFT stages
        sft_cfg.max_minutes = (
            None if cfg.budget_minutes is None else cfg.budget_minutes * cfg.sft_budget_share / (1 + cfg.dagger_rounds)
        )
    return sft_cfg


def dagger(job: Job, r: int) -> None:
    """Stage ``dagger<r>``: the last SFT model plays ``dagger_games`` training games, the teacher
    labels its states (``dagger<r>.jsonl``)."""
    import random

    from evoharness.harness.factory import load_experience, make_harness
    from evoharness.policies.factory import make_policy
    from evoharness.train.dagger import dagger_round

    cfg = job.cfg
    tasks = random.Random(f"dagger:{cfg.seed}:{r}").sample(job.train_tasks, min(cfg.dagger_games, len(job.train_tasks)))
    store = load_experience(str(job.experience))
    student = make_policy(model_policy(cfg, job.sfts[r - 1] / "final"))
    try:
        st = dagger_round(
            tasks,
            student,
            lambda: make_harness(cfg.harness, experience=store),
            job.make_game,
            job.out / f"dagger{r}.jsonl",
            beta=cfg.dagger_beta,
            seed=cfg.seed + r,
            max_steps=cfg.max_steps,
            batch_size=cfg.eval_batch,
            stop_repeats=cfg.stop_repeats,
            episode_prefix=f"dagger{r}",
        )
    finally:
        student.close()
    job.log(
        f"  student won {st.won}/{st.played} train games; {st.examples} labelled states "
        f"(agreement with the teacher {st.agreement:.0%})"
    )


def rl_screen(job: Job) -> None:
    """Stage ``rl_screen``: RL's games and branches (``rl_games.json``, `screen_rl_games`)."""
    from evoharness.files import atomic_write_text

    games = screen_rl_games(job.cfg, job.out, job.cfg.rl_screen_games)
    atomic_write_text(job.out / "rl_games.json", json.dumps(games, indent=1))
    job.log(
        f"  RL games: the {len(games['lost'])} of {games['screened']} screened training games the SFT model "
        f"lost + {len(games['games']) - len(games['lost'])} it won"
    )


def rl(job: Job) -> None:
    """Stage ``rl``: GRPO from the last SFT model (`rl_config`), on the screened games."""
    cfg = job.cfg
    rl_cfg = rl_config(cfg, job.out)
    if cfg.rl_screen_games:  # the rl_screen stage's choice
        screened = json.loads((job.out / "rl_games.json").read_text())
        rl_cfg.games = screened["games"]
        if cfg.rl_branches:
            rl_cfg.branches = [Branch(**b) for b in screened["branches"]]
    train_rl(rl_cfg)


def evaluate_system(job: Job, name: str, policy: PolicyConfig, store: Path | None = None) -> None:
    """Stage ``eval_<name>``: the system (with experience store `store`, default the teacher's) on
    every panel in one pool of lock-step batches (`evaluate_many`), into ``eval/<name>``
    (``eval_split``), ``eval/dev_<name>`` and, with ``unseen_split``, ``eval/unseen_<name>``."""
    cfg, out = job.cfg, job.out
    store = job.experience if store is None else store
    dev_games = job.dev_ids[: cfg.dev_eval_limit]
    panels = [(cfg.eval_split, eval_config(cfg, out, name, policy, store))]
    panels.append(("dev", eval_config(cfg, out, f"dev_{name}", policy, store, dev_games)))
    if cfg.unseen_split:
        panels.append(("unseen rooms", eval_config(cfg, out, f"unseen_{name}", policy, store, split=cfg.unseen_split)))

    def run() -> None:
        for s, (panel, _) in zip(evaluate_many([c for _, c in panels]), panels):
            job.log(
                f"  {name} {panel}: {s['overall']['won']}/{s['overall']['n']} = {s['overall']['success']}%"
                f" ({s['overall'].get('stopped_early', 0)} stopped early)"
            )

    job.stage(f"eval_{name}", run, tuple(Path(c.out_dir) / "summary.json" for _, c in panels))


def choose_sft_grpo(job: Job) -> tuple[dict | None, str]:
    """The learning curve (None with ``curve_games`` 0) and the evaluation directory of the system
    reported as SFT + GRPO: with `select_rl_checkpoint`, the checkpoint `chosen_rl` picks on the
    development games and the unseen-room panel together (`selection_key`; evaluated here when it
    is an earlier RL step); else RL's final model."""
    cfg, out, rl_dir = job.cfg, job.out, job.rl_dir
    # The checkpoints the final models are (the SFT stage's last, RL's last) get their curve points
    # from these full development-set evaluations instead of playing the curve games again.
    reuse, unseen = {}, {}
    last_sft = _last_checkpoint(job.sfts[-1])
    if last_sft is not None and _last_step(job.sfts[-1]) == int(last_sft.name.split("_")[1]):
        reuse[last_sft] = out / "eval" / "dev_sft"  # final/ is this checkpoint's weights (in the model's dtype)
        unseen[last_sft] = out / "eval" / "unseen_sft"
    select = bool(cfg.curve_games and cfg.select_rl_checkpoint and not cfg.skip_rl)
    last_rl = _last_checkpoint(rl_dir) if select else None
    if last_rl is not None:  # the usual choice: evaluated before the choice, every panel at once
        evaluate_system(job, "rl_last", model_policy(cfg, last_rl), last_rl / "experience.json")
        reuse[last_rl] = out / "eval" / "dev_rl_last"
        unseen[last_rl] = out / "eval" / "unseen_rl_last"
    unseen = {ck: d for ck, d in unseen.items() if cfg.unseen_split and (d / "episodes.jsonl").is_file()}
    curve = (
        learning_curve(cfg, out, job.stage, job.dev_ids[: cfg.curve_games], job.log, reuse, unseen)
        if cfg.curve_games
        else None
    )
    grpo_eval = "sft_grpo"  # the eval directory of the system reported as SFT + GRPO
    if select and curve:
        best, grpo_eval = chosen_rl(curve["points"], last_rl)
        curve["rl_selected"] = best
        # the games that chose it: a paired comparison on them is not a test (eval.run_report)
        curve["chosen_on"] = {
            "mix_success": job.dev_ids + job.unseen_ids,
            "dev_success": job.dev_ids,
            "success": curve["game_ids"],
        }[selection_key(curve["points"])]
        (out / "curve.json").write_text(json.dumps(curve, indent=1))
        if grpo_eval.startswith("rl_step"):
            best_dir = Path(best["path"])
            evaluate_system(job, grpo_eval, model_policy(cfg, best_dir), best_dir / "experience.json")
    elif not cfg.skip_rl and (rl_dir / "final").exists():
        evaluate_system(job, "sft_grpo", model_policy(cfg, rl_dir / "final"), rl_dir / "final" / "experience.json")
    return curve, grpo_eval


def reported_systems(job: Job, grpo_eval: str) -> dict[str, str]:
    """The report's systems -> their evaluation directories (``eval/<dir>`` valid_seen,
    ``eval/dev_<dir>`` development set), in display order (each model row is compared with
    the one above); written to ``systems.json``."""
    cfg = job.cfg
    evals = {"random": "random", "scripted_teacher": "scripted_teacher"}
    if cfg.dagger_rounds and cfg.eval_teacher_only_sft:
        evals["sft_teacher_only"] = "sft_teacher_only"
    evals["sft"] = "sft"
    if not cfg.skip_rl and (job.out / "eval" / grpo_eval / "summary.json").exists():
        evals["sft_grpo"] = grpo_eval
    (job.out / "systems.json").write_text(json.dumps(evals, indent=1))
    return evals


def write_report(job: Job, evals: dict[str, str], curve: dict | None, grpo_eval: str) -> Path:
    """``report.md`` (`eval.run_report.write_run_report`): the systems' tables, the training
    curves and the notes on how the job ran; returns its path."""
    from evoharness.eval.run_report import write_run_report

    cfg, out, stage = job.cfg, job.out, job.stage
    sft_label = "SFT" + (" + DAgger" if cfg.dagger_rounds else "")
    labels = {
        "random": "random",
        "scripted_teacher": "scripted teacher (non-privileged)",
        "sft_teacher_only": "SFT on teacher traces only",
        "sft": sft_label,
        "sft_grpo": sft_label + " + GRPO",
    }
    summaries = {labels[n]: out / "eval" / e for n, e in evals.items()}
    dev = {labels[n]: out / "eval" / f"dev_{e}" for n, e in evals.items()}
    unseen = {labels[n]: out / "eval" / f"unseen_{e}" for n, e in evals.items()} if cfg.unseen_split else None
    rl_note = ""
    if curve and "rl_selected" in curve:
        sel = curve["rl_selected"]
        key = selection_key(curve["points"])
        chose = {
            "mix_success": f"{len(curve['chosen_on'])} development games (all {sel.get('dev_games')} seen-room "
            f"and {sel.get('unseen_games')} unseen-room games together)",
            "dev_success": f"{len(curve['chosen_on'])} development games (all games)",
            "success": f"{len(curve['chosen_on'])} development games (the curve games)",
        }[key]
        rl_note = (
            f"SFT + GRPO is the checkpoint best on {chose}: "
            + (
                "the SFT model itself (every RL checkpoint did worse; its rows repeat the SFT evaluation)"
                if sel["stage"] != "rl"
                else f"RL step {sel['step']}"
            )
            + f" ({sel[key]:.1f}%)."
        )
        rl_note += unchosen_last_rl(out, grpo_eval)
    notes = [
        f"Model: Qwen3-architecture '{cfg.model_preset}'{_fields(cfg.model_overrides)} initialised from scratch, "
        f"tokenizer trained locally (vocab {cfg.vocab_size}); decoding "
        f"{'constrained to admissible commands / meta-actions' if cfg.constrained else 'free'}, greedy.",
        f"SFT: {cfg.sft.batch_tokens}-token batches, lr {cfg.sft.lr:g} (cosine), loss on the completion"
        + (
            f" + {cfg.sft.prompt_loss_weight:g} x the prompt-token loss"
            if cfg.sft.prompt_loss_weight
            else " tokens only"
        )
        + f"; GRPO on {', '.join(cfg.rl.task_types) if cfg.rl.task_types else 'every task type'}; "
        f"torch threads {cfg.threads}.",
        f"Budget in optimizer steps: SFT {cfg.sft.max_steps}, DAgger {cfg.dagger_rounds} round(s) x "
        f"{cfg.dagger_games} games + {cfg.dagger_sft_steps} SFT steps"
        f"{f' at lr {cfg.dagger_lr:g}' if cfg.dagger_rounds else ''}, "
        f"GRPO {0 if cfg.skip_rl else cfg.rl.steps}"
        + (f" x {cfg.rl.soup_seeds} RL seeds (the policy their weight average)" if cfg.rl.soup_seeds > 1 else "")
        + (f"; wall cap {cfg.budget_minutes:.0f} min" if cfg.budget_minutes else "; no wall cap")
        + f". The stages took {sum(stage.times().values()) / 60:.1f} min in all (table below); this invocation "
        f"{(time.perf_counter() - job.t0) / 60:.1f} min (a rerun resumes: finished stages are not redone).",
        f"Development set: {len(job.dev_ids)} train games held out (seed {cfg.seed}; `dev_games.json`), never "
        "trained on.",
    ]
    if cfg.unseen_split:
        scenes = sorted(heldout_scenes(cfg))
        notes.append(
            f"Unseen rooms: {len(job.unseen_ids)} games of split `{cfg.unseen_split}` (`unseen_games.json`), ALFWorld "
            f"train games of {len(scenes)} floor plans ({', '.join(map(str, scenes))}) of which no game is "
            f"trained, taught, screened, used for RL or in the development set ({len(unseen_room_games(cfg))} "
            f"`{cfg.train_split}` games of those floor plans left out)."
        )
    notes += [
        f"Engine `{cfg.env.engine}`, step cap {cfg.max_steps}, eval split `{cfg.eval_split}`"
        + (f" ({cfg.eval_limit} games, round-robin across types)" if cfg.eval_limit else " (full panel)")
        + f"; an episode whose (prompt, completion) repeats {cfg.stop_repeats} times is stopped early and "
        "counts as a failure.",
    ] + ([rl_note] if rl_note else [])
    return write_run_report(
        out,
        summaries,
        dev,
        [d / "metrics.jsonl" for d in job.sfts],
        None if cfg.skip_rl else job.rl_dir / "metrics.jsonl",
        notes,
        stage.times(),
        curve,
        unseen=unseen,
    )


def unchosen_last_rl(out: Path, grpo_eval: str) -> str:
    """What the GRPO stage's last checkpoint did when the development games chose another model as
    SFT + GRPO (`chosen_rl`): its valid_seen, dev and unseen-room wins, paired per game against SFT
    (`eval.run_report.paired`; dev and unseen rooms are the sets that chose against it), as a
    sentence starting with a space; "" when it is the reported model or was not evaluated
    (``eval/rl_last``)."""
    from evoharness.eval.run_report import paired

    if grpo_eval == "rl_last" or not (out / "eval" / "rl_last" / "episodes.jsonl").is_file():
        return ""
    parts = []
    for panel, prefix in (("valid_seen", ""), ("dev", "dev_"), ("unseen-room", "unseen_")):
        if not (out / "eval" / f"{prefix}rl_last" / "episodes.jsonl").is_file():
            continue  # no unseen-room panel
        sft = read_jsonl(out / "eval" / f"{prefix}sft" / "episodes.jsonl")
        last = read_jsonl(out / "eval" / f"{prefix}rl_last" / "episodes.jsonl")
        c = paired(sft, last)
        parts.append(
            f"{sum(e['won'] for e in last)}/{len(last)} {panel} (+{c['b_only']} / -{c['a_only']} "
            f"against SFT, p = {c['p']:.3g})"
        )
    return " The GRPO stage's last checkpoint, not chosen, won " + " and ".join(parts) + "."


def selection_key(points: list[dict]) -> str:
    """What `chosen_rl` ranks on: ``mix_success`` (the whole development set and the unseen-room
    panel together: seen-room and unseen-room development games) when every candidate (``stage``
    "rl" or "sft_final") played both, as the SFT model and the last RL checkpoint do by default;
    else ``dev_success`` (the whole development set) when every candidate played it; else
    ``success`` (the curve's games, which every checkpoint plays)."""
    cands = [p for p in points if p["stage"] in ("rl", "sft_final")]
    for key in ("mix_success", "dev_success"):
        if cands and all(key in p for p in cands):
            return key
    return "success"


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
    best = max(
        (p for p in points if p["stage"] in ("rl", "sft_final")),
        key=lambda p: (p[key], p["stage"] == "rl", -p["minutes"]),
    )
    if best["stage"] == "sft_final":
        return best, "sft"
    if last_rl is not None and Path(best["path"]) == last_rl:
        return best, "rl_last"
    return best, f"rl_step{best['step']}"


def learning_curve(
    cfg: RunConfig,
    out: Path,
    stage: Stage,
    games: list[str],
    log: Callable[[str], None],
    reuse: dict[Path, Path] | None = None,
    unseen: dict[Path, Path] | None = None,
) -> dict:
    """Dev success of every saved checkpoint against cumulative training minutes.

    Each SFT/DAgger checkpoint (``checkpoints/step_N``) and each RL checkpoint plays
    `games` (development games, greedy, early stopping); minutes are the stages'
    training wall time up to that step (DAgger rollouts included). A checkpoint in `reuse`
    (checkpoint -> an evaluation directory of its weights on a development set holding every
    one of `games`) takes its point from that evaluation's episodes on `games` instead, and its
    success on that whole set as ``dev_success`` (%, ``dev_games`` games). One also in `unseen`
    (checkpoint -> its evaluation on the unseen-room panel) adds ``unseen_success`` /
    ``unseen_games`` and, over both sets' games together, ``mix_success`` / ``mix_games``.
    Written to ``curve.json``: ``{"games", "game_ids", "points": [{"stage", "step", "minutes",
    "success", "path"[, "dev_success", "dev_games"[, "unseen_success", ..., "mix_games"]]}]}``.
    """
    points, offset, reuse, unseen = [], 0.0, reuse or {}, unseen or {}
    small = cfg.model_copy(update={"eval_workers": 1})  # a few games: worker start-up would cost more than play
    stages = [(d.name, d) for d in sft_dirs(cfg, out)]
    if not cfg.skip_rl:
        stages.append(("rl", out / "rl"))
    for name, d in stages:
        if name.startswith("sft_dagger"):
            offset += float((out / f".dagger{name[len('sft_dagger') :]}.done").read_text() or 0) / 60
        elapsed = _elapsed(d)
        for ck in sorted((d / "checkpoints").glob("step_*")):
            step = int(ck.name.split("_")[1])
            won = _won_on(reuse[ck], games) if ck in reuse else None
            if won is None:
                store = ck / "experience.json" if name == "rl" else out / "experience.json"
                ename = f"curve/{name}_{step:05d}"
                stage(
                    f"curve_{name}_{step}",
                    lambda ck=ck, store=store, ename=ename: evaluate(
                        eval_config(small, out, ename, model_policy(cfg, ck), store, games), progress=False
                    ),
                )
                won = _won_on(out / "eval" / ename, games)
            points.append(
                {
                    "stage": name,
                    "step": step,
                    "minutes": round(offset + elapsed.get(step, 0) / 60, 2),
                    "success": round(100 * sum(won) / max(1, len(won)), 1),
                    "path": str(ck),
                }
            )
            if ck in reuse:
                full = [e["won"] for e in read_jsonl(reuse[ck] / "episodes.jsonl")]
                points[-1].update(dev_success=round(100 * sum(full) / len(full), 1), dev_games=len(full))
                if ck in unseen:
                    rooms = [e["won"] for e in read_jsonl(unseen[ck] / "episodes.jsonl")]
                    mix = full + rooms
                    points[-1].update(
                        unseen_success=round(100 * sum(rooms) / max(1, len(rooms)), 1),
                        unseen_games=len(rooms),
                        mix_success=round(100 * sum(mix) / len(mix), 1),
                        mix_games=len(mix),
                    )
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
