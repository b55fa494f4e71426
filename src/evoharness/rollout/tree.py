"""Prefix-shared trajectory trees and role-priority bounded dedup sampling (QwenGyre §3).

One `TrajectoryTree` per execution. Each model call's token sequence
(``prompt ids + completion ids``, as the engine tokenised them) is
prefix-matched against the tree built so far and only the new suffix is stored,
as a node (a radix tree: a call that diverges or ends inside a node splits it).
Node 0 is a token-less virtual root; every other node holds ≥ 1 token.

Per token the tree keeps ``gen_call``: the index (in `TrajectoryTree.calls`) of
the call that *generated* it, or -1 when it is context (system, user, tool or
harness text, or an earlier answer re-tokenised differently). Only generated
tokens are trainable; each carries its behaviour log-prob and, through its call,
the policy version and role. A token that is prompt in one call and generated in
another is trainable (it was sampled at that position in that context). When
several calls generated the same token at the same position (an answer repeated
word for word, two answers that start alike) the tree stores the position once,
`gen_call` names the first call and ``claims`` keeps the later ones with their own
log-probs: each call's sample trains with its own advantage and weight, as its
turn row would (`train.packing` runs the position once and sums the claims).

The ALFWorld `Trajectory` is the special case where every turn is one call
(`from_trajectory`); its harness re-renders the prompt each turn, so turns share
the system prompt and diverge after it. A chat agent whose history grows gives a
chain; sub-agents and summaries give branches.

`select_paths` is QwenGyre's role-priority bounded dedup sampling: leaves are
ranked main > summary > subagent > subagent_summary; within the highest class that
still has a leaf with unmasked trainable tokens, one leaf is drawn with
probability proportional to those tokens, its root-to-leaf path is masked so a
shared prefix trains once, and this repeats up to ``j_max`` times.

Serialisation: `to_dict` is plain JSON (one tree per JSONL line) and
``from_dict(to_dict(t)) == t``; building again from the same records gives an
equal tree.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evoharness.rollout.records import AGENT_ROLES, CallRecord, Trajectory, TurnRecord

ROOT = 0
ROLE_RANK = {r: i for i, r in enumerate(AGENT_ROLES)}  # 0 = highest priority


@dataclass
class TreeNode:
    """A run of tokens shared by every call whose sequence passes through it.

    Attributes:
        parent: parent node id (-1 only for the virtual root).
        tokens: token ids, in order.
        gen_call: per token, the generating call's index or -1 (context).
        logprobs: per token, the behaviour log-prob (natural log) where
            ``gen_call >= 0``, else 0.0.
        ends: indices of the calls whose sequence ends exactly here.
        claims: token offset -> ``[(call, log-prob), ...]``: the later calls that also
            generated the token at that offset (the first is ``gen_call``).
    """

    parent: int
    tokens: list[int] = field(default_factory=list)
    gen_call: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    claims: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def n_trainable(self) -> int:
        return sum(g >= 0 for g in self.gen_call)


@dataclass
class TreeCall:
    """One model call folded into the tree.

    Attributes:
        call_id: the record's id (``chatcmpl-…``, or ``<episode>#t<turn>``).
        role: one of `records.AGENT_ROLES`.
        policy_version: version of the weights that answered.
        node: the node its sequence ends at (the last node of its path).
        n_prompt / n_completion: token counts; the call's sequence is the first
            ``n_prompt + n_completion`` tokens of the root-to-``node`` path.
        constraint: the decoding constraint recorded with the turn (None:
            unconstrained; see the behaviour log-prob contract in grpo.py).
    """

    call_id: str
    role: str
    policy_version: int
    node: int
    n_prompt: int
    n_completion: int
    constraint: dict[str, Any] | None = None


@dataclass
class PathSelection:
    """The outcome of `select_paths` for one tree.

    Attributes:
        leaves: the selected leaves, in draw order.
        nodes: every node on a selected root-to-leaf path (root excluded).
        n_tokens: trainable tokens covered by `nodes` (each counted once).
    """

    leaves: list[int]
    nodes: set[int]
    n_tokens: int


@dataclass
class TrajectoryTree:
    """Prefix-shared token tree of one execution (see the module docstring).

    Attributes:
        execution_id: the execution (episode) it belongs to.
        nodes: node 0 is the virtual root; ids are creation order (a split
            inserts the new head node and the old id keeps the tail, so call
            references stay valid).
        calls: every call folded in, in build order.
    """

    execution_id: str
    nodes: list[TreeNode] = field(default_factory=lambda: [TreeNode(parent=-1)])
    calls: list[TreeCall] = field(default_factory=list)
    _children: dict[int, dict[int, int]] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------ building

    def add_call(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        call_id: str = "",
        role: str = "main",
        policy_version: int = 0,
        constraint: dict[str, Any] | None = None,
    ) -> int:
        """Fold one call into the tree; returns its index in `calls`.

        Args:
            prompt_ids: the prompt as the engine tokenised it (≥ 1 token).
            completion_ids: the generated ids (may be empty: nothing trainable).
            logprobs: behaviour log-prob per completion token (None: zeros, e.g. SFT).
            call_id / role / policy_version / constraint: stored in the `TreeCall`.

        Raises:
            ValueError: empty prompt, unknown role, log-probs of the wrong length.
        """
        if len(prompt_ids) == 0:
            raise ValueError(f"{self.execution_id}/{call_id}: a call needs at least one prompt token")
        if role not in ROLE_RANK:
            raise ValueError(f"{self.execution_id}/{call_id}: unknown role {role!r}; expected one of {AGENT_ROLES}")
        lp = [0.0] * len(completion_ids) if logprobs is None else [float(x) for x in logprobs]
        if len(lp) != len(completion_ids):
            raise ValueError(
                f"{self.execution_id}/{call_id}: {len(lp)} log-probs for {len(completion_ids)} completion tokens"
            )
        seq = list(map(int, prompt_ids)) + list(map(int, completion_ids))
        n_prompt, idx = len(prompt_ids), len(self.calls)
        path = self._insert(seq)  # [(node, start position of the node in seq)]
        for nid, start in path:
            node = self.nodes[nid]
            for off in range(max(0, n_prompt - start), len(node.tokens)):
                if node.gen_call[off] < 0:
                    node.gen_call[off] = idx
                    node.logprobs[off] = lp[start + off - n_prompt]
                else:
                    node.claims.setdefault(off, []).append((idx, lp[start + off - n_prompt]))
        end = path[-1][0]
        self.nodes[end].ends.append(idx)
        self.calls.append(TreeCall(call_id, role, int(policy_version), end, n_prompt, len(completion_ids), constraint))
        return idx

    def _insert(self, seq: list[int]) -> list[tuple[int, int]]:
        """Walk/extend the radix tree along `seq`; the walk ends on a node boundary."""
        children = self._child_index()
        cur, i, path = ROOT, 0, []
        while i < len(seq):
            child = children.setdefault(cur, {}).get(seq[i])
            if child is None:
                new = TreeNode(
                    parent=cur, tokens=seq[i:], gen_call=[-1] * (len(seq) - i), logprobs=[0.0] * (len(seq) - i)
                )
                self.nodes.append(new)
                children[cur][seq[i]] = len(self.nodes) - 1
                path.append((len(self.nodes) - 1, i))
                break
            toks = self.nodes[child].tokens
            k = _common_prefix(toks, seq, i)
            if k < len(toks):
                child = self._split(child, k)
            path.append((child, i))
            cur, i = child, i + k
        return path

    def _split(self, nid: int, k: int) -> int:
        """Split node `nid` after `k` tokens: a new head node takes ``tokens[:k]``;
        `nid` keeps the tail (so its calls and children stay attached). Returns the head."""
        node, children = self.nodes[nid], self._child_index()
        head = TreeNode(
            parent=node.parent,
            tokens=node.tokens[:k],
            gen_call=node.gen_call[:k],
            logprobs=node.logprobs[:k],
            claims={o: c for o, c in node.claims.items() if o < k},
        )
        self.nodes.append(head)
        hid = len(self.nodes) - 1
        node.tokens, node.gen_call, node.logprobs = node.tokens[k:], node.gen_call[k:], node.logprobs[k:]
        node.claims = {o - k: c for o, c in node.claims.items() if o >= k}
        node.parent = hid
        children[head.parent][head.tokens[0]] = hid
        children[hid] = {node.tokens[0]: nid}
        return hid

    def _child_index(self) -> dict[int, dict[int, int]]:
        if not self._children and len(self.nodes) > 1:
            for nid, node in enumerate(self.nodes[1:], 1):
                self._children.setdefault(node.parent, {})[node.tokens[0]] = nid
        return self._children

    @classmethod
    def from_records(cls, records: Iterable[CallRecord]) -> TrajectoryTree:
        """The tree of one execution's gateway records, folded in call order
        (``t_start``, then ``call_id``), so the input order does not matter.

        Raises:
            ValueError: no records, or records of several executions.
        """
        recs = sorted(records, key=lambda r: (r.t_start, r.call_id))
        if not recs:
            raise ValueError("no call records")
        ids = {r.execution_id for r in recs}
        if len(ids) > 1:
            raise ValueError(f"records of {len(ids)} executions given to one tree: {sorted(ids)[:5]}")
        tree = cls(recs[0].execution_id)
        for r in recs:
            tree.add_call(
                r.prompt_token_ids,
                r.completion_token_ids,
                r.logprobs,
                call_id=r.call_id,
                role=r.role,
                policy_version=r.policy_version,
                constraint=r.constraint,
            )
        return tree

    @classmethod
    def from_trajectory(cls, traj: Trajectory) -> TrajectoryTree:
        """An ALFWorld episode as a tree: turn t is call t (role ``main``, call id
        ``<episode_id>#t<turn>``). Turns without token ids (text-only policies) or
        with an empty prompt are skipped, as `train.step.turn_rows` skips them."""
        tree = cls(traj.episode_id)
        for t in traj.turns:
            if not has_tokens(t):
                continue
            tree.add_call(
                t.prompt_token_ids,
                t.completion_token_ids,
                t.logprobs,
                call_id=f"{traj.episode_id}#t{t.turn}",
                policy_version=t.policy_version or 0,
                constraint=t.constraint,
            )
        return tree

    # ------------------------------------------------------------ reading

    def children(self, nid: int) -> list[int]:
        """Child ids of `nid`, in creation order."""
        return sorted(self._child_index().get(nid, {}).values())

    def leaves(self) -> list[int]:
        """Nodes without children (every leaf ends at least one call), in id order."""
        idx = self._child_index()
        return [n for n in range(1, len(self.nodes)) if not idx.get(n)]

    def path(self, nid: int) -> list[int]:
        """Node ids from the root's child down to `nid`."""
        out = []
        while nid > ROOT:
            out.append(nid)
            nid = self.nodes[nid].parent
        return out[::-1]

    def depth(self, nid: int) -> int:
        """Position (0-based) of node `nid`'s first token in every sequence through it."""
        return sum(len(self.nodes[n].tokens) for n in self.path(nid)[:-1])

    def call_sequence(self, idx: int) -> tuple[list[int], list[int]]:
        """(prompt ids, completion ids) of call `idx`, read back from the tree."""
        call = self.calls[idx]
        seq = [t for n in self.path(call.node) for t in self.nodes[n].tokens]
        return seq[: call.n_prompt], seq[call.n_prompt : call.n_prompt + call.n_completion]

    def leaf_role(self, nid: int) -> str:
        """The highest-priority role among the calls ending at leaf `nid`."""
        return min((self.calls[c].role for c in self.nodes[nid].ends), key=ROLE_RANK.__getitem__)

    @property
    def n_tokens(self) -> int:
        """Distinct token positions stored (what a packed forward runs)."""
        return sum(len(n.tokens) for n in self.nodes)

    @property
    def n_trainable(self) -> int:
        return sum(n.n_trainable for n in self.nodes)

    def n_call_tokens(self) -> int:
        """Σ over calls of prompt + completion tokens (what separate rows run)."""
        return sum(c.n_prompt + c.n_completion for c in self.calls)

    # ------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "nodes": [
                {
                    "parent": n.parent,
                    "tokens": n.tokens,
                    "gen_call": n.gen_call,
                    "logprobs": n.logprobs,
                    "ends": n.ends,
                    **(
                        {"claims": [[o, [list(c) for c in cs]] for o, cs in sorted(n.claims.items())]}
                        if n.claims
                        else {}
                    ),
                }
                for n in self.nodes
            ],
            "calls": [vars(c).copy() for c in self.calls],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrajectoryTree:
        """Inverse of `to_dict`.

        Raises:
            ValueError: per-token arrays of unequal length, or a bad parent id.
        """
        nodes = [
            TreeNode(
                **{**n, "claims": {int(o): [(int(c), float(lp)) for c, lp in cs] for o, cs in n.get("claims", [])}}
            )
            for n in d["nodes"]
        ]
        for i, n in enumerate(nodes):
            if not len(n.tokens) == len(n.gen_call) == len(n.logprobs):
                raise ValueError(f"{d['execution_id']}: node {i} has per-token arrays of unequal length")
            if (i == ROOT) != (n.parent == -1) or n.parent >= len(nodes):
                raise ValueError(f"{d['execution_id']}: node {i} has parent {n.parent}")
        return cls(d["execution_id"], nodes, [TreeCall(**c) for c in d["calls"]])


def _common_prefix(toks: list[int], seq: list[int], i: int, chunk: int = 256) -> int:
    """Length of the common prefix of `toks` and ``seq[i:]`` (slice compares run in C)."""
    n = min(len(toks), len(seq) - i)
    k = 0
    while k < n:
        m = min(chunk, n - k)
        if toks[k : k + m] != seq[i + k : i + k + m]:
            break
        k += m
    else:
        return n
    while toks[k] == seq[i + k]:
        k += 1
    return k


def has_tokens(turn: TurnRecord) -> bool:
    """A turn that `TrajectoryTree.from_trajectory` folds in (it has a TITO record)."""
    return bool(turn.prompt_token_ids) and turn.completion_token_ids is not None and turn.logprobs is not None


def trees_from_records(records: Iterable[CallRecord]) -> dict[str, TrajectoryTree]:
    """One tree per execution id, in first-seen order."""
    by_exec: dict[str, list[CallRecord]] = {}
    for r in records:
        by_exec.setdefault(r.execution_id, []).append(r)
    return {eid: TrajectoryTree.from_records(recs) for eid, recs in by_exec.items()}


def select_paths(tree: TrajectoryTree, j_max: int | None = None, seed: int | str = 0) -> PathSelection:
    """Role-priority bounded dedup sampling (QwenGyre §3) of root-to-leaf paths.

    Repeat up to `j_max` times (None: until every trainable token is covered):
    among leaves whose path still has unmasked trainable tokens, keep those of
    the highest-priority role present (main > summary > subagent >
    subagent_summary), draw one with probability proportional to its unmasked
    trainable tokens, and mask every node on its root-to-leaf path. A shared
    prefix is therefore selected (and trained) at most once.

    Args:
        tree: the execution's tree.
        j_max: most paths per execution (≥ 1), or None for no cap.
        seed: the draw is a function of (seed, execution id) only.

    Raises:
        ValueError: ``j_max < 1``.
    """
    if j_max is not None and j_max < 1:
        raise ValueError(f"j_max must be >= 1 or None, got {j_max}")
    rng = random.Random(f"{seed}:{tree.execution_id}")
    paths = {leaf: tree.path(leaf) for leaf in tree.leaves()}
    roles = {leaf: ROLE_RANK[tree.leaf_role(leaf)] for leaf in paths}
    through: dict[int, list[int]] = {}  # node -> the leaves whose path holds it
    for leaf, p in paths.items():
        for n in p:
            through.setdefault(n, []).append(leaf)
    gain = {leaf: sum(tree.nodes[n].n_trainable for n in p) for leaf, p in paths.items()}
    masked: set[int] = set()
    chosen: list[int] = []
    n_tokens = 0
    while j_max is None or len(chosen) < j_max:
        live = [leaf for leaf, g in gain.items() if g > 0]
        if not live:
            break
        top = min(roles[leaf] for leaf in live)
        cands = [leaf for leaf in live if roles[leaf] == top]
        leaf = rng.choices(cands, weights=[gain[c] for c in cands])[0]
        chosen.append(leaf)
        n_tokens += gain[leaf]
        for n in paths[leaf]:
            if n not in masked:
                masked.add(n)
                c = tree.nodes[n].n_trainable
                for other in through[n]:
                    gain[other] -= c
    return PathSelection(chosen, masked, n_tokens)


def all_paths(tree: TrajectoryTree) -> PathSelection:
    """Every node (no dedup cap): what training on the whole tree covers."""
    nodes = set(range(1, len(tree.nodes)))
    return PathSelection(tree.leaves(), nodes, tree.n_trainable)
