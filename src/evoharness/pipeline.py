"""The main job: teacher traces -> tokenizer + model -> SFT -> GRPO -> evaluation -> report.

Each stage writes its outputs under ``out_dir`` and a ``.done`` marker; a rerun
skips finished stages and resumes a stage that was interrupted (trace
collection, SFT and RL all resume from their own files). A rerun with other
settings than the budget and worker counts is refused (it would report the
finished stages of the old settings as the new ones). Stage wall-clock
budgets are fractions of ``budget_minutes``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, model_validator

from evoharness.config import Strict
from evoharness.eval.evaluate import EnvConfig, EvalConfig, evaluate
from evoharness.harness.factory import HarnessConfig
from evoharness.jsonl import read_jsonl
from evoharness.policies.factory import PolicyConfig
from evoharness.train.rl import RLConfig, train_rl
from evoharness.train.sft import SFTConfig


def _default_sft() -> SFTConfig:
    return SFTConfig(lr=2e-3, epochs=3, batch_tokens=16384, warmup_steps=10, max_prompt_tokens=1024, fit_schedule_to_budget=True,
                     max_completion_tokens=96, ckpt_every=50)


def _default_rl() -> RLConfig:
    """configs/rl_cpu.toml's settings (pick + look games, T=0.6, 2 updates per batch),
    at 2 games x 8 samples per step to fit the main job's short RL budget."""
    rl = RLConfig(steps=30, max_steps=30, max_new_tokens=48, max_prompt_tokens=1024, eval_every=0, decode_threads=1,
                  task_types=["pick_and_place_simple", "look_at_obj_in_light"])
    g = rl.grpo
    g.group_size, g.prompts_per_step, g.max_train_turns, g.mini_batches = 8, 2, 8, 2
    g.lr, g.temperature, g.micro_batch_size = 1e-4, 0.6, 16
    g.reward.t_max, g.reward.div_epochs = 30, 30
    return rl


# settings a rerun may change (how long and on how many workers), not what the stages compute
RESUME_FREE = ("out_dir", "budget_minutes", "threads", "eval_workers", "eval_batch", "sft.max_minutes",
               "sft.progress", "rl.max_minutes", "rl.threads", "rl.decode_threads")


class RunConfig(Strict):
    """The whole pipeline. Defaults: the embedded CPU default (bundled games,
    tiny from-scratch model) sized to finish in ``budget_minutes`` on 2 cores."""

    out_dir: str = "runs/main"
    seed: int = 0
    budget_minutes: float = 35.0  # SFT + RL budgets; the evaluations come on top (~10 min on 2 cores)
    env: EnvConfig = Field(default_factory=lambda: EnvConfig(engine="fast"))
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe", system_prompt="compact"))
    teacher: PolicyConfig = Field(default_factory=lambda: PolicyConfig(kind="teacher"))
    train_split: str = "train"
    train_games: int | None = None  # None: every train game available
    teacher_samples: int = 1
    max_steps: int = 50
    model_path: str | None = None  # an existing HF model directory; None: a new one from scratch
    model_preset: Literal["mini", "tiny", "small", "base"] = "mini"
    vocab_size: int = 2048
    sft: SFTConfig = Field(default_factory=_default_sft)
    rl: RLConfig = Field(default_factory=_default_rl)
    skip_rl: bool = False
    eval_split: str = "valid_seen"
    eval_limit: int | None = None
    eval_batch: int = 70
    eval_workers: int = 1
    constrained: bool = True
    sft_budget_share: float = 0.55
    rl_budget_share: float = 0.12
    # torch CPU threads for the whole job. 1 by default: with any other busy
    # process on 2 cores, OpenMP spin-waiting made 2 threads 2.5x slower than 1
    # for SFT and 30x slower for decoding (machine-notes.md); set 2 on a quiet box.
    threads: int | None = 1

    @model_validator(mode="after")
    def _one_prompt_recipe(self) -> "RunConfig":
        # SFT trains on the prompts RL and evaluation show: one harness config
        # (``harness``) and one prompt budget for every stage.
        if self.rl.max_prompt_tokens != self.sft.max_prompt_tokens:
            raise ValueError(f"rl.max_prompt_tokens ({self.rl.max_prompt_tokens}) must equal sft.max_prompt_tokens "
                             f"({self.sft.max_prompt_tokens}): the student must see the prompts it was trained on")
        if self.rl.harness != HarnessConfig(kind="bpe"):
            raise ValueError("set the harness for every stage with `harness.*`, not `rl.harness.*`")
        return self


def rl_config(cfg: RunConfig, out: Path) -> RLConfig:
    """The RL stage's config: ``cfg.rl`` with the run's harness (and the teacher's
    experience store), engine, data, wording, constraint and seed."""
    rl_cfg = cfg.rl.model_copy(deep=True)
    rl_cfg.model_path, rl_cfg.out_dir = str(out / "sft" / "final"), str(out / "rl")
    rl_cfg.engine, rl_cfg.data_path, rl_cfg.wording = cfg.env.engine, cfg.env.data_path, cfg.env.wording
    rl_cfg.harness = cfg.harness.model_copy(update={"experience_path": str(out / "experience.json")})
    rl_cfg.constrained, rl_cfg.seed = cfg.constrained, cfg.seed
    if rl_cfg.max_minutes is None:
        rl_cfg.max_minutes = cfg.budget_minutes * cfg.rl_budget_share
    return rl_cfg


def model_policy(cfg: RunConfig, path: Path) -> PolicyConfig:
    """A trained model as the evaluation policy, with the prompt budget SFT trained on."""
    return PolicyConfig(kind="hf", model_path=str(path), temperature=0.0, constrained=cfg.constrained,
                        max_tokens=cfg.rl.max_new_tokens, max_prompt_tokens=cfg.sft.max_prompt_tokens,
                        seed=cfg.seed, num_threads=cfg.rl.decode_threads)


def eval_config(cfg: RunConfig, out: Path, name: str, policy: PolicyConfig, store: Path) -> EvalConfig:
    """An evaluation stage's config: the run's harness with experience store `store`."""
    harness = cfg.harness.model_copy(update={"experience_path": str(store)})
    return EvalConfig(split=cfg.eval_split, limit=cfg.eval_limit, seed=cfg.seed, max_steps=cfg.max_steps,
                      workers=cfg.eval_workers, batch_size=cfg.eval_batch, out_dir=str(out / "eval" / name),
                      env=cfg.env, harness=harness, policy=policy)


class Stage:
    """Runs a pipeline stage once: skipped when its ``.done`` marker exists."""

    def __init__(self, out: Path, log: Callable[[str], None]) -> None:
        self.out, self.log = out, log

    def __call__(self, name: str, fn: Callable[[], object]) -> None:
        marker = self.out / f".{name}.done"
        if marker.exists():
            self.log(f"[{name}] done earlier, skipped")
            return
        self.log(f"[{name}] ...")
        t = time.perf_counter()
        fn()
        marker.write_text(f"{time.perf_counter() - t:.1f}")
        self.log(f"[{name}] finished in {time.perf_counter() - t:.0f} s")


def run_pipeline(cfg: RunConfig, log: Callable[[str], None] = print) -> Path:
    """Run (or resume) the main job; returns the report path."""
    from evoharness.envs.alfworld import make_env
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.eval.run_report import write_run_report
    from evoharness.harness.factory import make_harness
    from evoharness.policies.factory import make_policy
    from evoharness.rollout.collect import collect_traces, traces_to_sft

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
    model_dir, sft_dir, rl_dir = out / "model_init", out / "sft", out / "rl"
    # The experience store the teacher built on the train games: the student starts from it.
    experience = out / "experience.json"

    def collect() -> None:
        tasks = discover_games(cfg.train_split, cfg.env.data_path)
        if cfg.train_games:
            tasks = tasks[: cfg.train_games]
        stats = collect_traces(tasks, make_policy(cfg.teacher), lambda store: make_harness(cfg.harness, experience=store),
                               lambda task: make_env(task, engine=cfg.env.engine, wording=cfg.env.wording), traces,
                               samples=cfg.teacher_samples, max_steps=cfg.max_steps, batch_size=32,
                               experience_path=experience, seed=cfg.seed, wording=cfg.env.wording)
        examples = traces_to_sft(traces, out_path=sft_data)
        log(f"  teacher won {stats.won}/{stats.played} train episodes; {len(examples)} SFT examples")

    def build_model() -> None:
        from evoharness.models.init import count_params, init_model
        from evoharness.models.tokenizer import build_tokenizer

        examples = read_jsonl(sft_data)
        corpus = [m["content"] for ex in examples for m in ex["messages"]] + [ex["completion"] for ex in examples]
        tok = build_tokenizer(corpus, model_dir, vocab_size=cfg.vocab_size)
        model = init_model(cfg.model_preset, tok, out_dir=model_dir, seed=cfg.seed)
        log(f"  tokenizer: {len(tok)} tokens; model: Qwen3 '{cfg.model_preset}', {count_params(model) / 1e6:.2f}M params")

    def sft() -> None:
        from evoharness.train.sft import train_sft

        sft_cfg = cfg.sft.model_copy()
        if sft_cfg.max_minutes is None:
            sft_cfg.max_minutes = cfg.budget_minutes * cfg.sft_budget_share
        train_sft(sft_cfg, sft_data, cfg.model_path or model_dir, sft_dir)

    def rl() -> None:
        train_rl(rl_config(cfg, out))

    def evaluate_system(name: str, policy: PolicyConfig, store: Path = experience) -> Callable[[], None]:
        def run() -> None:
            s = evaluate(eval_config(cfg, out, name, policy, store))
            log(f"  {name}: {s['overall']['won']}/{s['overall']['n']} = {s['overall']['success']}%")
        return run

    stage("collect", collect)
    if cfg.model_path is None:
        stage("model", build_model)
    stage("sft", sft)
    if not cfg.skip_rl:
        stage("rl", rl)
    systems = {"random": PolicyConfig(kind="random", seed=cfg.seed), "scripted teacher": cfg.teacher}
    for name, pol in systems.items():
        stage(f"eval_{_slug(name)}", evaluate_system(_slug(name), pol))
    stage("eval_sft", evaluate_system("sft", model_policy(cfg, sft_dir / "final")))
    names = ["random", "scripted_teacher", "sft"]
    if not cfg.skip_rl and (rl_dir / "final").exists():
        stage("eval_sft_grpo", evaluate_system("sft_grpo", model_policy(cfg, rl_dir / "final"),
                                               rl_dir / "final" / "experience.json"))
        names.append("sft_grpo")
    labels = {"random": "random", "scripted_teacher": "scripted teacher (non-privileged)", "sft": "SFT (from scratch)",
              "sft_grpo": "SFT + GRPO"}
    summaries = {labels[n]: json.loads((out / "eval" / n / "summary.json").read_text()) for n in names}
    notes = [
        f"Model: Qwen3-architecture '{cfg.model_preset}' initialised from scratch, tokenizer trained locally "
        f"(vocab {cfg.vocab_size}); decoding {'constrained to admissible commands / meta-actions' if cfg.constrained else 'free'}, greedy.",
        f"Budget {cfg.budget_minutes:.0f} min (SFT {cfg.sft_budget_share:.0%}, RL {cfg.rl_budget_share:.0%}); "
        f"this run took {(time.perf_counter() - t0) / 60:.1f} min in this invocation.",
        f"Engine `{cfg.env.engine}`, step cap {cfg.max_steps}, eval split `{cfg.eval_split}`"
        + (f" (first {cfg.eval_limit} games)" if cfg.eval_limit else " (full panel)") + ".",
    ]
    return write_run_report(out, summaries, sft_dir / "metrics.jsonl", None if cfg.skip_rl else rl_dir / "metrics.jsonl", notes)


def _slug(name: str) -> str:
    return name.replace(" ", "_")

