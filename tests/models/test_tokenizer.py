"""The locally trained byte-level BPE tokenizer and its chat template."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from evoharness.models.tokenizer import SPECIAL_TOKENS, train_tokenizer

from model_helpers import alfworld_corpus


def test_special_tokens_are_single_ids(tokenizer):
    for s in SPECIAL_TOKENS:
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
        "<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\nOBJECTIVE: x<|im_end|>\n")
    assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith(
        "<|im_end|>\n<|im_start|>assistant\n")
    full = msgs + [{"role": "assistant", "content": "<think>t</think><action>look</action>"}]
    assert tokenizer.apply_chat_template(full, tokenize=False).endswith(
        "<|im_start|>assistant\n<think>t</think><action>look</action><|im_end|>\n")


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
    tok = train_tokenizer(["<think>go left</think><action>go to fridge 1</action><|im_end|> the apple"] * 200,
                          vocab_size=400)
    assert not [k for k in tok.get_vocab() if ("think" in k or "action" in k or "im_" in k) and k not in SPECIAL_TOKENS]
