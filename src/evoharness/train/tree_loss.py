"""GRPO on tree-packed trajectory trees (QwenGyre §3); SFT's packed loss is `packing.packed_sft_loss`.

Per execution j (one `TrajectoryTree`), `select_paths` picks up to J_max
root-to-leaf paths; the trained tokens of j are the trainable tokens on those
paths, each once (``N_j`` of them). Every trained token takes its execution's
group-relative advantage (or, with per-call advantages such as GiGPO's, the
advantage of the call that generated it) and the per-token loss ℓ_k of
`grpo.token_terms` (PPO clip with the recorded behaviour log-prob, k3 KL to
the reference, entropy bonus). Two-level averaging (tokens within an execution,
then executions), with M executions that have trained tokens:

    L = (1/M) Σ_j (1/N_j) Σ_{k ∈ j} ℓ_k,   token weight w_k = 1 / (M · N_j),

the same weights as `grpo.set_token_weights`, so with J_max uncapped and no two
calls sharing a generated token, this loss and its gradient equal the turn-row
loss of `grpo.accumulate_gradients` (tested), while shared prefixes run once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from evoharness.rollout.records import Trajectory
from evoharness.rollout.tree import PathSelection, TrajectoryTree, all_paths, has_tokens, select_paths
from evoharness.train.grpo import StepStats, TokenMasks, run_updates, token_terms
from evoharness.config.rl import GRPOConfig
from evoharness.train.packing import PackedBatch, collate, linear_cost, pack_trees, target_logprobs


def execution_weights(selections: Sequence[PathSelection]) -> list[float]:
    """Per execution, the token weight 1/(M·N_j) (0 for an execution with nothing to train)."""
    m = sum(1 for s in selections if s.n_tokens > 0)
    return [1.0 / (m * s.n_tokens) if s.n_tokens else 0.0 for s in selections]


def trajectory_trees(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]]
                     ) -> tuple[list[TrajectoryTree], list[list[float]]]:
    """ALFWorld episodes as trees, and per tree one advantage per call.

    Args:
        trajectories: episodes with TITO records (rollout order).
        advantages: per trajectory, one advantage per turn (`advantages.turn_advantages`,
            flattened), so GiGPO's step-level advantages reach the tokens of their turn.
    """
    trees, per_call = [], []
    for traj, adv in zip(trajectories, advantages, strict=True):
        if len(adv) != len(traj.turns):
            raise ValueError(f"{traj.episode_id}: {len(adv)} advantages for {len(traj.turns)} turns")
        trees.append(TrajectoryTree.from_trajectory(traj))
        per_call.append([float(a) for t, a in zip(traj.turns, adv) if has_tokens(t)])
    return trees, per_call


def target_masks(masks: TokenMasks, trees: Sequence[TrajectoryTree], batch: PackedBatch,
                 device: torch.device) -> torch.Tensor | None:
    """[K, V] bool: the allowed ids each target was sampled under (the behaviour log-prob
    contract, as `grpo.TokenMasks` for turn rows): ids ``>= len(tokenizer)`` never, and
    for a constrained call the mask its grammar applied at that completion position
    (`engines.grammar.ActionGrammar.replay`, once per call). None when nothing is masked."""
    from evoharness.engines.grammar import ActionGrammar

    keys = list(zip(batch.tree.tolist(), batch.gen_call.tolist(), batch.node.tolist(), batch.offset.tolist()))
    constrained = {(t, g) for t, g, _, _ in keys if trees[t].calls[g].constraint is not None}
    if masks.n_valid >= masks.vocab_size and not constrained:
        return None
    allowed = torch.ones((len(keys), masks.vocab_size), dtype=torch.bool, device=device)
    allowed[:, masks.n_valid:] = False
    replays: dict[tuple[int, int], torch.Tensor] = {}
    depth: dict[tuple[int, int], int] = {}
    for k, (t, g, node, off) in enumerate(keys):
        if (t, g) not in constrained:
            continue
        call = trees[t].calls[g]
        if (t, g) not in replays:
            grammar = ActionGrammar.from_constraint(masks.vocab(device), call.constraint)
            replays[(t, g)] = grammar.replay(trees[t].call_sequence(g)[1], int(call.constraint["max_new_tokens"]))
        if (t, node) not in depth:
            depth[(t, node)] = trees[t].depth(node)
        allowed[k] &= replays[(t, g)][depth[(t, node)] + off - call.n_prompt]
    return allowed


def _token_advantages(batch: PackedBatch, advantages: Sequence[float | Sequence[float]]) -> torch.Tensor:
    out = torch.empty(batch.n_targets, dtype=torch.float32)
    for k, (t, g) in enumerate(zip(batch.tree.tolist(), batch.gen_call.tolist())):
        a = advantages[t]
        out[k] = float(a) if isinstance(a, (int, float)) else float(a[g])
    return out


def packed_grpo_loss(model: Any, batch: PackedBatch, advantages: Sequence[float | Sequence[float]],
                     weights: Sequence[float], cfg: GRPOConfig, ref_model: Any = None,
                     allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k w_k ℓ_k over one packed batch's target tokens.

    Args:
        batch: packed from the trees that `advantages` and `weights` index.
        advantages: per tree, one float (the execution's advantage) or one per call.
        weights: per tree, the token weight (`execution_weights`).
        allowed: optional [K, V] bool sampling masks (`target_masks`), applied to
            π_θ, π_ref and the entropy alike.

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
            ref = ref.to(dev)
    t = token_terms(logp, logp_all, old, adv, ref, cfg)
    loss = (t["per_tok"] * w).sum()
    r = t["ratio"].detach()
    stats = {
        "loss": float(loss.detach()), "pg_loss": float((t["pg"].detach() * w).sum()),
        "kl": float((t["kl"].detach() * w).sum()), "entropy": float((t["ent"].detach() * w).sum()),
        "n_tokens": batch.n_targets, "n_clipped": int(t["clipped"].sum()),
        "ratio_sum": float(r.sum()), "ratio_max": float(r.max()) if r.numel() else 0.0,
        "n_forced": int((allowed.sum(-1) == 1).sum()) if allowed is not None else 0,
    }
    return loss, stats


def tree_accumulate_gradients(model: Any, trees: Sequence[TrajectoryTree],
                              advantages: Sequence[float | Sequence[float]], cfg: GRPOConfig, *,
                              j_max: int | None = None, seed: int | str = 0, max_tokens: int | None = 4096,
                              rows_per_micro: int = 1, cost_model: bool = True, ref_model: Any = None,
                              masks: TokenMasks | None = None,
                              amp: Callable[[], AbstractContextManager] = nullcontext) -> dict[str, float]:
    """Dedup-sample, pack and accumulate gradients of the two-level GRPO loss.

    Args:
        trees: one per execution; advantages: per tree, a float or one per call.
        j_max: paths per execution (`select_paths`); None: every path.
        seed: sampling seed (e.g. the RL step).
        max_tokens: row budget of `pack_trees`; rows_per_micro: rows per forward/backward
            (length-sorted, right-padded: small models run faster in batches of rows).
        cost_model: a path joins a row only when `packing.linear_cost` of the model says
            it is cheaper than a row of its own (small models pay more for long rows).
        masks: rebuilds the sampler's allowed-token masks (as in `grpo.microbatch_loss`).
        amp: wraps the forward passes (autocast); backward runs outside it.

    Returns:
        the metrics of `grpo.accumulate_gradients` plus ``paths`` (selected
        paths), ``packed_tokens`` (tokens run, padding excluded) and ``rows``.

    Raises:
        ValueError: advantages and trees differ in number; a constrained call without `masks`.
    """
    if len(advantages) != len(trees):
        raise ValueError(f"{len(advantages)} advantages for {len(trees)} trees")
    if masks is None and any(c.constraint is not None for t in trees for c in t.calls):
        raise ValueError("constrained calls need TokenMasks to rebuild the sampling distribution")
    sels = [select_paths(t, j_max, seed) if j_max is not None else all_paths(t) for t in trees]
    weights = execution_weights(sels)
    rows = pack_trees(trees, sels, max_tokens, linear_cost(model.config) if cost_model else None)
    rows.sort(key=lambda r: r.n_tokens)  # rows of a micro-batch pad to the longest
    device = next(model.parameters()).device
    stats = StepStats()
    for k in range(0, len(rows), rows_per_micro):
        batch = collate(trees, rows[k:k + rows_per_micro])
        if batch.n_targets == 0:
            continue
        allowed = target_masks(masks, trees, batch, device) if masks is not None else None
        with amp():
            loss, st = packed_grpo_loss(model, batch, advantages, weights, cfg, ref_model, allowed)
        loss.backward()
        stats.add(st)
    return {**stats.metrics(), "paths": sum(len(s.leaves) for s in sels),
            "packed_tokens": sum(r.n_tokens for r in rows), "rows": len(rows)}


def tree_grpo_step(model: Any, optimizer: torch.optim.Optimizer, trees: Sequence[TrajectoryTree],
                   advantages: Sequence[float | Sequence[float]], cfg: GRPOConfig, *, group_size: int = 1,
                   j_max: int | None = None, seed: int | str = 0, max_tokens: int | None = 4096,
                   rows_per_micro: int = 1, ref_model: Any = None, masks: TokenMasks | None = None,
                   amp: Callable[[], AbstractContextManager] = nullcontext,
                   anchor: Callable[[int], dict[str, float]] | None = None) -> dict[str, float]:
    """Optimizer steps on one step batch of trees: `grpo.grpo_step` with tree packing.

    The trees (rollout order, ``group_size`` consecutive trees per GRPO group)
    are dealt round-robin by whole groups into ``cfg.mini_batches`` slices, as
    `grpo.mini_batch_slices`; each slice is one update (weights over the slice,
    accumulate, add `anchor`'s gradient, clip to ``cfg.grad_clip``, step), ``cfg.epochs``
    passes over the slices. Returns the metrics of
    `tree_accumulate_gradients` plus ``grad_norm``, averaged over the updates
    (``ratio_max``: the max; ``n_tokens``, ``packed_tokens``, ``paths``, ``rows``: sums).
    """
    n_groups = -(-len(trees) // max(1, group_size))
    n = max(1, min(cfg.mini_batches, n_groups))

    def accumulate(j: int) -> dict[str, float]:
        idx = [i for i in range(len(trees)) if (i // max(1, group_size)) % n == j]
        return tree_accumulate_gradients(model, [trees[i] for i in idx], [advantages[i] for i in idx], cfg,
                                         j_max=j_max, seed=seed, max_tokens=max_tokens, rows_per_micro=rows_per_micro,
                                         ref_model=ref_model, masks=masks, amp=amp)

    return run_updates(optimizer, cfg, n, accumulate, anchor, sums=("n_tokens", "packed_tokens", "paths", "rows"))
