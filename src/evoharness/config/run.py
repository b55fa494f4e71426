"""The main job's config (`RunConfig`, ``evoharness run``; the stages are `evoharness.pipeline`).

The job's settings are configs/main_job.toml, which ``evoharness run`` loads (`load_run_config`);
the defaults here are the same values, for library use (tests/train/test_pipeline_config.py keeps
the two equal). Why each setting is what it is, with the runs that measured it: docs/main_job.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from evoharness.config.base import ConfigError, Strict, load_config
from evoharness.config.env import TASK_TYPES, EnvConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.policy import PolicyConfig
from evoharness.config.rl import GRPOConfig, RewardConfig, RLConfig
from evoharness.config.sft import SFTAnchorConfig, SFTConfig

# configs/main_job.toml of this checkout (src/evoharness/config/run.py -> the repository root)
MAIN_JOB_TOML = Path(__file__).resolve().parents[3] / "configs" / "main_job.toml"
# `evoharness run --preset NAME`: configs/NAME.toml beside the main job's
RUN_PRESETS = ("main_job", "smoke")


def preset_path(name: str) -> Path:
    """The shipped RunConfig TOML of preset `name` (`RUN_PRESETS`).

    Raises:
        ConfigError: an unknown name (with the known ones), or its file missing from this checkout.
    """
    if name not in RUN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(RUN_PRESETS)}")
    path = MAIN_JOB_TOML.with_name(f"{name}.toml")
    if not path.is_file():
        raise ConfigError(f"preset {name!r}: {path} is missing (presets ship with the repository checkout)")
    return path


def _default_sft() -> SFTConfig:
    return SFTConfig(
        lr=2e-3,
        max_steps=3000,
        batch_tokens=4096,
        warmup_steps=20,
        max_prompt_tokens=1024,
        max_completion_tokens=96,
        prompt_loss_weight=2.0,
        ckpt_every=1000,
        keep_checkpoints=100,
    )


def _default_rl() -> RLConfig:
    grpo = GRPOConfig(
        group_size=8,
        prompts_per_step=4,
        max_train_turns=8,
        mini_batches=2,
        lr=1e-4,
        temperature=1.5,
        micro_batch_size=16,
        reward=RewardConfig(t_max=30, div_epochs=30),
    )
    return RLConfig(
        steps=8,
        max_steps=30,
        max_new_tokens=48,
        max_prompt_tokens=1024,
        eval_every=0,
        decode_threads=1,
        task_types=list(TASK_TYPES),
        ckpt_every=8,
        keep_checkpoints=100,
        consolidate_experience=False,
        branch_turns=4,
        sft_anchor=SFTAnchorConfig(coef=1.0),
        soup_seeds=2,
        grpo=grpo,
    )


class RunConfig(Strict):
    """The whole main job (TOML: configs/main_job.toml; a key's meaning: its comment there)."""

    # settings a rerun may change (how long and on how many workers), not what the stages compute
    RESUME_FREE: ClassVar[tuple[str, ...]] = (
        "out_dir",
        "budget_minutes",
        "threads",
        "eval_workers",
        "eval_batch",
        "sft.max_minutes",
        "sft.progress",
        "rl.max_minutes",
        "rl.threads",
        "rl.decode_threads",
        "curve_games",
    )

    out_dir: str = "runs/main"  # the job's directory (every stage's outputs, report.md); a rerun resumes the job there
    seed: int = 0  # dev-set draw, collection, model init, RL (rl.seed) and evaluations; SFT uses sft.seed
    budget_minutes: float | None = None  # wall-clock cap (minutes) on SFT, DAgger, RL; None: the step budgets only
    dev_games: int = 60  # train games held out as the development set (seeded; never trained on)
    dagger_rounds: int = 0  # student rollouts labelled by the teacher, then more SFT (train/dagger.py)
    dagger_games: int = 100  # train games the student plays per round
    dagger_beta: float = 0.0  # probability the teacher's action is executed instead of the student's
    dagger_sft_steps: int = 300  # SFT steps per round on teacher + all DAgger examples so far
    dagger_lr: float = Field(2e-4, gt=0)  # peak lr of a round's SFT
    stop_repeats: int = 3  # evaluation/DAgger: end an episode whose (prompt, completion) repeats K times
    curve_games: int = 20  # dev games each saved checkpoint plays for the learning curve (0: no curve)
    # training games the SFT model screens before RL; RL trains on the lost ones + as many won (0: every game)
    rl_screen_games: int = Field(160, ge=0)
    rl_branches: bool = True  # every other GRPO group starts where a lost screened game began to loop
    rl_branch_cycles: bool = False  # branches also from lost screened episodes that cycle through states
    select_rl_checkpoint: bool = True  # SFT+GRPO = the RL checkpoint best on the dev games (SFT if strictly better)
    # game data, engine and wording of every stage (the job sets rl's from it)
    env: EnvConfig = Field(default_factory=lambda: EnvConfig(engine="fast"))
    # the one prompt harness of every stage: collect, SFT, DAgger, RL, evaluation (leave rl.harness unset)
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe", system_prompt="compact"))
    # the policy whose traces SFT trains on; it also labels DAgger states and is evaluated
    teacher: PolicyConfig = Field(default_factory=lambda: PolicyConfig(kind="teacher"))
    train_split: str = "train"  # ALFWorld split of the training and development games (collection, DAgger, RL)
    train_games: int | None = None  # first N non-development train games trained on; None: every one available
    teacher_samples: int = 1  # teacher episodes collected per training game (episode ids <task_id>#k)
    max_steps: int = 50  # step cap of collection, DAgger and evaluation episodes (RL's: rl.max_steps)
    model_path: str | None = None  # an existing HF model directory; None: a new one from scratch
    # the new model's size (models/init.py PRESETS: mini ~1.1M, tiny ~1.8M, small ~10M, base ~32M params)
    model_preset: Literal["mini", "tiny", "small", "base"] = "mini"
    # Qwen3Config fields over the preset's, e.g. --set model_overrides.head_dim=64 (misspelt fields are refused)
    model_overrides: dict[str, int | float | bool] = Field(default_factory=dict)
    # upper bound on the new tokenizer's ids (trained on the teacher's examples); unused with model_path
    vocab_size: int = 2048
    # stage 1 (and each DAgger round's SFT, at dagger_sft_steps / dagger_lr)
    sft: SFTConfig = Field(default_factory=_default_sft)
    # stage 2; the job sets its model_path, out_dir, split, engine, data_path, wording, harness, constrained, seed
    rl: RLConfig = Field(default_factory=_default_rl)
    skip_rl: bool = False  # stop after SFT (and DAgger): no RL screen, no GRPO, no SFT+GRPO evaluation
    eval_teacher_only_sft: bool = False  # also evaluate the SFT model before DAgger (the DAgger comparison)
    eval_split: str = "valid_seen"  # ALFWorld split of the final evaluations (the development set is evaluated too)
    # the unseen-room panel, evaluated beside eval_split and the dev set; no train_split game of its floor plans
    # (scenes) is trained, taught, screened, used for RL or in the dev set ("": no panel, no scene held out)
    unseen_split: str = "valid_unseen_scenes"
    eval_limit: int | None = None  # N games of eval_split and of unseen_split, round-robin across task types; None: all
    dev_eval_limit: int | None = None  # first N development games for the dev evaluations (None: all)
    eval_batch: int = 100  # episodes per lock-step batch (valid_seen + dev + unseen rooms: 4 of 80 on 2 workers)
    eval_workers: int = 2  # evaluation processes (1 thread each): both cores of a quiet machine
    constrained: bool = True  # decode only admissible commands / meta-actions (the student in RL, DAgger, evaluations)
    sft_budget_share: float = 0.55  # of budget_minutes, when set (DAgger rounds included)
    rl_budget_share: float = 0.12  # of budget_minutes, as rl.max_minutes when set (and rl.max_minutes is unset)
    threads: int | None = 2  # torch CPU threads for the whole job (set 1 on a shared box)
    # torch device of every stage's model: SFT, DAgger, RL (trainer, rollouts, reference) and the student's
    # evaluations (cpu, cuda, cuda:1, ...); the job sets sft.device, rl.device and the evaluated policies' from it
    device: str = "cpu"

    @model_validator(mode="after")
    def _one_prompt_recipe(self) -> RunConfig:
        # SFT trains on the prompts RL and evaluation show: one harness config
        # (``harness``) and one prompt budget for every stage.
        if self.rl.max_prompt_tokens != self.sft.max_prompt_tokens:
            raise ValueError(
                f"rl.max_prompt_tokens ({self.rl.max_prompt_tokens}) must equal sft.max_prompt_tokens "
                f"({self.sft.max_prompt_tokens}): the student must see the prompts it was trained on"
            )
        if self.rl.harness != HarnessConfig(kind="bpe"):
            raise ValueError("set the harness for every stage with `harness.*`, not `rl.harness.*`")
        if self.sft.device != "cpu" or self.rl.device != "cpu":
            raise ValueError("set the device of every stage with `device`, not `sft.device` / `rl.device`")
        return self


RESUME_FREE = RunConfig.RESUME_FREE


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """The main job's config: the TOML file `path` (None: configs/main_job.toml, `MAIN_JOB_TOML`)
    with `overrides` (``key.sub=value``); sections a file gives in part keep the main job's
    values for the keys it does not name.

    Raises:
        ConfigError: the file is missing or invalid, or an override is.
    """
    if path is None:
        path = MAIN_JOB_TOML
        if not path.is_file():
            raise ConfigError(
                f"the main job's config {path} is missing (it ships with the repository checkout); "
                "pass one with --config FILE"
            )
    return load_config(RunConfig, path, overrides)
