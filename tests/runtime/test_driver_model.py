"""The schedulers drive cell processes that hold a real (micro) Qwen3 model: decoding, gradients,
the core's optimizer step and versioned weights on disk."""

from __future__ import annotations

import time

import pytest
import torch
from micro_model import MICRO
from rl_cells import KillOnCommand, assert_micro_batch_reclaimed

from evoharness.runtime.driver import Driver
from evoharness.runtime.local_backend import LocalModelBackend
from evoharness.runtime.sim import build_scheduler

CORPUS = [f"You are in the middle of a room. You see a {o} {i}. > go to {o} {i}\nYou arrive at {o} {i}. "
          f"> take {p} {i} from {o} {i}\nYou pick up the {p} {i}."
          for i in range(1, 12) for o in ("fridge", "cabinet", "drawer", "sinkbasin") for p in ("apple", "mug")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from evoharness.models.init import init_model
    from evoharness.models.tokenizer import build_tokenizer
    d = tmp_path_factory.mktemp("micro")
    tok = build_tokenizer(CORPUS, d, vocab_size=512)
    init_model(dict(MICRO, initializer_range=0.3), tok, d, seed=0)
    return d


@pytest.mark.slow
def test_model_cells_train_exactly_once_with_versioned_weights(make_cfg, model_dir, tmp_path):
    """elastic-async on 3 cell processes (~30 s, most of it 3 processes importing torch at once)."""
    policy = "elastic-async"
    # 3 steps: with η = 1 batch 2 can only start after the first weight sync, so some calls run on trained weights
    cfg = make_cfg(steps=3, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler(policy, cfg)
    be = LocalModelBackend(cfg, sched.initial_roles(), model_dir, tmp_path, lr=1e-2, time_scale=1e-3)
    try:
        stats = Driver(sched, be, stall_s=120).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    assert max(stats.staleness) <= 1
    # one optimizer step per RL step, each summing exactly that step's micro-batches (one per execution)
    assert [s["micro_batches"] for s in be.step_stats] == [n // cfg.steps] * cfg.steps
    assert all(s["grad_norm"] > 0 for s in be.step_stats)
    v = [tmp_path / "weights" / f"v{k}.safetensors" for k in (1, 2, 3)]
    assert all(p.is_file() for p in v)
    assert len(set().union(*be.pids_seen.values())) == cfg.cluster.cells   # every cell its own process
    assert stats.switches > 0                                         # cells moved both ways, calls re-issued
    # behaviour log-probs recorded by the cells = a fresh forward pass with the weights of the recorded version
    from safetensors.torch import load_model as load_weights

    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.train.grpo import logprobs_of
    model = load_model(model_dir)
    versions = be.turn_versions()
    assert max(max(vs) for vs in versions.values()) >= 1          # later turns ran on trained weights
    checked = 0
    for version in sorted({x for vs in versions.values() for x in vs}):
        if version:
            load_weights(model, str(tmp_path / "weights" / f"v{version}.safetensors"))
        recs = [r for e in sorted(be.x_rec) for r in be.x_rec[e] if r[3] == version and r[1]][:4]
        vocab = model.get_output_embeddings().weight.shape[0]
        allowed = torch.zeros(len(recs), max(len(r[1]) for r in recs), vocab, dtype=torch.bool)
        allowed[..., :len(load_tokenizer(model_dir))] = True               # ids >= len(tokenizer) are never sampled
        with torch.no_grad():
            lp = logprobs_of(model, [r[0] for r in recs], [r[1] for r in recs], allowed=allowed)
        for i, r in enumerate(recs):
            assert torch.allclose(lp[i, :len(r[1])], torch.tensor(r[2]), atol=1e-4)
            checked += 1
    assert checked >= 4


def test_gateway_drains_a_switched_rollout_cell_without_aborting_a_turn(make_cfg, model_dir, tmp_path):
    """Calls through the gateway (`runtime.via_gateway`): a group's calls are in flight on
    cell 0 when it switches to train. The drain holds them in the gateway, none is
    aborted, and when the scheduler binds the executions to cell 1 they are re-issued
    there and answered with the weights of version 0 (~15 s: 2 processes start)."""
    from evoharness.runtime.cells import Role
    from evoharness.runtime.events import Bind, Dispatch, ExecutionOrphaned, RoleSwitchDone, SwitchRole

    cfg = make_cfg(cluster={"cells": 2}, workload={"groups_per_step": 1})
    be = LocalModelBackend(cfg, [Role.ROLLOUT] * 2, model_dir, tmp_path, time_scale=1e-3, via_gateway=True)
    try:
        be.apply(Dispatch(0, 0))
        members = [ev.execution for ev in be.poll(1.0)]
        for e in members:
            be.apply(Bind(e, 0))
        while len(be._gw_jobs) < len(members):     # every call posted to cell 0, none answered yet
            be._pump()
        be.apply(SwitchRole(0, Role.TRAIN))
        events = be.poll(0.0)
        orphans = [ev for ev in events if isinstance(ev, ExecutionOrphaned)]
        assert sorted(o.execution for o in orphans) == members and not any(o.aborted for o in orphans)
        assert all(be.x_state[e] == "call" for e in members)      # held in the gateway, not aborted
        for e in members:
            be.apply(Bind(e, 1))
        deadline = time.monotonic() + 60
        while any(not be.x_rec.get(e) for e in members) and time.monotonic() < deadline:
            events += be.poll(0.5)
    finally:
        be.close()
    assert any(isinstance(ev, RoleSwitchDone) and ev.cell == 0 for ev in events)
    assert all(be.x_rec[e] and be.x_rec[e][0][3] == 0 for e in members)   # each first turn answered, on v0
    assert be.counts["aborted_turns"] == 0
    assert be.counts["reissued_calls"] == len(members) and be.counts["drains"] == 1
    assert be.counts["drain_s_max"] > 0


class _Killer(KillOnCommand, LocalModelBackend):
    """SIGKILLs a cell's process right after the first command `kill_on` picks reaches it."""


def test_a_killed_train_cell_has_its_micro_batch_reclaimed(make_cfg, model_dir, tmp_path):
    """elastic-async on 3 model cells; SIGKILL a satellite right after it is sent a
    micro-batch: the micro-batch is re-claimed by another train cell, its lost gradient
    is never summed, and each step's update sums exactly one micro-batch per execution
    (~20 s; through the gateway on Ray actors: `test_driver_ray_model.py`)."""
    from evoharness.runtime.events import RunMicroBatch

    cfg = make_cfg(steps=2, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = _Killer(cfg, sched.initial_roles(), model_dir, tmp_path, lr=1e-2, time_scale=1e-3,
                 kill_on=lambda c: isinstance(c, RunMicroBatch) and c.cell != 0)
    try:
        stats = Driver(sched, be, stall_s=120).run()
    finally:
        be.close()
    assert_micro_batch_reclaimed(be, stats, cfg)
