"""Tree packing: several trajectory trees in one row, shared prefixes run once.

A packed row is a sequence of tree nodes (segments). Token i may attend to token
j iff j lies on i's root-to-token path: earlier in the same segment, or anywhere
in an ancestor segment. Position ids are the token's depth in its tree, so every
token sees exactly the context (and RoPE positions) it had in its own call, and
its hidden state equals that of an unpacked ``prompt + completion`` row
(QwenGyre §3 "tree-packed training"; cf. AReaL's tree training).

Shapes: ``_B`` rows, ``_L`` row length (padded), ``_K`` target tokens (the
trainable tokens that carry loss), ``_V`` vocabulary, ``_H`` hidden size.

The mask goes to the model as a 4D ``[B, 1, L, L]`` tensor. With SDPA it is a
boolean mask (True = attend); with eager attention it is an additive float mask
(0 / dtype min), because eager attention *adds* the mask and a boolean one is
silently wrong (machine-notes.md). Other attention kernels are refused. Padding
tokens attend to themselves only, so no softmax row is empty.

A tree larger than ``max_tokens`` is spread over several rows by whole
root-to-leaf paths (a path is never cut: it needs all its context). A node that
lands in several rows is context in all but the first, where its tokens carry
loss, so gradients summed over rows equal those of one unbounded row. With a
cost model (`linear_cost`) a path also starts a new row when sharing would not
pay for the longer row's attention (the dense mask makes a row of L tokens cost
∝ α·L + L²): tiny CPU models pack little, Qwen3-8B packs up to the budget.

Measured: benchmarks/bench_tree.py (results/bench_tree.txt).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from evoharness.rollout.tree import ROOT, PathSelection, TrajectoryTree, all_paths


@dataclass
class Segment:
    """One tree node placed in a row.

    Attributes:
        tree: index of the tree in the packed list.
        node: node id in that tree.
        parent: index of the parent's segment in the same row (-1: a root child).
        train: its trainable tokens carry loss in this row.
    """

    tree: int
    node: int
    parent: int
    train: bool


@dataclass
class PackedRow:
    """Segments of one row, parents before children."""

    segments: list[Segment] = field(default_factory=list)
    n_tokens: int = 0
    _index: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)


@dataclass
class PackedBatch:
    """Rows collated into tensors, plus where every target token came from.

    Attributes:
        input_ids / position_ids: [B, L] long (pads: id `pad_id`, position 0).
        seg_ids: [B, L] long, segment index in its row (-1 on padding).
        ancestors: per row, [S, S] bool, ``a[s, t]``: segment t is s or an ancestor of s.
        pred_row / pred_pos: [K] long, the position whose logits predict each target.
        targets: [K] long token ids. A token several calls generated at one position
            (`rollout.tree.TreeNode.claims`) is one target per call, all at that position.
        tree / node / offset: [K] long, the target's place in its tree.
        gen_call: [K] long, the call that generated it (index in ``trees[tree].calls``).
        behaviour_logprobs: [K] float32, recorded log-probs.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seg_ids: torch.Tensor
    ancestors: list[torch.Tensor]
    pred_row: torch.Tensor
    pred_pos: torch.Tensor
    targets: torch.Tensor
    tree: torch.Tensor
    node: torch.Tensor
    offset: torch.Tensor
    gen_call: torch.Tensor
    behaviour_logprobs: torch.Tensor

    @property
    def n_targets(self) -> int:
        return int(self.targets.numel())

    def attention_mask(self, kind: str = "bool", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tree attention mask, [B, 1, L, L]: bool (True = attend) or additive float."""
        b, width = self.input_ids.shape
        masks = []
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        eye = torch.eye(width, dtype=torch.bool)
        for r in range(b):
            seg = self.seg_ids[r]
            real = seg >= 0
            s = seg.clamp(min=0)
            anc = self.ancestors[r][s[:, None], s[None, :]]  # [L, L]
            same = seg[:, None] == seg[None, :]
            m = anc & (~same | causal) & real[:, None] & real[None, :]
            masks.append(m | (eye & ~real[:, None]))
        m = torch.stack(masks)[:, None]
        if kind == "bool":
            return m
        if kind == "float":
            return torch.zeros(m.shape, dtype=dtype).masked_fill(~m, torch.finfo(dtype).min)
        raise ValueError(f"mask kind must be 'bool' or 'float', got {kind!r}")


def _selected_leaves(tree: TrajectoryTree, nodes: set[int]) -> list[int]:
    """Leaves of the sub-tree induced by `nodes`, in depth-first order (siblings adjacent)."""
    out, stack = [], [ROOT]
    while stack:
        nid = stack.pop()
        kids = [c for c in tree.children(nid) if c in nodes]
        if nid != ROOT and not kids:
            out.append(nid)
        stack.extend(reversed(kids))
    return out


def linear_cost(config: Any) -> float:
    """α: a token's per-layer projection + MLP FLOPs over the attention FLOPs of one
    (query, key) pair, for a Llama/Qwen-style config. With a dense tree mask a row of
    L tokens costs ∝ α·L + L² (attention kernels with an arbitrary mask do not skip
    masked pairs), so packing pays only while the shared prefix saves more linear
    work than the longer row adds in attention: α ≈ 960 for the 'tiny' preset,
    ≈ 23,500 for Qwen3-8B (packing up to the token budget is then always worth it)."""
    d, ff = config.hidden_size, config.intermediate_size
    h = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or d // h
    kv = getattr(config, "num_key_value_heads", None) or h
    return (d * hd * (2 * h + 2 * kv) + 3 * d * ff) / (2 * h * hd)


def pack_trees(
    trees: Sequence[TrajectoryTree],
    selections: Sequence[PathSelection] | None = None,
    max_tokens: int | None = None,
    alpha: float | None = None,
) -> list[PackedRow]:
    """Lay the selected paths of `trees` into rows (greedy, depth-first path order).

    Args:
        trees: trees to pack, in order.
        selections: per tree, the paths to train (`rollout.tree.select_paths`);
            None: every path (`all_paths`). Nodes off the selected paths are not packed.
        max_tokens: soft row budget; a new row starts when the next path's new
            nodes would overflow it (a single path longer than the budget gets a
            row of its own). None: no budget. 1: every path its own row.
        alpha: optional cost model (`linear_cost`): a path joins the current row
            only if that costs less than a row of its own, with a row of L tokens
            costing α·L + L². None: fill rows up to the budget.

    Returns:
        rows in which every selected node's trainable tokens carry loss exactly once.
    """
    sels = selections if selections is not None else [all_paths(t) for t in trees]
    if len(sels) != len(trees):
        raise ValueError(f"{len(sels)} selections for {len(trees)} trees")
    rows, cur, trained = [], PackedRow(), set()
    for ti, (tree, sel) in enumerate(zip(trees, sels)):
        for leaf in _selected_leaves(tree, sel.nodes):
            path = tree.path(leaf)
            new = [n for n in path if (ti, n) not in cur._index]
            cost = sum(len(tree.nodes[n].tokens) for n in new)
            own = sum(len(tree.nodes[n].tokens) for n in path)
            over = max_tokens is not None and cur.n_tokens + cost > max_tokens
            dearer = (
                alpha is not None and alpha * cost + (cur.n_tokens + cost) ** 2 - cur.n_tokens**2 > alpha * own + own**2
            )
            if cur.segments and (over or dearer):
                rows.append(cur)
                cur, new = PackedRow(), path
                cost = sum(len(tree.nodes[n].tokens) for n in new)
            for n in new:
                parent = tree.nodes[n].parent
                seg = Segment(ti, n, cur._index[(ti, parent)] if parent != ROOT else -1, (ti, n) not in trained)
                trained.add((ti, n))
                cur._index[(ti, n)] = len(cur.segments)
                cur.segments.append(seg)
            cur.n_tokens += cost
    if cur.segments:
        rows.append(cur)
    return rows


def collate(trees: Sequence[TrajectoryTree], rows: Sequence[PackedRow], pad_id: int = 0) -> PackedBatch:
    """Tensors for `rows` (right-padded to the longest), targets in row order."""
    if not rows:
        raise ValueError("nothing to collate: no rows")
    width = max(r.n_tokens for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    seg_ids = torch.full((len(rows), width), -1, dtype=torch.long)
    ancestors = []
    cols: dict[str, list] = {
        k: [] for k in ("pred_row", "pred_pos", "targets", "tree", "node", "offset", "gen_call", "lp")
    }
    for r, row in enumerate(rows):
        start, depth, p = [], [], 0
        n_seg = len(row.segments)
        anc = torch.eye(n_seg, dtype=torch.bool)
        for s, seg in enumerate(row.segments):
            node = trees[seg.tree].nodes[seg.node]
            n = len(node.tokens)
            d0 = (
                depth[seg.parent] + len(trees[seg.tree].nodes[row.segments[seg.parent].node].tokens)
                if seg.parent >= 0
                else 0
            )
            if seg.parent >= 0:
                anc[s] |= anc[seg.parent]
            start.append(p)
            depth.append(d0)
            ids[r, p : p + n] = torch.tensor(node.tokens)
            pos[r, p : p + n] = torch.arange(d0, d0 + n)
            seg_ids[r, p : p + n] = s
            if seg.train:
                for off, g in enumerate(node.gen_call):
                    if g < 0:
                        continue
                    if off > 0:
                        pred = p + off - 1
                    elif seg.parent >= 0:
                        pred = start[seg.parent] + len(trees[seg.tree].nodes[row.segments[seg.parent].node].tokens) - 1
                    else:  # cannot happen: a call has >= 1 prompt token
                        raise ValueError(f"tree {seg.tree} node {seg.node}: a trainable token without context")
                    # one target per call that generated this token here (the position runs once)
                    for call, lp in [(g, node.logprobs[off]), *node.claims.get(off, ())]:
                        cols["pred_row"].append(r)
                        cols["pred_pos"].append(pred)
                        cols["targets"].append(node.tokens[off])
                        cols["tree"].append(seg.tree)
                        cols["node"].append(seg.node)
                        cols["offset"].append(off)
                        cols["gen_call"].append(call)
                        cols["lp"].append(lp)
            p += n
        ancestors.append(anc)
    long = {k: torch.tensor(v, dtype=torch.long) for k, v in cols.items() if k != "lp"}
    return PackedBatch(
        ids,
        pos,
        seg_ids,
        ancestors,
        long["pred_row"],
        long["pred_pos"],
        long["targets"],
        long["tree"],
        long["node"],
        long["offset"],
        long["gen_call"],
        torch.tensor(cols["lp"], dtype=torch.float32),
    )


def _mask_for(model: Any, batch: PackedBatch) -> torch.Tensor:
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    dtype = next(model.parameters()).dtype
    if impl == "sdpa":
        return batch.attention_mask("bool")
    if impl == "eager":
        return batch.attention_mask("float", dtype)
    raise ValueError(f"tree packing needs 'sdpa' or 'eager' attention (an arbitrary 4D mask); the model uses {impl!r}")


def target_logits(model: Any, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict each target token, from one forward pass over the packed rows.

    Only the K predicting positions go through the LM head (as
    `grpo.completion_logits`). Assumes logits = lm_head(last hidden state)
    (Qwen/Llama families).

    Returns:
        [K, V] float32 logits divided by `temperature`, differentiable.

    Raises:
        ValueError: a model with final logit soft-capping, or an attention
            kernel that takes no arbitrary mask.
    """
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("tree packing assumes logits = lm_head(hidden); this model soft-caps its logits")
    device = next(model.parameters()).device
    mask = _mask_for(model, batch).to(device)
    hidden = model.get_decoder()(
        input_ids=batch.input_ids.to(device),
        position_ids=batch.position_ids.to(device),
        attention_mask=mask,
        use_cache=False,
    ).last_hidden_state  # [B, L, H]
    h = hidden[batch.pred_row.to(device), batch.pred_pos.to(device)]  # [K, H]
    return model.get_output_embeddings()(h).float() / temperature


def target_logprobs(
    model: Any, batch: PackedBatch, temperature: float = 1.0, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the target tokens at a temperature.

    Args:
        model: a Hugging Face causal LM (SDPA or eager attention).
        batch: from `collate`.
        temperature: logits are divided by it (the behaviour log-prob contract).
        allowed: optional [K, V] bool; ids outside it get -inf before the
            softmax (vocabulary padding, grammar masks).

    Returns:
        (log π(target) [K], full log-softmax [K, V]), float32, differentiable.
    """
    logits = target_logits(model, batch, temperature)
    if allowed is not None:
        logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    tgt = batch.targets.to(logits.device)
    return logp_all.gather(-1, tgt[:, None]).squeeze(-1), logp_all


def packed_sft_loss(model: Any, batch: PackedBatch) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the batch's target tokens (the SFT
    completions, each position once) and the number of targets; the packed
    counterpart of `sft.completion_loss`."""
    logp, _ = target_logprobs(model, batch)
    return -logp.sum(), batch.n_targets


def packed_sft_micro(
    model: Any,
    rows: Sequence[tuple[list[int], int]],
    max_tokens: int | None,
    pad_id: int = 0,
    amp: Callable[[], AbstractContextManager] = nullcontext,
) -> Iterator[tuple[torch.Tensor, int]]:
    """SFT micro-batches of one step, tree-packed: yields (summed completion
    cross-entropy of one packed row, tokens the row ran); call ``.backward()`` on each.

    The step's rows (`sft.tokenize_examples`) become one tree (`sft_trees`), cut into
    rows of at most `max_tokens` (None: one row) where sharing pays (`linear_cost`).
    Every row's completion tokens are trained as unpacked rows train them: a position
    several rows share as completion (a row duplicated in the batch, completions that
    start alike) runs once and is one target per row (`rollout.tree.TreeNode.claims`).
    """
    tree = sft_trees(rows)
    for row in pack_trees([tree], max_tokens=max_tokens, alpha=linear_cost(model.config)):
        batch = collate([tree], [row], pad_id)
        with amp():
            loss, _ = packed_sft_loss(model, batch)
        yield loss, row.n_tokens


def sft_trees(rows: Sequence[tuple[list[int], int]], execution_id: str = "sft") -> TrajectoryTree:
    """SFT rows ``(input_ids, n_prompt)`` (`sft.tokenize_examples`) as one tree:
    examples sharing a prompt prefix (system prompt, episode history) share nodes."""
    tree = TrajectoryTree(execution_id)
    for i, (ids, n_prompt) in enumerate(rows):
        tree.add_call(ids[:n_prompt], ids[n_prompt:], None, call_id=f"{execution_id}#{i}")
    return tree
