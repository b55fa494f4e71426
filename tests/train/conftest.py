"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest
from micro_model import build_micro_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A micro model whose tokenizer is trained on real BPE-harness prompts."""
    return build_micro_model_dir(tmp_path_factory.mktemp("micro"))
