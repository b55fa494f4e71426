"""The locally trained byte-level BPE tokenizer and its chat template."""

from __future__ import annotations

import pytest
from model_helpers import alfworld_corpus
from transformers import AutoTokenizer

from evoharness.models.tokenizer import ADDED_TOKENS, MARKERS, SPECIAL_TOKENS, train_tokenizer


def test_added_tokens_are_single_ids(tokenizer):
    for s in ADDED_TOKENS:
        ids = tokenizer.encode(s, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == s
    text = "<think>the apple may be in the fridge</think><action>go to fridge 1</action><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    marks = [tokenizer.convert_tokens_to_ids(m) for m in ("<think>", "</think>", "<action>", "</action>", "<|im_end|>")]
    assert [i for i in ids if i in marks] == marks
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_matches_qwen_format(tokenizer):
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "OBJECTIVE: x"}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\nOBJECTIVE: x<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith(
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    full = msgs + [{"role": "assistant", "content": "<think>t</think><action>look</action>"}]
    assert tokenizer.apply_chat_template(full, tokenize=False).endswith(
        "<|im_start|>assistant\n<think>t</think><action>look</action><|im_end|>\n"
    )


def test_roundtrip_any_text_and_reload(tok_dir, tokenizer):
    text = "You arrive at cabinet 12. On it, you see a mug 3 — ünïcödé 🍎\n\tdone."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    again = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    assert again.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert again.chat_template == tokenizer.chat_template


def test_vocab_size_is_an_upper_bound_and_domain_words_merge():
    small = train_tokenizer(alfworld_corpus(), vocab_size=400)
    assert len(small) <= 400
    big = train_tokenizer(alfworld_corpus(), vocab_size=4096)
    assert 300 < len(big) <= 4096
    # domain words and receptacle numbers become single tokens
    assert len(big.encode(" fridge", add_special_tokens=False)) == 1
    assert len(big.encode(" 1", add_special_tokens=False)) == 1
    with pytest.raises(ValueError):
        train_tokenizer(["abc"], vocab_size=100)


def test_no_merges_are_spent_on_marker_text():
    tok = train_tokenizer(
        ["<think>go left</think><action>go to fridge 1</action><|im_end|> the apple"] * 200, vocab_size=400
    )
    assert not [k for k in tok.get_vocab() if ("think" in k or "action" in k or "im_" in k) and k not in ADDED_TOKENS]


# ---- issue 10 fault 10: what the project trains must round-trip through standard servers


def test_markers_are_added_but_not_special(tok_dir):
    """As Qwen3 keeps <think>: a server's decode(skip_special_tokens=True) keeps the harness tags."""
    served = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)  # what vLLM / SGLang load
    assert set(served.all_special_tokens) == set(SPECIAL_TOKENS)
    added = {t.content: t for t in served.added_tokens_decoder.values()}
    for m in MARKERS:
        assert m in added and not added[m].special
    text = "<think>the apple may be in the fridge</think><action>go to fridge 1</action>"
    ids = served.encode(text + "<|im_end|>", add_special_tokens=False)
    assert served.decode(ids, skip_special_tokens=True) == text  # eos dropped, tags kept


def _real_prompt(one_per_type):
    from evoharness.envs.alfworld import make_env
    from evoharness.harness.bpe import BPEHarness
    from evoharness.policies.base import PolicyRequest

    task = one_per_type[1]
    env = make_env(task, engine="fast")
    first = env.reset()
    h = BPEHarness()
    h.reset(task, first)
    cmd = next(c for c in h.admissible if c.startswith("go to "))
    p = h.parse(f"<think>search</think><action>{cmd}</action>")
    h.after_env_step(p, env.step(p.command))
    env.close()
    return PolicyRequest(h.messages(), "e#0", 1, list(h.admissible), harness=h)


def test_server_chat_template_gives_the_engine_prompt_ids(model_dir, one_per_type):
    """transformers' apply_chat_template from the saved directory (what a server runs) yields the
    same prompt ids as the project's engine path (LocalHFPolicy)."""
    from evoharness.policies.local import LocalHFPolicy

    req = _real_prompt(one_per_type)
    served = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    server_ids = served.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    pol = LocalHFPolicy(model_dir, max_prompt_tokens=1 << 16)
    assert pol._prompt_ids(req) == server_ids
    assert len(server_ids) > 300


def test_served_completion_parses_like_the_local_one(model_dir, one_per_type):
    """A constrained sample decoded the way a server does (skip_special_tokens=True) gives the
    same action; the engine still never samples a marker inside free text (they are added tokens)."""
    from evoharness.harness.base import parse_completion
    from evoharness.policies.local import LocalHFPolicy

    req = _real_prompt(one_per_type)
    pol = LocalHFPolicy(model_dir, temperature=1.0, max_new_tokens=48, constrained=True, seed=3)
    vocab = pol.engine.grammar(req.admissible_commands, req.harness.meta_verbs).v
    served = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    marker_ids = [served.convert_tokens_to_ids(m) for m in MARKERS]
    assert not vocab.free[marker_ids].any()
    for seed in range(4):
        pol.seed = seed
        c = pol.act([req])[0]
        assert c.error is None
        server_text = served.decode(c.completion_token_ids, skip_special_tokens=True)
        local, remote = (
            parse_completion(t, req.admissible_commands, req.harness.meta_verbs) for t in (c.text, server_text)
        )
        assert remote.kind != "invalid" and (remote.kind, remote.text) == (local.kind, local.text)
        assert server_text.startswith("<think>") and "</think><action>" in server_text
