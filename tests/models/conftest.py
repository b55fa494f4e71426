"""Shared fixtures for model tests: a tokenizer trained on real ALFWorld text
(the ReAct prompts in ../shared/data) and a micro Qwen3 model directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import MICRO, alfworld_corpus

from evoharness.models.init import init_model
from evoharness.models.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(alfworld_corpus(), d, vocab_size=2048)
    return d


@pytest.fixture(scope="session")
def tokenizer(tok_dir):
    from evoharness.models.init import load_tokenizer

    return load_tokenizer(tok_dir)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A random micro model with sharper-than-default weights (init std 0.3), so
    greedy decoding produces varied tokens rather than one repeated id."""
    d = tmp_path_factory.mktemp("micro")
    init_model(dict(MICRO, initializer_range=0.3), tokenizer, d, seed=0)
    return d


@pytest.fixture(scope="session")
def model(model_dir):
    from evoharness.models.init import load_model

    return load_model(model_dir)


@pytest.fixture(autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: one thread avoids OpenMP spin-wait stalls
    yield
    torch.set_num_threads(prev)
