"""Fixtures for the engine tests: a tokenizer trained on real ALFWorld text and
micro Qwen3 / Qwen2 / Llama models (2 layers, hidden 64, grouped-query attention)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_helpers import MICRO, alfworld_corpus  # noqa: E402


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
