"""Helpers for the engine tests: ALFWorld-like chat prompts and admissible commands."""

from __future__ import annotations

import torch
from model_helpers import alfworld_corpus

SYSTEM = (
    "You are an agent in a household. Reply with <think>your reasoning</think> then "
    "<action>one admissible command</action>. Use track, commit, recall and note to manage your plan."
)
COMMANDS = [
    "go to fridge 1",
    "go to cabinet 12",
    "go to countertop 2",
    "open fridge 1",
    "close fridge 1",
    "take apple 1 from countertop 2",
    "put apple 1 in/on fridge 1",
    "examine countertop 2",
    "look",
    "inventory",
]


def chat_prompts(tokenizer, n: int, shared_system: bool) -> list[list[int]]:
    """`n` chat prompts of different lengths over real ALFWorld text, optionally behind one system message."""
    text = "\n".join(alfworld_corpus())
    out = []
    for i in range(n):
        user = text[997 * i : 997 * i + 60 + 90 * i]
        msgs = ([{"role": "system", "content": SYSTEM}] if shared_system else []) + [{"role": "user", "content": user}]
        out.append(
            tokenizer.encode(
                tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )
        )
    return out


def hf_greedy(model, tokenizer, prompts, new, stop_ids):
    """Transformers `generate`, greedy, left-padded, ids >= len(tokenizer) suppressed; each row
    cut after its first stop id: the reference every engine's greedy output must equal."""
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding_side="left")
    sup = list(range(len(tokenizer), model.config.vocab_size)) or None
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=new,
            do_sample=False,
            suppress_tokens=sup,
            eos_token_id=stop_ids or None,
            pad_token_id=tokenizer.pad_token_id,
        )
    res = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in stop_ids), len(row))
        res.append(row[:cut])
    return res
