"""Fixtures for the engine tests: a tokenizer trained on real ALFWorld text and
micro Qwen3 / Qwen2 / Llama models (2 layers, hidden 64, grouped-query attention)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_helpers import MICRO, alfworld_corpus  # noqa: E402

SYSTEM = ("You are an agent in a household. Reply with <think>your reasoning</think> then "
          "<action>one admissible command</action>. Use track, commit, recall and note to manage your plan.")
COMMANDS = ["go to fridge 1", "go to cabinet 12", "go to countertop 2", "open fridge 1", "close fridge 1",
            "take apple 1 from countertop 2", "put apple 1 in/on fridge 1", "examine countertop 2",
            "look", "inventory"]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from evoharness.models.init import load_tokenizer
    from evoharness.models.tokenizer import build_tokenizer
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(alfworld_corpus(), d, vocab_size=2048)
    return load_tokenizer(d)


@pytest.fixture(scope="session")
def model(tokenizer):
    """A random micro Qwen3 with sharp weights (init std 0.3): greedy decoding varies."""
    from evoharness.models.init import init_model
    return init_model(dict(MICRO, initializer_range=0.3), tokenizer, seed=0)


@pytest.fixture(autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


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
