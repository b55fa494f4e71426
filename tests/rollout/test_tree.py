"""Trajectory trees and dedup sampling on real chat-templated token ids: an agent
whose history grows, a context summary, a sub-agent, and a re-tokenised history."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.tokenizer import build_tokenizer
from evoharness.rollout.records import CallRecord
from evoharness.rollout.tree import ROOT, TrajectoryTree, select_paths, trees_from_records


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    corpus = []
    for task in discover_games("train")[:6]:
        env = make_env(task, engine="fast")
        h = BPEHarness(ExperienceStore())
        h.reset(task, env.reset())
        corpus += [m["content"] for m in h.messages()]
    return build_tokenizer(corpus, tmp_path_factory.mktemp("tok"), vocab_size=1024)


class Agent:
    """Records calls the way the gateway does: chat template applied, completion + <|im_end|>."""

    def __init__(self, tok, execution_id: str = "ex0"):
        self.tok, self.eid, self.records, self.t = tok, execution_id, [], 0.0

    def call(self, messages, answer: str, role: str = "main") -> str:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = self.tok(text, add_special_tokens=False)["input_ids"]
        comp = self.tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        self.t += 1.0
        n = len(self.records)
        self.records.append(
            CallRecord(
                execution_id=self.eid,
                call_id=f"chatcmpl-{self.eid}-{n}",
                role=role,
                model="m",
                prompt_token_ids=prompt,
                completion_token_ids=comp,
                logprobs=[-0.01 * (n + 1) - 0.001 * j for j in range(len(comp))],
                policy_version=3 + n % 2,
                finish_reason="stop",
                t_start=self.t,
                t_end=self.t + 0.5,
                constraint={"commands": ["look"], "meta_verbs": [], "max_new_tokens": 64} if n % 3 == 0 else None,
            )
        )
        return answer


SYS = "You are in a kitchen. Your task is to: put a clean mug in the coffeemachine."
SUB_SYS = "You are a search helper. Report where the object is."


def episode(tok, eid: str = "ex0") -> Agent:
    """Main agent with growing history, one sub-agent run, one summary, main continues on the summary."""
    a = Agent(tok, eid)
    msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": "You see a cabinet 1 and a fridge 1."}]
    for obs in ["You arrive at cabinet 1. It is closed.", "You open the cabinet 1. It is empty."]:
        ans = a.call(msgs, f"<think>look around</think><action>go to cabinet {len(msgs)}</action>")
        msgs += [{"role": "assistant", "content": ans}, {"role": "user", "content": obs}]
    sub = [{"role": "system", "content": SUB_SYS}, {"role": "user", "content": "find a mug"}]
    ans = a.call(sub, "<think>check the countertop</think><action>go to countertop 1</action>", role="subagent")
    a.call(
        sub + [{"role": "assistant", "content": ans}, {"role": "user", "content": "You see a mug 1."}],
        "The mug 1 is on countertop 1.",
        role="subagent",
    )
    summary = a.call(
        msgs + [{"role": "user", "content": "Summarise the episode so far."}],
        "Cabinet 1 is empty; the mug is on countertop 1.",
        role="summary",
    )
    msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": summary}]
    a.call(msgs, "<think>take the mug</think><action>go to countertop 1</action>")
    return a


def test_each_call_is_stored_once_and_reads_back_exactly(tok):
    a = episode(tok)
    tree = TrajectoryTree.from_records(a.records)
    assert len(tree.calls) == len(a.records) == 6
    for i, rec in enumerate(a.records):
        assert tree.call_sequence(i) == (rec.prompt_token_ids, rec.completion_token_ids)
        assert tree.calls[i].call_id == rec.call_id and tree.calls[i].role == rec.role
        assert tree.calls[i].policy_version == rec.policy_version
        assert tree.calls[i].constraint == rec.constraint
    # Only new suffixes are stored: the tree holds the distinct prefix-trie positions.
    distinct = {
        tuple(r.prompt_token_ids + r.completion_token_ids)[:k]
        for r in a.records
        for k in range(1, len(r.prompt_token_ids) + len(r.completion_token_ids) + 1)
    }
    assert tree.n_tokens == len(distinct) < tree.n_call_tokens()
    # Main call 2 extends call 1 (history re-rendered verbatim): call 1's end is inside call 2's path.
    assert tree.calls[0].node in tree.path(tree.calls[1].node)
    # Sub-agent runs in its own branch of the root (its system prompt differs after "<|im_start|>system\n").
    sub_path = tree.path(tree.calls[3].node)
    assert not set(sub_path[1:]) & set(tree.path(tree.calls[5].node))
    assert tree.nodes[ROOT].tokens == [] and all(tree.nodes[n].tokens for n in range(1, len(tree.nodes)))


def test_only_generated_tokens_are_trainable_with_their_behaviour_logprobs(tok):
    a = episode(tok)
    tree = TrajectoryTree.from_records(a.records)
    generated = 0
    for nid, node in enumerate(tree.nodes):
        d = tree.depth(nid) if nid else 0
        for off, g in enumerate(node.gen_call):
            if g < 0:
                assert node.logprobs[off] == 0.0
                continue
            call = tree.calls[g]
            pos = d + off - call.n_prompt  # index within the generating call's completion
            assert 0 <= pos < call.n_completion
            assert node.logprobs[off] == a.records[g].logprobs[pos]
            generated += 1
    # Every completion token is trainable exactly once: the answer of main call 1, re-rendered into
    # call 2's prompt verbatim, stays trainable (and keeps call 1's log-probs), not duplicated.
    assert generated == tree.n_trainable == sum(len(r.completion_token_ids) for r in a.records)
    # System/user/tool text is never trainable: the first call's prompt positions are all context.
    first = [t for n in tree.path(tree.calls[0].node) for t in tree.nodes[n].gen_call][: tree.calls[0].n_prompt]
    assert set(first) == {-1}


def test_retokenised_history_branches_and_is_context(tok):
    a = Agent(tok)
    msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": "go"}]
    a.call(msgs, "<action>open fridge 1</action>")
    # A harness that rewrites the answer before re-rendering it: the prompt no longer extends the call.
    a.call(
        msgs + [{"role": "assistant", "content": "<action>open  fridge 1</action>"}, {"role": "user", "content": "ok"}],
        "<action>look</action>",
    )
    tree = TrajectoryTree.from_records(a.records)
    assert tree.calls[0].node not in tree.path(tree.calls[1].node)
    assert len(tree.leaves()) == 2
    assert tree.n_trainable == sum(len(r.completion_token_ids) for r in a.records)


def test_rebuild_and_serialisation_round_trip(tok):
    a = episode(tok)
    tree = TrajectoryTree.from_records(a.records)
    shuffled = a.records[:]
    random.Random(0).shuffle(shuffled)
    reloaded = [CallRecord.from_dict(json.loads(json.dumps(r.to_dict()))) for r in shuffled]
    assert TrajectoryTree.from_records(reloaded) == tree  # rebuilt from its records (any order)
    again = TrajectoryTree.from_dict(json.loads(json.dumps(tree.to_dict())))
    assert again == tree
    assert again.leaves() == tree.leaves() and again.children(ROOT) == tree.children(ROOT)
    # the rebuilt index works: folding one more call into the reloaded tree equals folding it into the original
    extra = Agent(tok)
    extra.call(
        [{"role": "system", "content": SYS}, {"role": "user", "content": "You see a mug 1."}], "<action>x</action>"
    )
    r = extra.records[0]
    for t in (tree, again):
        t.add_call(r.prompt_token_ids, r.completion_token_ids, r.logprobs, call_id="late")
    assert again == tree


def test_records_of_many_executions_make_many_trees(tok):
    recs = episode(tok, "e1").records + episode(tok, "e2").records
    trees = trees_from_records(recs)
    assert list(trees) == ["e1", "e2"]
    assert trees["e1"].to_dict()["nodes"] == trees["e2"].to_dict()["nodes"]
    with pytest.raises(ValueError, match="2 executions"):
        TrajectoryTree.from_records(recs)


def test_bad_calls_are_refused():
    t = TrajectoryTree("x")
    with pytest.raises(ValueError, match="prompt token"):
        t.add_call([], [1, 2], [0.0, 0.0])
    with pytest.raises(ValueError, match="unknown role"):
        t.add_call([1], [2], [0.0], role="critic")
    with pytest.raises(ValueError, match="2 log-probs for 1"):
        t.add_call([1], [2], [0.0, 0.0])
    with pytest.raises(ValueError, match="no call records"):
        TrajectoryTree.from_records([])
    assert t == TrajectoryTree("x")  # nothing half-added
    bad = TrajectoryTree("y")
    bad.add_call([1, 2], [3])
    d = bad.to_dict()
    d["nodes"][1]["gen_call"].append(-1)
    with pytest.raises(ValueError, match="unequal length"):
        TrajectoryTree.from_dict(d)


# ---------------------------------------------------------------- dedup sampling


def _trained_positions(tree, sel):
    return [(n, off) for n in sel.nodes for off, g in enumerate(tree.nodes[n].gen_call) if g >= 0]


def test_dedup_never_trains_a_shared_prefix_twice(tok):
    tree = TrajectoryTree.from_records(episode(tok).records)
    for j_max in (1, 2, 3, None):
        for seed in range(20):
            sel = select_paths(tree, j_max, seed)
            pos = _trained_positions(tree, sel)
            assert len(pos) == len(set(pos)) == sel.n_tokens
            # every selected leaf added new tokens: no path is picked for nothing
            covered = set()
            for leaf in sel.leaves:
                new = set(tree.path(leaf)) - covered
                assert sum(tree.nodes[n].n_trainable for n in new) > 0
                covered |= new
            assert covered == sel.nodes
    full = select_paths(tree, None, 0)
    assert full.n_tokens == tree.n_trainable and len(full.leaves) == len(tree.leaves())


def test_j_max_priority_and_seeding(tok):
    tree = TrajectoryTree.from_records(episode(tok).records)
    roles = {leaf: tree.leaf_role(leaf) for leaf in tree.leaves()}
    # main: the pre-summary chain's leaf is the summary's, so main has the post-summary leaf only
    assert Counter(roles.values()) == {"main": 1, "summary": 1, "subagent": 1}
    order = []
    for j_max in (1, 2, 3):
        sel = select_paths(tree, j_max, seed=5)
        assert len(sel.leaves) == j_max
        order = [roles[leaf] for leaf in sel.leaves]
    assert order == ["main", "summary", "subagent"]
    assert select_paths(tree, 2, seed=9) == select_paths(tree, 2, seed=9)
    with pytest.raises(ValueError, match="j_max"):
        select_paths(tree, 0)


def test_draws_are_proportional_to_unmasked_tokens():
    tree = TrajectoryTree("p")
    tree.add_call([1, 2, 3], [4] * 30)  # leaf A: 30 trainable tokens
    tree.add_call([1, 2, 3], [5] * 10)  # leaf B: 10
    tree.add_call([1, 2, 3, 4], [6] * 10, role="summary")  # splits A's node: A keeps 29 below the split
    a_leaf, b_leaf = tree.calls[0].node, tree.calls[1].node
    counts = Counter(select_paths(tree, 1, seed=s).leaves[0] for s in range(4000))
    # weights: A's path 30 unmasked tokens, B's 10 -> 3:1 (summary leaf waits for main to be exhausted)
    assert set(counts) == {a_leaf, b_leaf}
    assert counts[a_leaf] / 4000 == pytest.approx(0.75, abs=0.03)
    # After A is picked, B still has 10 unmasked tokens; after B, A's path still has 30.
    sel = select_paths(tree, 3, seed=0)
    assert sel.n_tokens == 50 and tree.leaf_role(sel.leaves[-1]) == "summary"
