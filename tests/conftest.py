"""Shared fixtures: real ALFWorld games from the bundled pack."""

from __future__ import annotations

import os

import pytest

# Tests must not depend on or write to the user's cache.
os.environ.setdefault("EVOHARNESS_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "test"))

from evoharness.envs.alfworld.games import TASK_TYPES, discover_games  # noqa: E402


@pytest.fixture(scope="session")
def valid_seen():
    return discover_games("valid_seen")


@pytest.fixture(scope="session")
def one_per_type(valid_seen):
    """The first valid_seen game of each task type (sorted by task id)."""
    return [next(t for t in valid_seen if t.task_type == tt) for tt in TASK_TYPES]
