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
the proximal policy π_prox (the weights the step starts from: with one update per
step those the gradient is taken at; with several, the log-probs recorded before the
first, ``TurnSample.prox_logprobs``) and the behaviour policy enters only as a truncated
importance weight (truncated IS, Espeholt et al. 2018; cap ``behaviour_weight_cap``):

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
(`train.step.set_token_weights`), and each micro-batch's loss is Σ w_k ℓ_k, so
summing micro-batch gradients gives exactly the full-batch gradient, independent
of the micro-batch size or order. A trajectory weighs the same however many turns
or tokens it has. The update loop is `train.trainer.Trainer` / `train.step`.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

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
        weight: per-token loss weight 1/(M·N_j), set by `train.step.set_token_weights`.
        ref_logprobs: reference-model log-probs, if precomputed elsewhere;
            otherwise the reference model is run in the loss.
        constraint: the grammar the completion was sampled under
            (`rollout.records.TurnRecord.constraint`); None: unconstrained.
        group: index of the GRPO group (task) its trajectory belongs to; mini-batches
            keep groups whole by this id (`train.step.mini_batch_slices`).
        prox_logprobs: decoupled PPO with several updates per step: log π_prox of each
            completion token, recorded before the step's first update; None: π_prox is the
            weights the gradient is taken at.
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
    prox_logprobs: list[float] | None = None


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

    def __call__(self, samples: Sequence[TurnSample], width: int, device: torch.device) -> torch.Tensor | None:
        """[B, width, V] bool, or None when nothing is masked (no constraint, no padding rows)."""
        from evoharness.engines.grammar import ActionGrammar

        if self.n_valid >= self.vocab_size and all(s.constraint is None for s in samples):
            return None
        allowed = torch.ones((len(samples), width, self.vocab_size), dtype=torch.bool, device=device)
        for i, s in enumerate(samples):
            c = len(s.completion_ids)
            allowed[i, :c, self.n_valid :] = False
            if s.constraint is not None:
                grammar = ActionGrammar.from_constraint(self.vocab(device), s.constraint)
                allowed[i, :c] &= grammar.replay(list(s.completion_ids), int(s.constraint["max_new_tokens"]))
        return allowed


def _pad(rows: Sequence[Sequence[float]], width: int, value: float = 0.0, dtype=torch.float32) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def completion_logits(
    model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
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


def _gather_logprobs(
    logits: torch.Tensor, completion_ids: Sequence[Sequence[int]], allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the completion tokens [B, C], full log-softmax [B, C, V]); with
    `allowed` [B, C, V] the softmax is over the allowed ids only (the rest −∞)."""
    targets = _pad(completion_ids, logits.shape[1], 0, torch.long).to(logits.device)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), logp_all


def logprobs_of(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    temperature: float = 1.0,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
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


def token_terms(
    logp: torch.Tensor,
    logp_all: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    ref: torch.Tensor | None,
    cfg: GRPOConfig,
    prox: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The per-token terms of the module docstring, elementwise over any shape ``[...]``
    (turn rows here, packed tree tokens in `tree_loss`).

    Args:
        logp: log π_θ of the trained tokens; logp_all: their log-softmax ``[..., V]``
            (masked ids −∞); old: behaviour log-probs; adv: advantages (broadcast);
            ref: log π_ref (None when ``cfg.kl_beta == 0``); prox: decoupled PPO's log π_prox
            (None: the weights the gradient is taken at).

    Returns:
        ``per_tok`` (ℓ_k), ``pg``, ``kl``, ``ent``, ``ratio`` (to the behaviour policy,
        both objectives), ``clipped`` (bool: the clip is active, the clipped branch of the
        PPO min strictly binds) and ``capped`` (bool: decoupled PPO's behaviour weight hit its cap).
    """
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    capped = torch.zeros_like(logp, dtype=torch.bool)
    if cfg.off_policy == "decoupled":  # clip against π_prox, IS weight π_prox / π_behaviour
        prox = logp.detach() if prox is None else prox
        r = torch.exp((logp - prox).clamp(-20.0, 20.0))
        w_raw = torch.exp((prox - old).clamp(-20.0, 20.0))
        w = w_raw.clamp(max=cfg.behaviour_weight_cap)
        capped = w_raw > cfg.behaviour_weight_cap
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
    return {"per_tok": per_tok, "pg": pg, "kl": kl, "ent": ent, "ratio": ratio, "clipped": pg2 > pg1, "capped": capped}


def microbatch_loss(
    model: Any, samples: Sequence[TurnSample], cfg: GRPOConfig, ref_model: Any = None, masks: TokenMasks | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k w_k ℓ_k over the completion tokens of ``samples`` (weights already set).

    Args:
        masks: rebuilds the sampler's allowed-token masks (policy, reference and
            entropy all use them). None: the full output vocabulary, which is only
            right for a model whose rows all are tokenizer ids and unconstrained turns.

    Returns:
        the scalar loss (call ``.backward()``), and sums for the metrics:
        ``loss``, ``pg_loss``, ``kl``, ``entropy`` (weighted like the loss),
        ``n_tokens``, ``n_clipped``, ``n_capped``, ``ratio_sum``, ``ratio_max``, ``n_forced``
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
    prox = None
    if cfg.off_policy == "decoupled" and all(s.prox_logprobs is not None for s in samples):
        prox = _pad([s.prox_logprobs for s in samples], width).to(dev)

    ref = None
    if cfg.kl_beta > 0:
        if all(s.ref_logprobs is not None for s in samples):
            ref = _pad([s.ref_logprobs for s in samples], width).to(dev)
        elif ref_model is None:
            raise ValueError("kl_beta > 0 needs a reference model or precomputed ref_logprobs")
        else:
            with torch.no_grad():
                ref = logprobs_of(ref_model, prompts, comps, cfg.temperature, allowed).to(dev)
    t = token_terms(logp, logp_all, old, adv, ref, cfg, prox)  # [B, C] each
    pg, kl, ent, ratio, per_tok = t["pg"], t["kl"], t["ent"], t["ratio"], t["per_tok"]
    zero = torch.zeros_like(per_tok)
    loss = torch.where(mask, per_tok * w, zero).sum()

    def wsum(x: torch.Tensor) -> float:
        return float(torch.where(mask, x.detach() * w, zero).sum())

    r = ratio.detach()[mask]
    stats = {
        "loss": float(loss.detach()),
        "pg_loss": wsum(pg),
        "kl": wsum(kl),
        "entropy": wsum(ent),
        "n_tokens": int(mask.sum()),
        "n_clipped": int((t["clipped"] & mask).sum()),
        "n_capped": int((t["capped"] & mask).sum()),
        "ratio_sum": float(r.sum()),
        "ratio_max": float(r.max()) if r.numel() else 0.0,
        "n_forced": int(((allowed.sum(-1) == 1) & mask).sum()) if allowed is not None else 0,
    }
    return loss, stats


def proximal_logprobs(
    model: Any, samples: Sequence[TurnSample], cfg: GRPOConfig, masks: TokenMasks | None = None
) -> list[list[float]]:
    """log π(y_k) of each sample's completion tokens under `model` as it is now (no gradient):
    decoupled PPO's π_prox, taken before a step's first update."""
    prompts, comps = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    with torch.no_grad():
        logits, mask = completion_logits(model, prompts, comps, cfg.temperature)
        allowed = masks(samples, logits.shape[1], logits.device) if masks is not None else None
        logp, _ = _gather_logprobs(logits, comps, allowed)
    return [logp[i, : len(c)].tolist() for i, c in enumerate(comps)]
