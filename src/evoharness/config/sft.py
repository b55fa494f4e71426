"""Stage 1: supervised fine-tuning, and the SFT anchor of stage 2."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evoharness.config.base import Strict, Trackers
from evoharness.config.harness import DEFAULT_MAX_PROMPT_TOKENS
from evoharness.config.scale import LAYOUT_DESCRIPTION, LoRAConfig, ShardConfig


class SFTConfig(Strict):
    """Supervised fine-tuning settings (TOML section ``[sft]``)."""

    lr: float = 1e-3  # peak AdamW learning rate (reached after warmup_steps)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.01  # AdamW weight decay of the >= 2-dim parameters (norms and biases: none)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW (beta1, beta2)
    epochs: int = 3  # passes over the examples, when max_steps is unset
    max_steps: int | None = None  # optimizer steps, cycling through epochs; None: epochs x an epoch's steps
    batch_tokens: int = 8192  # padded tokens per optimizer step
    micro_batch_tokens: int | None = None  # split a step into micro-batches of this many padded tokens (None: one)
    # tree-pack each step's rows (micro_batch_tokens: row budget); a row duplicated within a step then trains once
    packing: bool = False
    warmup_steps: int = 10  # optimizer steps of linear lr warm-up, then the cosine decay
    # prompt budget, tokens (oldest history dropped to fit; harness.prompt); shared with rl and eval
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_completion_tokens: int = 256  # examples whose completion + eos is longer are dropped (never cut)
    # Weight of an auxiliary next-token loss on the prompt tokens (0: completion only). The
    # prompt is ~95% of a row's tokens; predicting it (admissible commands from the observation,
    # history lines from earlier turns) is the copying a from-scratch student needs to learn.
    prompt_loss_weight: float = 0.0
    grad_clip: float = 1.0  # the gradient's global norm is clipped to this each step; <= 0: no clipping
    seed: int = 0  # batch order, LoRA init and torch's RNG
    device: str = "cpu"  # torch device (cpu, cuda, cuda:1, ...)
    # Forward compute dtype; parameters and AdamW state stay fp32 (pure-bf16 weights would
    # round small updates away). auto: fp32 on CPU, bf16 autocast on CUDA.
    precision: Literal["auto", "fp32", "bf16_autocast"] = "auto"
    max_minutes: float | None = None  # wall-clock budget, minutes: stops after a checkpoint; None: steps only
    fit_schedule_to_budget: bool = False  # shrink the cosine horizon to the steps the budget allows
    calibration_steps: int = 10  # steps timed before fitting the horizon
    ckpt_every: int = 50  # a checkpoint every N steps; 0: only at the end / budget
    keep_checkpoints: int = 2  # step checkpoints kept in out_dir/checkpoints (older ones pruned; at least 1)
    eval_every: int = 0  # held-out loss every N steps; 0: only at the end (when eval examples are given)
    progress: bool = True  # show a progress bar
    # experiment trackers mirroring the metrics (tensorboard, wandb, mlflow; evoharness.tracking); []: JSONL only
    tracking: Trackers = []
    lora: LoRAConfig = Field(default_factory=LoRAConfig)  # adapters only (r > 0) or full fine-tuning
    shard: ShardConfig = Field(default_factory=ShardConfig)  # FSDP2 ranks (1: one unsharded trainer)
    layout: str | None = Field(None, description=LAYOUT_DESCRIPTION)


class SFTJobConfig(SFTConfig):
    """``evoharness sft`` settings: `SFTConfig` plus the job's inputs and outputs (the main job's
    ``[sft]`` section is an `SFTConfig`: the job supplies these itself)."""

    examples: str = ""  # SFT examples JSONL ({messages, completion} per line; `evoharness collect --sft` writes one)
    eval_examples: str | None = None  # held-out examples JSONL for eval_loss; None: none
    model_path: str = ""  # the HF model directory to fine-tune (weights, tokenizer)
    out_dir: str = "runs/sft"  # the run's directory (checkpoints/, metrics.jsonl, final/); a rerun resumes it
    threads: int | None = None  # torch CPU threads for the run (None: torch's default)


class SFTAnchorConfig(Strict):
    """``RLConfig.sft_anchor``: the SFT examples (JSONL, `train.sft.load_examples`) and the weight."""

    data_path: str = Field("", description="SFT examples JSONL (the main job sets its sft_examples.jsonl)")
    coef: float = Field(1.0, gt=0.0, description="weight of the mean completion NLL beside the GRPO loss")
    batch_tokens: int = Field(4096, gt=0, description="padded tokens per anchor batch")
    max_prompt_tokens: int = Field(DEFAULT_MAX_PROMPT_TOKENS, gt=0, description="as `SFTConfig`'s")
    max_completion_tokens: int = Field(256, gt=0, description="as `SFTConfig`'s")
