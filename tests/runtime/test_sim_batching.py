"""Completion-order batches under a staleness bound (StalenessBatcher), driven by hand and at random."""

from __future__ import annotations

import random

import pytest

from evoharness.runtime.schedulers.batching import StalenessBatcher


def test_a_straggler_does_not_hold_up_its_batch():
    """η = 1, 2 units per batch: batch 0 takes the two units that finished
    first; the two version-0 stragglers are due at batch 1 and keep both its
    seats, so a fresher unit that finished earlier waits for batch 2."""
    b = StalenessBatcher(units_per_batch=2, eta=1)
    b.dispatched(0, 4)  # gate: (0 + η + 1) x 2 = 4 units under version 0
    for u in ("b", "c"):
        b.ready(0, u)
    assert b.take() == ["b", "c"] and b.full
    b.next_batch()
    b.dispatched(1, 2)  # gate now allows 6 in all
    b.ready(1, "e")
    assert b.take() == []  # both seats belong to version-0 units ("a", "d")
    b.ready(0, "a")
    assert b.take() == ["a"]
    b.ready(0, "d")
    assert b.take() == ["d"] and b.full
    b.next_batch()
    b.ready(1, "f")
    assert b.take() == ["e", "f"] and b.full  # oldest version first, then arrival
    b.next_batch()
    b.dispatched(0)  # a unit of version 0 at batch 3: the gate was ignored
    b.ready(0, "late")
    with pytest.raises(RuntimeError, match="staleness bound"):
        b.take()


def test_a_fresh_unit_takes_a_free_seat():
    """η = 1: with no version-0 unit left, a version-1 unit that finished
    first goes into batch 1 (completion order), ahead of its group mates."""
    b = StalenessBatcher(units_per_batch=2, eta=1)
    b.dispatched(0, 2)
    b.ready(0, "a")
    b.ready(0, "b")
    assert b.take() == ["a", "b"]
    b.next_batch()
    b.dispatched(1, 4)
    b.ready(1, "z")
    assert b.take() == ["z"]


def test_reservation_counts_units_not_yet_finished():
    """η = 2: taking fresh units into batch 1 must leave room in batches 1..2
    for every version-0 unit still running (greedy completion order would
    push 2 x B of them into batch 2)."""
    B = 2
    b = StalenessBatcher(B, eta=2)
    b.dispatched(0, 3 * B)
    b.ready(0, "x0")
    b.ready(0, "x1")
    assert b.take() == ["x0", "x1"]
    b.next_batch()
    b.dispatched(1, B)
    b.ready(1, "y0")
    b.ready(1, "y1")
    assert b.take() == []  # 4 version-0 units due by batch 2 need all 4 seats of batches 1-2
    with pytest.raises(RuntimeError, match="closed with"):
        b.next_batch()


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(5))
def test_random_runs_fill_every_batch_within_the_bound(eta, seed):
    """Random completion orders with AReaL's dispatch gate: every batch fills
    with exactly B units, each trained within η of its behaviour version."""
    rng = random.Random(seed)
    B, steps = 3, 8
    b = StalenessBatcher(B, eta)
    version, dispatched, running, trained = 0, 0, [], []
    while version < steps:
        while dispatched < min(steps * B, (version + eta + 1) * B):  # the gate
            running.append((version, dispatched))
            b.dispatched(version)
            dispatched += 1
        if running and rng.random() < 0.8:
            v, u = running.pop(rng.randrange(len(running)))  # finishes in random order
            b.ready(v, (v, u))
        for v, u in b.take():
            assert version - eta <= v <= version
            trained.append(u)
        if b.full:
            b.next_batch()
            version += 1
        elif not running:
            raise AssertionError(f"batch {version} cannot fill: nothing running, {b.waiting} waiting")
    assert sorted(trained) == list(range(steps * B))
