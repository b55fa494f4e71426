"""GRPO and SFT on tree-packed trajectory trees (QwenGyre §3).

Per execution j (one `TrajectoryTree`), `select_paths` picks up to J_max
root-to-leaf paths; the trained tokens of j are the trainable tokens on those
paths, each once (``N_j`` of them). Every trained token takes its execution's
group-relative advantage (or, with per-call advantages such as GiGPO's, the
advantage of the call that generated it) and the per-token loss ℓ_k of
`grpo.microbatch_loss` (PPO clip with the recorded behaviour log-prob, k3 KL to
the reference, entropy bonus). Two-level averaging (tokens within an execution,
then executions), with M executions that have trained tokens:

    L = (1/M) Σ_j (1/N_j) Σ_{k ∈ j} ℓ_k,   token weight w_k = 1 / (M · N_j),

the same weights as `grpo.set_token_weights`, so with J_max uncapped and no two
calls sharing a generated token, this loss and its gradient equal the turn-row
loss of `grpo.accumulate_gradients` (tested), while shared prefixes run once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from evoharness.rollout.tree import PathSelection, TrajectoryTree, all_paths, select_paths
from evoharness.train.grpo import GRPOConfig
from evoharness.train.packing import PackedBatch, collate, linear_cost, pack_trees, target_logprobs


def ppo_token_terms(logp: torch.Tensor, logp_all: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                    ref: torch.Tensor | None, cfg: GRPOConfig) -> dict[str, torch.Tensor]:
    """Per-token GRPO terms, elementwise over any shape ``[...]`` (see `grpo` module docstring).

    Args:
        logp: log π_θ of the trained tokens ``[...]``; logp_all: their full
            log-softmax ``[..., V]`` (for the entropy).
        old: behaviour log-probs; adv: advantages; ref: reference log-probs
            (None when ``cfg.kl_beta == 0``).

    Returns:
        ``per_tok`` (ℓ_k), ``pg``, ``kl``, ``ent``, ``ratio``, ``clipped`` (bool).
    """
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
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
        ent = -(logp_all.exp() * logp_all).sum(-1)
    per_tok = pg + cfg.kl_beta * kl - cfg.entropy_coef * ent
    return {"per_tok": per_tok, "pg": pg, "kl": kl, "ent": ent, "ratio": ratio, "clipped": pg2 > pg1}


def execution_weights(selections: Sequence[PathSelection]) -> list[float]:
    """Per execution, the token weight 1/(M·N_j) (0 for an execution with nothing to train)."""
    m = sum(1 for s in selections if s.n_tokens > 0)
    return [1.0 / (m * s.n_tokens) if s.n_tokens else 0.0 for s in selections]


def _token_advantages(batch: PackedBatch, advantages: Sequence[float | Sequence[float]]) -> torch.Tensor:
    out = torch.empty(batch.n_targets, dtype=torch.float32)
    for k, (t, g) in enumerate(zip(batch.tree.tolist(), batch.gen_call.tolist())):
        a = advantages[t]
        out[k] = float(a) if isinstance(a, (int, float)) else float(a[g])
    return out


def packed_grpo_loss(model: Any, trees: Sequence[TrajectoryTree], batch: PackedBatch,
                     advantages: Sequence[float | Sequence[float]], weights: Sequence[float], cfg: GRPOConfig,
                     ref_model: Any = None, allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k w_k ℓ_k over one packed batch's target tokens.

    Args:
        trees: the trees `batch` was packed from (same order).
        advantages: per tree, one float (the execution's advantage) or one per call.
        weights: per tree, the token weight (`execution_weights`).
        allowed: optional [K, V] bool, the sampling masks (vocabulary padding,
            grammar) of each target, applied to π_θ and π_ref alike.

    Returns:
        the scalar loss and sums for the metrics, as `grpo.microbatch_loss`.
    """
    logp, logp_all = target_logprobs(model, batch, cfg.temperature, allowed)
    dev = logp.device
    old = batch.behaviour_logprobs.to(dev)
    adv = _token_advantages(batch, advantages).to(dev)
    w = torch.tensor(weights, dtype=torch.float32)[batch.tree].to(dev)
    ref = None
    if cfg.kl_beta > 0:
        if ref_model is None:
            raise ValueError("kl_beta > 0 needs a reference model")
        with torch.no_grad():
            ref, _ = target_logprobs(ref_model, batch, cfg.temperature, allowed)
    t = ppo_token_terms(logp, logp_all, old, adv, ref, cfg)
    loss = (t["per_tok"] * w).sum()
    r = t["ratio"].detach()
    stats = {
        "loss": float(loss.detach()), "pg_loss": float((t["pg"].detach() * w).sum()),
        "kl": float((t["kl"].detach() * w).sum()), "entropy": float((t["ent"].detach() * w).sum()),
        "n_tokens": batch.n_targets, "n_clipped": int(t["clipped"].sum()),
        "ratio_sum": float(r.sum()), "ratio_max": float(r.max()) if r.numel() else 0.0,
    }
    return loss, stats


def tree_accumulate_gradients(model: Any, trees: Sequence[TrajectoryTree],
                              advantages: Sequence[float | Sequence[float]], cfg: GRPOConfig, *,
                              j_max: int | None = None, seed: int | str = 0, max_tokens: int | None = 4096,
                              rows_per_micro: int = 1, cost_model: bool = True, ref_model: Any = None,
                              allowed_fn: Any = None) -> dict[str, float]:
    """Dedup-sample, pack and accumulate gradients of the two-level GRPO loss.

    Args:
        trees: one per execution; advantages: per tree, a float or one per call.
        j_max: paths per execution (`select_paths`); None: every path.
        seed: sampling seed (e.g. the RL step).
        max_tokens: row budget of `pack_trees`; rows_per_micro: rows per forward/backward.
        cost_model: a path joins a row only when `packing.linear_cost` of the model says
            it is cheaper than a row of its own (small models pay more for long rows).
        allowed_fn: optional ``allowed_fn(trees, batch) -> [K, V] bool`` (sampling masks).

    Returns:
        the metrics of `grpo.accumulate_gradients` plus ``paths`` (selected
        paths), ``packed_tokens`` (tokens run, padding excluded) and ``rows``.
    """
    if len(advantages) != len(trees):
        raise ValueError(f"{len(advantages)} advantages for {len(trees)} trees")
    sels = [select_paths(t, j_max, seed) if j_max is not None else all_paths(t) for t in trees]
    weights = execution_weights(sels)
    rows = pack_trees(trees, sels, max_tokens, linear_cost(model.config) if cost_model else None)
    tot: dict[str, float] = defaultdict(float)
    ratio_max = 0.0
    for k in range(0, len(rows), rows_per_micro):
        batch = collate(trees, rows[k:k + rows_per_micro])
        if batch.n_targets == 0:
            continue
        allowed = allowed_fn(trees, batch) if allowed_fn is not None else None
        loss, st = packed_grpo_loss(model, trees, batch, advantages, weights, cfg, ref_model, allowed)
        loss.backward()
        ratio_max = max(ratio_max, st.pop("ratio_max"))
        for key, v in st.items():
            tot[key] += v
    n = max(tot["n_tokens"], 1)
    return {
        "loss": tot["loss"], "pg_loss": tot["pg_loss"], "kl": tot["kl"], "entropy": tot["entropy"],
        "clip_fraction": tot["n_clipped"] / n, "ratio_mean": tot["ratio_sum"] / n, "ratio_max": ratio_max,
        "n_tokens": int(tot["n_tokens"]), "paths": sum(len(s.leaves) for s in sels),
        "packed_tokens": sum(r.n_tokens for r in rows), "rows": len(rows),
    }
