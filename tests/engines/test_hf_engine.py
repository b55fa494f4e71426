"""The batched KV-cache engine against transformers' reference decoding."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import COMMANDS, chat_prompts, hf_greedy

from evoharness.engines.grammar import GenRequest
from evoharness.engines.hf import Engine
from evoharness.harness.base import META_VERBS


@pytest.mark.parametrize("shared_system", [False, True])
def test_greedy_equals_hf_generate(model, tokenizer, shared_system):
    prompts = chat_prompts(tokenizer, 4, shared_system)
    assert len({len(p) for p in prompts}) == 4
    eng = Engine(model, tokenizer, stop_ids=[])
    got = [r.token_ids for r in eng.generate([GenRequest(p) for p in prompts], max_new_tokens=24)]
    want = hf_greedy(model, tokenizer, prompts, 24, [])
    assert got == want
    assert len({tuple(g) for g in got}) > 1 and all(len(set(g)) > 3 for g in got)  # not a degenerate repeat


def test_stop_tokens_end_a_sequence_and_finished_rows_leave_the_batch(model, tokenizer):
    prompts = chat_prompts(tokenizer, 3, True)
    free = Engine(model, tokenizer, stop_ids=[]).generate([GenRequest(p) for p in prompts], 16)
    stop = free[1].token_ids[5]  # make row 1 stop at its 6th token
    eng = Engine(model, tokenizer, stop_ids=[stop])
    got = eng.generate([GenRequest(p) for p in prompts], 16)
    for r, f in zip(got, free):
        cut = next((k + 1 for k, t in enumerate(f.token_ids) if t == stop), 16)
        assert r.token_ids == f.token_ids[:cut]
        assert r.finish_reason == ("stop" if cut < 16 or f.token_ids[15] == stop else "length")
    assert got[1].finish_reason == "stop" and len(got[1].token_ids) <= 6
    assert [r.token_ids for r in got] == hf_greedy(model, tokenizer, prompts, 16, [stop])


def test_logprobs_match_a_full_forward_pass(model, tokenizer):
    """Behaviour log-probs = log_softmax(logits / T) of the sampled token over the ids the
    tokenizer can produce (the padding rows are -inf), before top-p, as a trainer recomputes them."""
    prompts = chat_prompts(tokenizer, 3, True)
    T = 0.7
    n = len(tokenizer)
    assert model.config.vocab_size > n  # padded embedding rows exist and must not count
    res = Engine(model, tokenizer, stop_ids=[]).generate(
        [GenRequest(p, seed=i) for i, p in enumerate(prompts)], 12, temperature=T, top_p=0.9
    )
    for p, r in zip(prompts, res):
        ids = torch.tensor([p + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float() / T
        logits[:, n:] = float("-inf")
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_constrained_logprobs_are_those_of_the_masked_distribution(model, tokenizer, temperature):
    """Under a grammar the recorded log-prob is log_softmax over the allowed ids (T = 0 counts as 1);
    `ActionGrammar.replay` rebuilds those masks from the recorded constraint."""
    from evoharness.engines.grammar import ActionGrammar

    prompts = chat_prompts(tokenizer, 3, True)
    eng = Engine(model, tokenizer)
    grammars = [eng.grammar(COMMANDS, META_VERBS) for _ in prompts]
    res = eng.generate(
        [GenRequest(p, seed=i, grammar=g) for i, (p, g) in enumerate(zip(prompts, grammars))],
        30,
        temperature=temperature,
    )
    T = temperature or 1.0
    for p, r, g in zip(prompts, res, grammars):
        constraint = g.constraint(30)
        assert constraint == {"commands": COMMANDS, "meta_verbs": list(META_VERBS), "max_new_tokens": 30}
        allowed = ActionGrammar.from_constraint(eng.vocab, constraint).replay(r.token_ids, 30)
        with torch.no_grad():
            logits = model(torch.tensor([p + r.token_ids])).logits[0, len(p) - 1 : -1].float() / T
        ref = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        ref = ref.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-5)
        forced = allowed.sum(-1) == 1
        assert forced[0] and bool((torch.tensor(r.logprobs)[forced] == 0).all())  # <think> is forced


def test_seeded_sampling_does_not_depend_on_batch_composition(model, tokenizer):
    prompts = chat_prompts(tokenizer, 4, True)
    eng = Engine(model, tokenizer, stop_ids=[])
    alone = eng.generate([GenRequest(prompts[2], seed=42)], 20, temperature=1.0, top_p=0.95)[0]
    mixed = eng.generate(
        [GenRequest(prompts[0], seed=1), GenRequest(prompts[2], seed=42), GenRequest(prompts[3], seed=7)],
        20,
        temperature=1.0,
        top_p=0.95,
    )[1]
    rev = eng.generate(
        [GenRequest(p, seed=s) for p, s in zip(prompts[::-1], [9, 42, 3, 4])][::-1], 20, temperature=1.0, top_p=0.95
    )
    # rev's request for prompts[2] has seed 42 too (index 1 of the reversed list)
    assert alone.token_ids == mixed.token_ids == rev[2].token_ids
    other = eng.generate([GenRequest(prompts[2], seed=43)], 20, temperature=1.0, top_p=0.95)[0]
    assert other.token_ids != alone.token_ids
    # a vanishing top_p keeps only the best token: sampling becomes greedy
    greedy = eng.generate([GenRequest(prompts[2])], 20)[0]
    assert (
        eng.generate([GenRequest(prompts[2], seed=5)], 20, temperature=1.0, top_p=1e-9)[0].token_ids == greedy.token_ids
    )


def test_grammar_needs_something_to_allow(model, tokenizer):
    eng = Engine(model, tokenizer)
    assert eng.grammar([], ()) is None
    g = eng.grammar(["look"], ())
    assert g is not None and not g.v.free[tokenizer.convert_tokens_to_ids("<action>")]
    assert not any("<" in tokenizer.decode([i]) for i in g.v.free.nonzero().flatten().tolist())
