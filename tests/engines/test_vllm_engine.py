"""`VLLMEngine` (vLLM in-process) against the shared contracts. Skipped without vllm;
`make test-vllm` (part of `make test`) runs it in the vLLM environment, .venv-vllm:

    .venv-vllm/bin/pytest -q tests/engines/test_vllm_engine.py

One engine is started for the module (~20-30 s, ~4 GB): the tests share it.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import COMMANDS, chat_prompts
from model_helpers import MICRO

from evoharness.engines.grammar import ActionGrammar, GenRequest
from evoharness.engines.static import StaticEngine
from evoharness.engines.vllm_engine import vllm_available
from evoharness.harness.base import META_VERBS, parse_completion

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vllm is not installed")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    from evoharness.models.init import init_model

    d = tmp_path_factory.mktemp("vllm_micro")
    # vLLM's CPU attention needs head_dim >= 32; tied embeddings (the weight-sync trap)
    init_model(dict(MICRO, head_dim=32, initializer_range=0.3), tokenizer, d, seed=0)
    return d


@pytest.fixture(scope="module")
def hf(model_dir):
    from evoharness.models.init import load_model

    return load_model(model_dir)


@pytest.fixture(scope="module")
def eng(model_dir):
    from evoharness.engines.vllm_engine import VLLMEngine

    e = VLLMEngine(model_dir, max_model_len=1024, max_num_seqs=16)
    yield e
    e.close()


def forward_logprobs(model, n_tok, prompt, completion, temperature, masks=None):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / (temperature if temperature > 0 else 1.0)
    logits[:, n_tok:] = float("-inf")
    if masks is not None:
        logits = logits.masked_fill(~masks, float("-inf"))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_greedy_equals_the_static_engine(eng, hf, tokenizer):
    prompts = chat_prompts(tokenizer, 4, True)
    got = eng.generate([GenRequest(p) for p in prompts], 16)
    want = StaticEngine(hf, tokenizer, stop_ids=sorted(eng.stop_ids)).generate([GenRequest(p) for p in prompts], 16)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_sampled_logprobs_equal_the_trainers_recomputation(eng, hf, tokenizer):
    prompts = chat_prompts(tokenizer, 3, True)
    T = 0.8
    res = eng.generate([GenRequest(p, seed=i) for i, p in enumerate(prompts)], 16, temperature=T)
    for p, r in zip(prompts, res):
        ref = forward_logprobs(hf, len(tokenizer), p, r.token_ids, T)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4), (r.logprobs, ref)


def test_seeded_sampling_does_not_depend_on_the_batch(eng, tokenizer):
    prompts = chat_prompts(tokenizer, 3, True)
    alone = eng.generate([GenRequest(prompts[1], seed=42)], 16, temperature=1.0)[0]
    mixed = eng.generate(
        [GenRequest(prompts[0], seed=1), GenRequest(prompts[1], seed=42), GenRequest(prompts[2], seed=3)],
        16,
        temperature=1.0,
    )[1]
    assert alone.token_ids == mixed.token_ids


def test_constrained_decoding_uses_the_trainers_grammar_masks(eng, hf, tokenizer):
    """Exact `ActionGrammar` masks: every output parses, and log-probs equal a forward pass under the
    replayed grammar's masks (a forced token has log-prob 0)."""
    prompts = chat_prompts(tokenizer, 3, True)
    N, T = 40, 1.3
    res = eng.generate(
        [GenRequest(p, seed=s, grammar=eng.grammar(COMMANDS, META_VERBS)) for s, p in enumerate(prompts * 2)],
        N,
        temperature=T,
    )
    from evoharness.engines.static import StaticEngine as _S

    vocab = _S(hf, tokenizer).vocab
    for p, r in zip(prompts * 2, res):
        text = tokenizer.decode(r.token_ids, skip_special_tokens=False)
        assert parse_completion(text, COMMANDS, META_VERBS).kind in ("env", "meta"), text
        g, masks = ActionGrammar(vocab, COMMANDS, META_VERBS), []
        for step, t in enumerate(r.token_ids):
            masks.append(g.allowed(N - step))
            g.advance(t)
        ref = forward_logprobs(hf, len(tokenizer), p, r.token_ids, T, torch.stack(masks))
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4)


def test_weight_sync_in_place_moves_logprobs_to_the_new_weights_tied_head_included(eng, hf, tokenizer):
    import copy

    new = copy.deepcopy(hf)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.2 * torch.randn_like(p))
    assert new.get_output_embeddings().weight is new.model.embed_tokens.weight
    prompt = chat_prompts(tokenizer, 1, True)[0]
    v0 = eng.policy_version
    assert eng.update_weights({k: v for k, v in new.state_dict().items() if k != "lm_head.weight"}) == v0 + 1
    r = eng.generate([GenRequest(prompt, seed=0)], 12, temperature=1.0)[0]
    ref = forward_logprobs(new, len(tokenizer), prompt, r.token_ids, 1.0)
    assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4), (r.logprobs, ref)
    eng.update_weights(hf.state_dict())  # back to the shared fixture's weights
