"""Stage 2 loss: PPO-clip GRPO over independent (prompt, completion) turns.

Each turn of a trajectory is one training sample (`TurnSample`): its prompt is
context only, its completion tokens are trained with the turn's advantage
(`advantages.turn_advantages`). Per completion token k (shapes: ``_B`` turns in
a micro-batch, ``_C`` completion positions, ``_V`` vocabulary):

    ρ_k   = exp(log π_θ(y_k) − log π_behaviour(y_k))          (recorded TITO log-probs)
    pg_k  = −min(ρ_k A, clip(ρ_k, 1 − ε_low, 1 + ε_high) A)     (PPO, Schulman et al. 2017;
                                                                 ε_high > ε_low = DAPO clip-higher)
    kl_k  = exp(d_k) − d_k − 1,  d_k = log π_ref(y_k) − log π_θ(y_k)
                                                               (k3 estimator, Schulman 2020;
                                                                GRPO, DeepSeekMath Eq. 4)
    H_k   = entropy of π_θ(· | context) at that position
    ℓ_k   = pg_k + β · kl_k − c_H · H_k

Stale samples (async schedules, up to η versions old): ``off_policy = "decoupled"``
is decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy
optimization"; AReaL, arXiv 2505.24298 Eq. 5): the clip acts on the ratio to
the proximal policy π_prox (the weights the update starts from, here the ones
the gradient is taken at, so one update per batch: ``mini_batches = 1``) and
the behaviour policy enters only as a truncated importance weight
(truncated IS, Espeholt et al. 2018; cap ``behaviour_weight_cap``):

    r_k   = exp(log π_θ(y_k) − log π_prox(y_k)),   w_k = min(exp(log π_prox − log π_behaviour), c)
    pg_k  = −w_k · min(r_k A, clip(r_k, 1 − ε_low, 1 + ε_high) A)

Standard PPO (``"ppo"``, the formula above) instead clips ρ_k itself, so a token
whose policy moved more than ε since it was sampled gets no gradient at all.
With fresh samples (π_prox = π_behaviour) the two are the same update.

Aggregation (QwenGyre "averaged over tokens within an execution, then across
executions"): with N_j the completion tokens of trajectory j in the whole step
batch and M the number of trajectories in it,

    L = (1/M) Σ_j (1/N_j) Σ_{k ∈ j} ℓ_k,   i.e. token weight w_k = 1 / (M · N_j).

The weights are fixed over the whole batch before micro-batching
(`set_token_weights`), and each micro-batch's loss is Σ w_k ℓ_k, so summing
micro-batch gradients gives exactly the full-batch gradient, independent of
the micro-batch size or order. A trajectory weighs the same however many turns
or tokens it has.

Numerics follow verl: log-ratios clamped to [−20, 20] before ``exp``; k3 clamped
to ≤ 10.

The distribution trained is the one that acted (engine <-> trainer contract,
``engines/grammar.py``): log π_θ, log π_ref and the entropy are taken over
``logits / T`` with the ids ``>= len(tokenizer)`` and, for a turn sampled
under constrained decoding, every id its grammar disallowed at that position
set to −∞ (`TokenMasks` replays the grammar recorded with the turn). So at
policy version 0 the recomputed log-prob equals the behaviour log-prob and
ρ = 1; a forced token (one allowed id) has log π = 0 under every θ and
carries no gradient, whatever its advantage.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from evoharness.rollout.records import Trajectory
from evoharness.train.schedule import lr_lambda
from evoharness.config.rl import GRPOConfig


@dataclass
class TurnSample:
    """One trainable turn.

    Attributes:
        prompt_ids: context token ids (≥ 1), never trained.
        completion_ids: generated token ids, trained.
        logprobs: behaviour log-prob of each completion token (same length).
        advantage: the turn's advantage, shared by all its completion tokens.
        episode_id: the trajectory it belongs to (the aggregation unit).
        weight: per-token loss weight 1/(M·N_j), set by `set_token_weights`.
        ref_logprobs: reference-model log-probs, if precomputed elsewhere;
            otherwise the reference model is run in the loss.
        constraint: the grammar the completion was sampled under
            (`rollout.records.TurnRecord.constraint`); None: unconstrained.
        group: index of the GRPO group (task) its trajectory belongs to; mini-batches
            keep groups whole by this id. None: unknown (`grpo_step` then assumes
            ``group_size`` consecutive trajectories per group).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float
    episode_id: str
    weight: float = 0.0
    ref_logprobs: list[float] | None = None
    constraint: dict | None = None
    group: int | None = None


class TokenMasks:
    """The allowed-token masks the behaviour log-probs were taken under.

    Args:
        tokenizer: the policy's tokenizer (ids ``>= len(tokenizer)`` are never allowed).
        vocab_size: the model's output rows (``>= len(tokenizer)``).

    `__call__` returns a [B, C, V] bool mask for a micro-batch (True = allowed),
    replaying each constrained turn's grammar (`engines.grammar.ActionGrammar.replay`);
    padding positions allow everything (no all −∞ rows). The grammar's token
    classes (`engine.Vocab`) are built on first use (~1 s for 150k ids).
    """

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.tokenizer, self.vocab_size, self.n_valid = tokenizer, int(vocab_size), len(tokenizer)
        self._vocab = None

    def vocab(self, device: torch.device):
        from evoharness.engines.grammar import Vocab

        if self._vocab is None or self._vocab.free.device != device:
            self._vocab = Vocab(self.tokenizer, self.vocab_size, device)
        return self._vocab

    def __call__(self, samples: Sequence["TurnSample"], width: int, device: torch.device) -> torch.Tensor | None:
        """[B, width, V] bool, or None when nothing is masked (no constraint, no padding rows)."""
        from evoharness.engines.grammar import ActionGrammar

        if self.n_valid >= self.vocab_size and all(s.constraint is None for s in samples):
            return None
        allowed = torch.ones((len(samples), width, self.vocab_size), dtype=torch.bool, device=device)
        for i, s in enumerate(samples):
            c = len(s.completion_ids)
            allowed[i, :c, self.n_valid:] = False
            if s.constraint is not None:
                grammar = ActionGrammar.from_constraint(self.vocab(device), s.constraint)
                allowed[i, :c] &= grammar.replay(list(s.completion_ids), int(s.constraint["max_new_tokens"]))
        return allowed


def turn_samples(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]],
                 max_turns: int | None = None, seed: int = 0, group_size: int | None = None) -> list[TurnSample]:
    """Flatten trajectories into trainable turns.

    Args:
        trajectories: episodes with TITO records.
        group_size: trajectories per GRPO group (consecutive in `trajectories`, as
            rolled out); sets each sample's ``group`` from its trajectory's
            position, so a trajectory without trainable turns (a game that failed
            to load) shifts nothing. None: ``group`` stays unset.
        advantages: per trajectory, one advantage per turn (a flattened
            `advantages.turn_advantages` result, same order).
        max_turns: train on at most this many turns per trajectory, drawn
            uniformly without replacement (seeded by `seed` and the episode
            id). The token-mean within a trajectory over the drawn turns is a
            sampled estimate of the full one, so the loss keeps its scale while
            the update costs O(max_turns) forward/backward per episode — the
            same bound-the-work idea as QwenGyre's J_max path sampling. None:
            every turn.
        seed: sampling seed (e.g. the RL step).

    Turns without token ids (text-only policies, a branch's replayed prefix) or with an
    empty completion are skipped, and so are episodes an environment error ended (their reward
    measures nothing; `advantages.valid_members`).
    """
    import random

    out = []
    for n, (traj, adv) in enumerate(zip(trajectories, advantages, strict=True)):
        if traj.stop_reason == "error":
            continue
        # a branch's replayed prefix (`rollout.episode.EpisodeSpec.prefix`) was not sampled: never drawn
        pairs = list(zip(traj.turns, adv, strict=True))[traj.info.get("replayed_turns", 0):]
        if max_turns is not None and len(pairs) > max_turns:
            keep = sorted(random.Random(f"{seed}:{traj.episode_id}").sample(range(len(pairs)), max_turns))
            pairs = [pairs[i] for i in keep]
        for turn, a in pairs:
            if not turn.completion_token_ids or not turn.prompt_token_ids or turn.logprobs is None:
                continue
            if len(turn.logprobs) != len(turn.completion_token_ids):
                raise ValueError(f"{traj.episode_id} turn {turn.turn}: logprobs/completion length mismatch")
            out.append(TurnSample(list(turn.prompt_token_ids), list(turn.completion_token_ids),
                                  list(turn.logprobs), float(a), traj.episode_id, constraint=turn.constraint,
                                  group=n // group_size if group_size else None))
    return out


def set_token_weights(samples: Sequence[TurnSample]) -> None:
    """Set every sample's per-token weight to 1/(M·N_j) over this step batch."""
    n_tok: dict[str, int] = defaultdict(int)
    for s in samples:
        n_tok[s.episode_id] += len(s.completion_ids)
    m = sum(1 for n in n_tok.values() if n > 0)
    for s in samples:
        s.weight = 1.0 / (m * n_tok[s.episode_id]) if n_tok[s.episode_id] else 0.0


def _pad(rows: Sequence[Sequence[float]], width: int, value: float = 0.0, dtype=torch.float32) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def completion_logits(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that predict each completion token, from one forward pass.

    The rows ``prompt + completion`` are right-padded into one [B, L] batch with
    an attention mask (positions 0..len−1, so padding changes nothing). The
    logit for completion token j of row i sits at position P_i − 1 + j; only
    those positions go through the LM head, so prompt and padding positions get
    no logits and no gradient (and a 12k-token prompt costs no [12k, V] tensor).
    Assumes logits = lm_head(last hidden state) (Qwen/Llama families); models
    with final logit soft-capping fall back to the full logits.

    Args:
        model: a Hugging Face causal LM.
        prompt_ids: B prompts, each ≥ 1 token.
        completion_ids: B completions.
        temperature: logits are divided by it.

    Returns:
        logits [B, C, V] float32 (C = longest completion) and mask [B, C] bool.
    """
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    p_len = torch.tensor([len(p) for p in prompt_ids])
    c_len = torch.tensor([len(c) for c in completion_ids])
    device = next(model.parameters()).device
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max(len(r) for r in rows)
    input_ids = _pad(rows, width, 0, torch.long).to(device)
    attn = _pad([[1] * len(r) for r in rows], width, 0, torch.long).to(device)
    c_max = int(c_len.max())
    j = torch.arange(c_max)
    mask = j[None, :] < c_len[:, None]  # [B, C]
    pos = (p_len[:, None] - 1 + j[None, :]).clamp(max=width - 1).to(device)  # [B, C]
    if getattr(model.config, "final_logit_softcapping", None):
        logits = model(input_ids=input_ids, attention_mask=attn).logits
        logits = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
    else:
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attn).last_hidden_state  # [B, L, H]
        hidden = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, C, H]
        logits = model.get_output_embeddings()(hidden)
    return logits.float() / temperature, mask.to(device)


def _gather_logprobs(logits: torch.Tensor, completion_ids: Sequence[Sequence[int]],
                     allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the completion tokens [B, C], full log-softmax [B, C, V]); with
    `allowed` [B, C, V] the softmax is over the allowed ids only (the rest −∞)."""
    targets = _pad(completion_ids, logits.shape[1], 0, torch.long).to(logits.device)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), logp_all


def logprobs_of(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                temperature: float = 1.0, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-probs of completions given prompts (natural log).

    Args:
        allowed: optional [B, C, V] bool mask (`TokenMasks`): the softmax is taken
            over the allowed ids, as the sampler did.

    Returns:
        [B, C] float32, C = longest completion; entry (i, j) = log π(c_ij | p_i, c_i,<j)
        for j < len(c_i), 0 in the padding. Differentiable (wrap in
        ``torch.no_grad()`` for behaviour/reference log-probs).
    """
    logits, mask = completion_logits(model, prompt_ids, completion_ids, temperature)
    logp, _ = _gather_logprobs(logits, completion_ids, None if allowed is None else allowed.to(logits.device))
    return logp.masked_fill(~mask, 0.0)


def token_terms(logp: torch.Tensor, logp_all: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                ref: torch.Tensor | None, cfg: GRPOConfig) -> dict[str, torch.Tensor]:
    """The per-token terms of the module docstring, elementwise over any shape ``[...]``
    (turn rows here, packed tree tokens in `tree_loss`).

    Args:
        logp: log π_θ of the trained tokens; logp_all: their log-softmax ``[..., V]``
            (masked ids −∞); old: behaviour log-probs; adv: advantages (broadcast);
            ref: log π_ref (None when ``cfg.kl_beta == 0``).

    Returns:
        ``per_tok`` (ℓ_k), ``pg``, ``kl``, ``ent``, ``ratio`` (to the behaviour policy,
        both objectives) and ``clipped`` (bool: the clipped branch of the PPO min is the
        active one).
    """
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    if cfg.off_policy == "decoupled":  # clip against π_prox (= these weights), IS weight to the behaviour
        prox = logp.detach()
        r = torch.exp(logp - prox)
        w = ratio.detach().clamp(max=cfg.behaviour_weight_cap)
        pg1 = -adv * w * r
        pg2 = -adv * w * r.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    else:
        pg1 = -adv * ratio
        pg2 = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = torch.maximum(pg1, pg2)
    kl = torch.zeros_like(logp)
    if cfg.kl_beta > 0:
        if ref is None:
            raise ValueError("kl_beta > 0 needs reference log-probs")
        d = (ref - logp).clamp(-20.0, 20.0)
        kl = (torch.exp(d) - d - 1.0).clamp(max=10.0)
    with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.entropy_coef != 0):
        # masked ids: p = 0 and log p = −∞; count them as 0 (0 · −∞ would be NaN)
        ent = -(logp_all.exp() * logp_all.masked_fill(torch.isinf(logp_all), 0.0)).sum(-1)
    per_tok = pg + cfg.kl_beta * kl - cfg.entropy_coef * ent
    return {"per_tok": per_tok, "pg": pg, "kl": kl, "ent": ent, "ratio": ratio, "clipped": pg2 > pg1}


def microbatch_loss(model: Any, samples: Sequence[TurnSample], cfg: GRPOConfig,
                    ref_model: Any = None, masks: TokenMasks | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k w_k ℓ_k over the completion tokens of ``samples`` (weights already set).

    Args:
        masks: rebuilds the sampler's allowed-token masks (policy, reference and
            entropy all use them). None: the full output vocabulary, which is only
            right for a model whose rows all are tokenizer ids and unconstrained turns.

    Returns:
        the scalar loss (call ``.backward()``), and sums for the metrics:
        ``loss``, ``pg_loss``, ``kl``, ``entropy`` (weighted like the loss),
        ``n_tokens``, ``n_clipped``, ``ratio_sum``, ``ratio_max``, ``n_forced``
        (tokens with a single allowed id: no gradient).

    Raises:
        ValueError: a constrained sample without `masks`.
    """
    prompts = [s.prompt_ids for s in samples]
    comps = [s.completion_ids for s in samples]
    if masks is None and any(s.constraint is not None for s in samples):
        raise ValueError("constrained samples need TokenMasks to rebuild the sampling distribution")
    logits, mask = completion_logits(model, prompts, comps, cfg.temperature)
    allowed = masks(samples, logits.shape[1], logits.device) if masks is not None else None
    logp, logp_all = _gather_logprobs(logits, comps, allowed)  # [B, C], [B, C, V]
    dev, width = logp.device, logp.shape[1]
    old = _pad([s.logprobs for s in samples], width).to(dev)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=dev)[:, None]
    w = torch.tensor([s.weight for s in samples], dtype=torch.float32, device=dev)[:, None] * mask

    ref = None
    if cfg.kl_beta > 0:
        if all(s.ref_logprobs is not None for s in samples):
            ref = _pad([s.ref_logprobs for s in samples], width).to(dev)
        elif ref_model is None:
            raise ValueError("kl_beta > 0 needs a reference model or precomputed ref_logprobs")
        else:
            with torch.no_grad():
                ref = logprobs_of(ref_model, prompts, comps, cfg.temperature, allowed).to(dev)
    t = token_terms(logp, logp_all, old, adv, ref, cfg)  # [B, C] each
    pg, kl, ent, ratio, per_tok = t["pg"], t["kl"], t["ent"], t["ratio"], t["per_tok"]
    zero = torch.zeros_like(per_tok)
    loss = torch.where(mask, per_tok * w, zero).sum()

    def wsum(x: torch.Tensor) -> float:
        return float(torch.where(mask, x.detach() * w, zero).sum())

    r = ratio.detach()[mask]
    stats = {
        "loss": float(loss.detach()), "pg_loss": wsum(pg), "kl": wsum(kl), "entropy": wsum(ent),
        "n_tokens": int(mask.sum()), "n_clipped": int((t["clipped"] & mask).sum()),
        "ratio_sum": float(r.sum()), "ratio_max": float(r.max()) if r.numel() else 0.0,
        "n_forced": int(((allowed.sum(-1) == 1) & mask).sum()) if allowed is not None else 0,
    }
    return loss, stats


def accumulate_gradients(model: Any, samples: Sequence[TurnSample], cfg: GRPOConfig,
                         ref_model: Any = None, masks: TokenMasks | None = None,
                         amp: Callable[[], AbstractContextManager] = nullcontext) -> dict[str, float]:
    """Weights over the whole batch, then forward/backward per micro-batch
    (``cfg.micro_batch_size`` turns, length-sorted to limit padding); gradients
    accumulate in ``.grad`` (fp32 for fp32 master weights). `amp` wraps the
    forward passes (e.g. `precision.autocast` for bf16 compute); backward runs
    outside it. Returns step metrics: ``loss``, ``pg_loss``, ``kl``,
    ``entropy`` (trajectory-token means, as the loss), ``clip_fraction``,
    ``ratio_mean`` (plain token means), ``ratio_max``, ``n_tokens``,
    ``forced_fraction`` (tokens the constraint forced)."""
    set_token_weights(samples)
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    stats = StepStats()
    for k in range(0, len(order), cfg.micro_batch_size):
        with amp():
            loss, st = microbatch_loss(model, order[k : k + cfg.micro_batch_size], cfg, ref_model, masks)
        loss.backward()
        stats.add(st)
    return stats.metrics()


class StepStats:
    """Sums `microbatch_loss` statistics over a step's micro-batches into its metrics."""

    def __init__(self) -> None:
        self.tot: dict[str, float] = defaultdict(float)
        self.ratio_max = 0.0

    def add(self, st: dict[str, float]) -> None:
        st = dict(st)
        self.ratio_max = max(self.ratio_max, st.pop("ratio_max"))
        for key, v in st.items():
            self.tot[key] += v

    def metrics(self) -> dict[str, float]:
        """``loss``, ``pg_loss``, ``kl``, ``entropy`` (weighted like the loss), ``clip_fraction``,
        ``ratio_mean`` (token means), ``ratio_max``, ``n_tokens``, ``forced_fraction``."""
        tot, n = self.tot, max(self.tot["n_tokens"], 1)
        return {
            "loss": tot["loss"], "pg_loss": tot["pg_loss"], "kl": tot["kl"], "entropy": tot["entropy"],
            "clip_fraction": tot["n_clipped"] / n, "ratio_mean": tot["ratio_sum"] / n, "ratio_max": self.ratio_max,
            "n_tokens": int(tot["n_tokens"]), "forced_fraction": tot["n_forced"] / n,
        }


def mini_batch_slices(samples: Sequence[TurnSample], mini_batches: int, group_size: int = 1) -> list[list[TurnSample]]:
    """Split a step batch into at most `mini_batches` slices of whole GRPO groups
    (groups dealt round-robin in order of first appearance).

    A sample's group is its ``group`` id; samples without one fall back to
    ``group_size`` consecutive trajectories per group (right only when every
    trajectory has trainable turns).
    """
    if any(s.group is None for s in samples):
        episodes = list(dict.fromkeys(s.episode_id for s in samples))
        group_of = {e: i // max(1, group_size) for i, e in enumerate(episodes)}
        gid = lambda s: group_of[s.episode_id]  # noqa: E731
    else:
        gid = lambda s: s.group  # noqa: E731
    groups = list(dict.fromkeys(gid(s) for s in samples))
    n = max(1, min(mini_batches, len(groups)))
    slot = {g: j % n for j, g in enumerate(groups)}
    return [[s for s in samples if slot[gid(s)] == j] for j in range(n)]


def lr_at(cfg: GRPOConfig, step: int, steps: int) -> float:
    """The learning rate of 0-based RL step `step` (the update that makes policy version step + 1):
    ``cfg.lr``, or with ``lr_schedule = "cosine"`` the SFT stage's warm-up-then-cosine
    (`train.schedule.lr_lambda`) over RL steps, decaying to ``min_lr_ratio`` x lr at
    ``lr_decay_steps`` (`steps`, the run's length, when None) — the issue's "GRPO that keeps its
    gain" lever: late steps move the policy less. A function of the step alone, so a resumed run
    and every cell of the runtime path agree on it."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * lr_lambda(step, cfg.lr_warmup_steps, cfg.lr_decay_steps or steps, cfg.min_lr_ratio)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate (AdamW reads it at each ``step``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_optimizer(model: Any, cfg: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (Table 4: lr 1e-6), which must be fp32
    master weights (`precision.check_master_weights`: bf16 would round the updates away)."""
    from evoharness.train.precision import check_master_weights

    check_master_weights(model)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                             weight_decay=cfg.weight_decay)


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, samples: Sequence[TurnSample], cfg: GRPOConfig,
              ref_model: Any = None, group_size: int = 1, masks: TokenMasks | None = None,
              amp: Callable[[], AbstractContextManager] = nullcontext,
              anchor: Callable[[int], dict[str, float]] | None = None) -> dict[str, float]:
    """Optimizer steps on one step batch of turns.

    The batch's GRPO groups are cut into ``cfg.mini_batches`` slices of whole
    groups (`mini_batch_slices`); each slice is one update: accumulate (token
    weights over the slice), clip the gradient norm to ``cfg.grad_clip``, step.
    ``cfg.epochs`` passes run over the same slices. From the second update on
    the policy has moved, so ρ ≠ 1 and the PPO clip acts (verl's
    ``ppo_mini_batch_size`` / ``ppo_epochs``). With one mini-batch and one epoch
    this is exactly one full-batch step. `anchor(j)`, if given, adds its own
    gradient to update j's before clipping (`train.sft_anchor`: an SFT loss on
    teacher rows) and returns its metrics. Returns `accumulate_gradients`'
    metrics (and the anchor's) plus ``grad_norm`` (before clipping), averaged
    over the updates (``ratio_max``: the max; ``n_tokens``: the sum).
    """
    slices = mini_batch_slices(samples, cfg.mini_batches, group_size)
    return run_updates(optimizer, cfg, len(slices),
                       lambda j: accumulate_gradients(model, slices[j], cfg, ref_model, masks, amp), anchor)


def run_updates(optimizer: torch.optim.Optimizer, cfg: GRPOConfig, n_slices: int,
                accumulate: Callable[[int], dict[str, float]],
                anchor: Callable[[int], dict[str, float]] | None = None,
                sums: Sequence[str] = ("n_tokens",)) -> dict[str, float]:
    """``cfg.epochs`` passes over `n_slices` updates (`grpo_step`, `tree_loss.tree_grpo_step`): per
    update j, `accumulate(slice)` leaves the slice's gradient and returns its metrics, `anchor(j)`
    adds its own, the norm is clipped to ``cfg.grad_clip``, the optimizer steps. Returns the
    metrics averaged over the updates (``ratio_max``: the max; the `sums` keys: sums), plus
    ``grad_norm`` (before clipping) and ``updates``."""
    runs = []
    for k in [k for _ in range(cfg.epochs) for k in range(n_slices)]:
        optimizer.zero_grad(set_to_none=True)
        m = accumulate(k)
        if anchor is not None:
            m.update(anchor(len(runs)))
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)) if params else 0.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        runs.append(m)
    out = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
    out["ratio_max"] = max(r["ratio_max"] for r in runs)
    for key in sums:
        out[key] = sum(r[key] for r in runs)
    out["updates"] = len(runs)
    return out
