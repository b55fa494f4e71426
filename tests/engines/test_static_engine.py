"""`StaticEngine` against transformers' reference decoding and the shared contracts."""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import COMMANDS, chat_prompts, hf_greedy
from model_helpers import MICRO

from evoharness.engines import StaticEngine, make_engine
from evoharness.engines.grammar import ActionGrammar, GenRequest
from evoharness.engines.hf import Engine
from evoharness.engines.masks import MaskCache, state_key
from evoharness.harness.base import META_VERBS, parse_completion


def forward_logprobs(model, n_tok, prompt, completion, temperature, masks=None):
    """Teacher-forced fp32 log-probs of `completion`: log_softmax(logits / T) with ids >= n_tok
    (beyond the tokenizer) and grammar-disallowed ids (`masks` False) at -inf -- the trainer's number."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / (temperature if temperature > 0 else 1.0)
    logits[:, n_tok:] = float("-inf")
    if masks is not None:
        logits = logits.masked_fill(~masks, float("-inf"))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.parametrize("shared_system", [False, True])
def test_greedy_equals_hf_generate(model, tokenizer, shared_system):
    prompts = chat_prompts(tokenizer, 5, shared_system)
    eng = StaticEngine(model, tokenizer, stop_ids=[])
    got = [r.token_ids for r in eng.generate([GenRequest(p) for p in prompts], max_new_tokens=24)]
    assert got == hf_greedy(model, tokenizer, prompts, 24, [])
    assert len({tuple(g) for g in got}) == 5 and sum(len(set(g)) > 3 for g in got) >= 3  # not degenerate repeats


def test_chunked_prefill_pads_each_chunk_to_its_own_length(model, tokenizer):
    """Rows are prefilled in length-sorted chunks (here one or two rows each); results are unchanged."""
    prompts = chat_prompts(tokenizer, 5, True)[::-1]  # longest first: the engine sorts them
    eng = StaticEngine(model, tokenizer, stop_ids=[])
    eng.decoder.prefill_chunk_tokens = 2 * max(map(len, prompts)) - 40
    assert len(eng.decoder._chunks(sorted(len(p) - 40 for p in prompts))) >= 3
    got = eng.generate([GenRequest(p) for p in prompts], 12)
    assert [r.token_ids for r in got] == hf_greedy(model, tokenizer, prompts, 12, [])
    whole = StaticEngine(model, tokenizer, stop_ids=[]).generate([GenRequest(p) for p in prompts], 12)
    for a, b in zip(got, whole):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_group_prefixes_are_prefilled_once_with_unchanged_results(model, tokenizer):
    """GRPO-shaped batch: 2 games x 3 samples; a game's samples share a long prompt prefix (and two are
    identical). Each group prefix runs once; tokens equal HF generate, log-probs the ungrouped path."""
    from engine_helpers import SYSTEM
    from model_helpers import alfworld_corpus

    text = "\n".join(alfworld_corpus())
    prompts = []
    for game in range(2):
        for sample in range(3):
            user = text[2000 * game : 2000 * game + 400] + (
                " look" if sample == 2 else f" go to drawer {game + sample}"
            )
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
            prompts.append(
                tokenizer.encode(
                    tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False,
                )
            )
    eng = StaticEngine(model, tokenizer, stop_ids=[])
    shared = min(next(k for k, (a, b) in enumerate(zip(prompts[0], p)) if a != b) for p in prompts[3:])
    groups = eng.decoder._groups([p[shared:] for p in prompts], 32)
    assert sorted(sorted(rows) for rows, _ in groups) == [[0, 1, 2], [3, 4, 5]] and all(P > 60 for _, P in groups)
    got = eng.generate([GenRequest(p) for p in prompts], 12)
    assert [r.token_ids for r in got] == hf_greedy(model, tokenizer, prompts, 12, [])
    plain = StaticEngine(model, tokenizer, stop_ids=[])
    plain.decoder._groups = lambda rest, k: []
    for a, b in zip(got, plain.generate([GenRequest(p) for p in prompts], 12)):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_equals_hf_generate_other_architectures(tokenizer, arch):
    """Qwen2 (q/k/v biases, no q/k-norm) and Llama shapes run the same lean forward."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from evoharness.models.init import padded_vocab

    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    cfg = cfg_cls(
        vocab_size=padded_vocab(len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.3,
        tie_word_embeddings=False,
        **{k: v for k, v in MICRO.items()},
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    if arch == "qwen2":  # random biases, so the bias path is exercised
        with torch.no_grad():
            for lay in model.model.layers:
                lay.self_attn.q_proj.bias.normal_(0, 0.3)
                lay.self_attn.k_proj.bias.normal_(0, 0.3)
    prompts = chat_prompts(tokenizer, 4, True)
    got = [
        r.token_ids for r in StaticEngine(model, tokenizer, stop_ids=[]).generate([GenRequest(p) for p in prompts], 16)
    ]
    assert got == hf_greedy(model, tokenizer, prompts, 16, [])


def test_stop_tokens_end_rows_and_the_batch_compacts(model, tokenizer):
    prompts = chat_prompts(tokenizer, 6, True)
    free = StaticEngine(model, tokenizer, stop_ids=[]).generate([GenRequest(p) for p in prompts], 20)
    stops = [free[1].token_ids[3], free[4].token_ids[8]]  # rows 1 and 4 stop early: the batch is compacted
    got = StaticEngine(model, tokenizer, stop_ids=stops).generate([GenRequest(p) for p in prompts], 20)
    for r, f in zip(got, free):
        cut = next((k + 1 for k, t in enumerate(f.token_ids) if t in stops), 20)
        assert r.token_ids == f.token_ids[:cut]
        assert r.logprobs == pytest.approx(f.logprobs[:cut], abs=1e-5)
        assert r.finish_reason == ("stop" if f.token_ids[cut - 1] in stops else "length")
    assert len(got[1].token_ids) <= 4 and got[1].finish_reason == "stop"
    assert [r.token_ids for r in got] == hf_greedy(model, tokenizer, prompts, 20, stops)


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (0.0, 1.0), (1.3, 1.0)])
def test_logprobs_equal_the_trainers_recomputation(model, tokenizer, temperature, top_p):
    """Behaviour log-prob = log_softmax(logits / T) over producible ids (top-p not included);
    the importance ratio at policy version 0 is 1 within 1e-4."""
    prompts = chat_prompts(tokenizer, 4, True)
    res = StaticEngine(model, tokenizer, stop_ids=[]).generate(
        [GenRequest(p, seed=i) for i, p in enumerate(prompts)], 20, temperature=temperature, top_p=top_p
    )
    for p, r in zip(prompts, res):
        ref = forward_logprobs(model, len(tokenizer), p, r.token_ids, temperature)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4)
        assert torch.allclose(torch.exp(ref - torch.tensor(r.logprobs)), torch.ones(len(ref)), atol=1e-4)


def test_constrained_logprobs_include_the_grammar_mask(model, tokenizer):
    """Under constrained decoding the distribution is the grammar-masked one: replaying a fresh
    `ActionGrammar` over the completion rebuilds the masks, and a forced token has log-prob 0."""
    prompts = chat_prompts(tokenizer, 3, True)
    eng = StaticEngine(model, tokenizer)
    N, T = 40, 1.2
    res = eng.generate(
        [GenRequest(p, seed=s, grammar=eng.grammar(COMMANDS, META_VERBS)) for s, p in enumerate(prompts)],
        N,
        temperature=T,
    )
    for p, r in zip(prompts, res):
        g = ActionGrammar(eng.vocab, COMMANDS, META_VERBS)
        masks = []
        for step, t in enumerate(r.token_ids):
            masks.append(g.allowed(N - step))
            g.advance(t)
        masks = torch.stack(masks)
        ref = forward_logprobs(model, len(tokenizer), p, r.token_ids, T, masks)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4)
        forced = masks.sum(-1) == 1
        assert forced.any() and torch.tensor(r.logprobs)[forced].abs().max() < 1e-6


def test_seeded_sampling_does_not_depend_on_the_batch_and_matches_engine(model, tokenizer):
    prompts = chat_prompts(tokenizer, 4, True)
    eng = StaticEngine(model, tokenizer, stop_ids=[])
    kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.95)  # 24 > one 16-step noise chunk
    alone = eng.generate([GenRequest(prompts[2], seed=42)], **kw)[0]
    mixed = eng.generate(
        [GenRequest(prompts[0], seed=1), GenRequest(prompts[2], seed=42), GenRequest(prompts[3], seed=7)], **kw
    )[1]
    rev = eng.generate([GenRequest(p, seed=s) for p, s in zip(prompts[::-1], [9, 42, 3, 4])][::-1], **kw)
    assert alone.token_ids == mixed.token_ids == rev[2].token_ids
    assert eng.generate([GenRequest(prompts[2], seed=43)], **kw)[0].token_ids != alone.token_ids
    # the same random stream as the module-forward engine: the same samples
    old = Engine(model, tokenizer, stop_ids=[]).generate([GenRequest(prompts[2], seed=42)], **kw)[0]
    assert old.token_ids == alone.token_ids
    # a vanishing top_p keeps only the best token: sampling becomes greedy
    greedy = eng.generate([GenRequest(prompts[2])], 24)[0]
    assert (
        eng.generate([GenRequest(prompts[2], seed=5)], 24, temperature=1.0, top_p=1e-9)[0].token_ids == greedy.token_ids
    )


@pytest.mark.parametrize("kind", ["static", "hf"])
def test_constrained_decoding_always_yields_a_valid_action(model, tokenizer, kind):
    """On a random model every completion parses as an admissible command or a meta-action."""
    prompts = chat_prompts(tokenizer, 4, True)
    eng = make_engine(kind, model, tokenizer)
    kinds = set()
    for verbs in (META_VERBS, ()):
        for temp in (0.0, 1.5):
            reqs = [GenRequest(p, seed=s, grammar=eng.grammar(COMMANDS, verbs)) for s, p in enumerate(prompts * 3)]
            for r in eng.generate(reqs, max_new_tokens=40, temperature=temp):
                text = tokenizer.decode(r.token_ids, skip_special_tokens=False)
                parsed = parse_completion(text, COMMANDS, verbs)
                assert r.finish_reason == "stop" and text.startswith("<think>") and text.endswith("</action>"), text
                assert parsed.kind in ("env", "meta"), (text, parsed)
                kinds.add(parsed.kind)
                if parsed.kind == "meta":
                    assert parsed.command in verbs
    assert kinds == {"env", "meta"}
    if kind == "static":
        assert eng.masks.hits > 10 * eng.masks.misses  # masks recur across rows and steps


@pytest.mark.parametrize("kind", ["static", "hf"])
def test_constrained_decoding_fits_a_tight_budget(model, tokenizer, kind):
    prompt = chat_prompts(tokenizer, 1, True)[0]
    eng = make_engine(kind, model, tokenizer)
    budget = max(len(tokenizer.encode(c, add_special_tokens=False)) for c in COMMANDS) + 5  # markers + command
    reqs = [GenRequest(prompt, seed=s, grammar=eng.grammar(COMMANDS)) for s in range(6)]
    for r in eng.generate(reqs, budget, temperature=2.0):
        assert parse_completion(tokenizer.decode(r.token_ids, skip_special_tokens=False), COMMANDS).kind == "env"


def test_cached_grammar_masks_equal_the_grammars_own(model, tokenizer):
    """`state_key` must separate every state `ActionGrammar.allowed` distinguishes: random walks
    through the grammar compare each cached mask with a freshly built one."""
    eng = StaticEngine(model, tokenizer)
    cache, memo, rng = MaskCache(eng.masks.invalid), {}, random.Random(0)
    seen, alive = set(), []  # node keys are memoised by id(): valid while their grammars live
    for walk in range(60):
        g = eng.grammar(COMMANDS, META_VERBS if walk % 2 else ())
        alive.append(g)
        N = rng.choice([12, 20, 40])
        for step in range(N):
            if g.done:
                break
            want = g.allowed(N - step)
            got = cache.bias(g, N - step, memo) == 0
            assert torch.equal(got, want & ~eng.masks.invalid), (walk, step, state_key(g, N - step, memo))
            seen.add(state_key(g, N - step, memo)[0])
            g.advance(rng.choice(want.nonzero().flatten().tolist()))
    assert seen == {"forced", "think", "node", "text"}


def test_weight_sync_in_place_is_picked_up_tied_head_included(model, tokenizer):
    """New weights loaded into the model (an RL weight sync) reach the next call, the tied output
    head included: log-probs after the sync equal a forward pass of the new weights."""
    import copy

    m = copy.deepcopy(model)
    assert m.get_output_embeddings().weight is m.model.embed_tokens.weight  # tied
    eng = StaticEngine(m, tokenizer, stop_ids=[])
    prompt = chat_prompts(tokenizer, 1, True)[0]
    before = eng.generate([GenRequest(prompt)], 12)[0]
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in m.state_dict().items() if k != "lm_head.weight"}
    m.load_state_dict(new, strict=False)
    after = eng.generate([GenRequest(prompt)], 12)[0]
    ref = forward_logprobs(m, len(tokenizer), prompt, after.token_ids, 0.0)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=1e-4)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)


def test_make_engine_falls_back_for_unsupported_models(model, tokenizer):
    assert isinstance(make_engine("auto", model, tokenizer), StaticEngine)
    assert isinstance(make_engine("hf", model, tokenizer), Engine)
    from evoharness.models.init import init_model

    sliding = init_model(dict(MICRO, use_sliding_window=True, sliding_window=16, max_window_layers=0), tokenizer)
    assert isinstance(make_engine("auto", sliding, tokenizer), Engine)
    with pytest.raises(ValueError, match="sliding"):
        make_engine("static", sliding, tokenizer)
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("nope", model, tokenizer)
    with pytest.raises(ValueError, match="non-empty"):
        StaticEngine(model, tokenizer).generate([GenRequest([])])
