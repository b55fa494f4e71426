"""GRPO rows, tree-packed (QwenGyre §3 "tree-packed training"); SFT's packed loss is `packing.packed_sft_loss`.

The rows of one execution (`train.grpo.TurnSample`: a prompt as context, a completion to train)
are folded into one prefix-shared `TrajectoryTree`, each row a call of its own; the trees are
laid into packed rows (`packing.pack_trees`) whose tree attention mask lets every token see
exactly its own context, so a prefix the rows share (the system prompt, an agent's growing
history) runs once. The objective does not change: every row's completion token is one target
with the row's own behaviour log-prob, advantage, weight and sampling mask, also where several
rows generated the same token at the same position (`rollout.tree.TreeNode.claims`: one forward
position, one target per row), so

    Σ_rows Σ_{k ∈ row} w_row · ℓ_k(A_row)

is the turn-row loss of `grpo.microbatch_loss` summed over the rows (tested to 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig
from evoharness.rollout.tree import TrajectoryTree
from evoharness.train.grpo import TokenMasks, TurnSample, token_terms
from evoharness.train.packing import PackedBatch, collate, linear_cost, pack_trees, target_logprobs


def row_trees(rows: Sequence[TurnSample]) -> tuple[list[TrajectoryTree], list[list[TurnSample]]]:
    """One tree per execution (``episode_id``, first-seen order), each row a call; and per tree
    its rows in call order (call ``c`` of tree ``t`` is ``rows_of[t][c]``)."""
    trees: dict[str, TrajectoryTree] = {}
    rows_of: dict[str, list[TurnSample]] = {}
    for r in rows:
        tree = trees.setdefault(r.episode_id, TrajectoryTree(r.episode_id))
        rows_of.setdefault(r.episode_id, []).append(r)
        tree.add_call(r.prompt_ids, r.completion_ids, r.logprobs, constraint=r.constraint)
    return list(trees.values()), list(rows_of.values())


def target_masks(
    masks: TokenMasks, trees: Sequence[TrajectoryTree], batch: PackedBatch, device: torch.device
) -> torch.Tensor | None:
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
    allowed[:, masks.n_valid :] = False
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


def packed_grpo_loss(
    model: Any,
    batch: PackedBatch,
    trees: Sequence[TrajectoryTree],
    rows_of: Sequence[Sequence[TurnSample]],
    cfg: GRPOConfig,
    ref_model: Any = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k w_k ℓ_k over one packed batch's targets, each target taking the weight, advantage and
    (decoupled PPO) π_prox log-prob of its row (`rows_of[tree][call]`, `row_trees`).

    Returns:
        the scalar loss and the statistics of `grpo.microbatch_loss`.
    """
    logp, logp_all = target_logprobs(model, batch, cfg.temperature, allowed)
    dev = logp.device
    keys = list(zip(batch.tree.tolist(), batch.gen_call.tolist()))
    row = [rows_of[t][g] for t, g in keys]
    old = batch.behaviour_logprobs.to(dev)
    adv = torch.tensor([r.advantage for r in row], dtype=torch.float32, device=dev)
    w = torch.tensor([r.weight for r in row], dtype=torch.float32, device=dev)
    prox = None
    if cfg.off_policy == "decoupled" and row and all(r.prox_logprobs is not None for r in row):
        pos = _completion_positions(batch, trees, rows_of)
        prox = torch.tensor([r.prox_logprobs[i] for r, i in zip(row, pos)], dtype=torch.float32, device=dev)
    ref = None
    if cfg.kl_beta > 0:
        if ref_model is None:
            raise ValueError("kl_beta > 0 needs a reference model")
        with torch.no_grad():
            ref, _ = target_logprobs(ref_model, batch, cfg.temperature, allowed)
            ref = ref.to(dev)
    t = token_terms(logp, logp_all, old, adv, ref, cfg, prox)
    loss = (t["per_tok"] * w).sum()
    r = t["ratio"].detach()
    stats = {
        "loss": float(loss.detach()),
        "pg_loss": float((t["pg"].detach() * w).sum()),
        "kl": float((t["kl"].detach() * w).sum()),
        "entropy": float((t["ent"].detach() * w).sum()),
        "n_tokens": batch.n_targets,
        "n_clipped": int(t["clipped"].sum()),
        "n_capped": int(t["capped"].sum()),
        "ratio_sum": float(r.sum()),
        "ratio_max": float(r.max()) if r.numel() else 0.0,
        "n_forced": int((allowed.sum(-1) == 1).sum()) if allowed is not None else 0,
    }
    return loss, stats


def _completion_positions(
    batch: PackedBatch, trees: Sequence[TrajectoryTree], rows_of: Sequence[Sequence[TurnSample]]
) -> list[int]:
    """Per target, its index in its row's completion (for per-token row data such as π_prox)."""
    return [
        off + trees[t].depth(node) - len(rows_of[t][g].prompt_ids)
        for t, g, node, off in zip(
            batch.tree.tolist(), batch.gen_call.tolist(), batch.node.tolist(), batch.offset.tolist()
        )
    ]


def packed_rows_accumulate(
    model: Any,
    rows: Sequence[TurnSample],
    cfg: GRPOConfig,
    ref_model: Any = None,
    masks: TokenMasks | None = None,
    amp: Callable[[], AbstractContextManager] = nullcontext,
) -> dict[str, float]:
    """Forward/backward of `rows` (weights already set) tree-packed: rows of at most
    ``cfg.pack_tokens`` tokens where sharing pays (`packing.linear_cost`), ``cfg.micro_batch_size``
    packed rows per forward (length-sorted). Returns the statistics of `grpo.microbatch_loss`
    summed over the micro-batches, plus ``packed_tokens`` (tokens run, padding excluded) and
    ``rows`` (packed rows).

    Raises:
        ValueError: a constrained row without `masks`.
    """
    from evoharness.train.step import sum_stats

    if masks is None and any(r.constraint is not None for r in rows):
        raise ValueError("constrained rows need TokenMasks to rebuild the sampling distribution")
    trees, rows_of = row_trees(rows)
    packed = pack_trees(trees, None, cfg.pack_tokens, linear_cost(model.config))
    packed.sort(key=lambda r: r.n_tokens)  # rows of a micro-batch pad to the longest
    device = next(model.parameters()).device
    parts = []
    for k in range(0, len(packed), cfg.micro_batch_size):
        batch = collate(trees, packed[k : k + cfg.micro_batch_size])
        if batch.n_targets == 0:
            continue
        allowed = target_masks(masks, trees, batch, device) if masks is not None else None
        with amp():
            loss, st = packed_grpo_loss(model, batch, trees, rows_of, cfg, ref_model, allowed)
        loss.backward()
        parts.append(st)
    return {**sum_stats(parts), "packed_tokens": sum(r.n_tokens for r in packed), "rows": len(packed)}
