"""Helpers for the engine tests: ALFWorld-like chat prompts and admissible commands."""

from __future__ import annotations

from model_helpers import alfworld_corpus

SYSTEM = ("You are an agent in a household. Reply with <think>your reasoning</think> then "
          "<action>one admissible command</action>. Use track, commit, recall and note to manage your plan.")
COMMANDS = ["go to fridge 1", "go to cabinet 12", "go to countertop 2", "open fridge 1", "close fridge 1",
            "take apple 1 from countertop 2", "put apple 1 in/on fridge 1", "examine countertop 2",
            "look", "inventory"]



def chat_prompts(tokenizer, n: int, shared_system: bool) -> list[list[int]]:
    """`n` chat prompts of different lengths over real ALFWorld text, optionally behind one system message."""
    text = "\n".join(alfworld_corpus())
    out = []
    for i in range(n):
        user = text[997 * i: 997 * i + 60 + 90 * i]
        msgs = ([{"role": "system", "content": SYSTEM}] if shared_system else []) + [{"role": "user", "content": user}]
        out.append(tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                                    add_special_tokens=False))
    return out
