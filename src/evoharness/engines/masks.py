"""Grammar masks cached per grammar state.

`ActionGrammar.allowed` builds a full vocabulary mask in Python for every row
at every step. Yet the mask depends only on a small state: the next forced
token, the phase and whether the remaining budget still leaves room for free
text, or -- inside an action -- the trie node's children and flags. Requests of
one GRPO group share their admissible commands, and every request walks the
same ``<think>`` phase, so the same masks recur across rows and steps.
`MaskCache.bias` maps a grammar's state to a hashable key and keeps one
additive bias row per key (0 allowed, -inf not), computed on first sight by
`ActionGrammar.allowed` itself, so the masks are by construction the grammar's
(and the trainer's replay of it).
"""

from __future__ import annotations

import torch

from evoharness.engines.grammar import ACTION_CLOSE, ActionGrammar


def state_key(g: ActionGrammar, remaining: int, memo: dict[int, tuple]) -> tuple:
    """A hashable key such that equal keys give equal ``g.allowed(remaining)`` masks.

    Mirrors the branches of `ActionGrammar.allowed`. `memo` caches trie-node
    keys by ``id(node)``: valid while the grammars holding the nodes are alive.
    """
    if g.forced:
        return ("forced", g.forced[0])
    if g.phase == "think":
        return ("think", remaining > g.reserve)
    close = len(g.v.markers[ACTION_CLOSE])
    if g.node is None:
        return ("text", g.has_text, remaining > close if g.has_text else remaining <= close + 1)
    key = memo.get(id(g.node))
    if key is None:
        n = g.node
        key = memo[id(n)] = (
            "node",
            tuple(sorted(n.children)),
            n.meta_verb is not None,
            n.terminal or n.meta_verb in g.empty_arg_verbs,
        )
    return key


class MaskCache:
    """Additive bias rows [V] (fp32, 0 / -inf) per grammar state, shared across calls.

    Args:
        invalid: [V] bool, ids never produced (beyond the tokenizer); folded into every row.
        max_entries: the cache is cleared when it grows past this (distinct command sets).
    """

    def __init__(self, invalid: torch.Tensor, max_entries: int = 4096):
        self.invalid = invalid
        self.base = torch.zeros(invalid.shape, dtype=torch.float32, device=invalid.device).masked_fill_(
            invalid, float("-inf")
        )
        self.rows: dict[tuple, torch.Tensor] = {}
        self.max_entries = max_entries
        self.hits = self.misses = 0

    def bias(self, g: ActionGrammar, remaining: int, memo: dict[int, tuple]) -> torch.Tensor:
        """The bias row for grammar `g` now (`remaining` counts this step)."""
        key = state_key(g, remaining, memo)
        row = self.rows.get(key)
        if row is None:
            self.misses += 1
            if len(self.rows) >= self.max_entries:
                self.rows.clear()
            allowed = g.allowed(remaining) & ~self.invalid
            row = self.rows[key] = self.base.masked_fill(~allowed, float("-inf"))
        else:
            self.hits += 1
        return row
