"""The schedulers drive cells that hold a real (micro) Qwen3 model: decoding, gradients, the core's
optimizer step and versioned weights on disk. The cells are `runtime.cell.ModelCell`s with the
bare engine (`recipes.engine_cell.EngineCell`) playing the synthetic token agents of
tests/synthetic_agents.py (reward: the share of even token ids)."""

from __future__ import annotations

import time

import pytest
import torch
from micro_model import MICRO
from rl_cells import RAY_STALL_S
from synthetic_agents import KillOnCommand, token_backend

from evoharness.runtime.driver import Driver
from evoharness.runtime.sim import build_scheduler

CORPUS = [
    f"You are in the middle of a room. You see a {o} {i}. > go to {o} {i}\nYou arrive at {o} {i}. "
    f"> take {p} {i} from {o} {i}\nYou pick up the {p} {i}."
    for i in range(1, 12)
    for o in ("fridge", "cabinet", "drawer", "sinkbasin")
    for p in ("apple", "mug")
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from evoharness.models.init import init_model
    from evoharness.models.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("micro")
    tok = build_tokenizer(CORPUS, d, vocab_size=512)
    init_model(dict(MICRO, initializer_range=0.3), tok, d, seed=0)
    return d


def _exactly_once_per_step(be, cfg) -> None:
    """One optimizer step per RL step, each summing exactly that step's micro-batches (one per
    execution here), and every completion token of the step's executions trained once."""
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    recs = be.workload.records
    assert [r["step"] for r in recs] == list(range(1, cfg.steps + 1))
    assert [r["micro_batches"] for r in recs] == [n // cfg.steps] * cfg.steps
    assert [r["executions"] for r in recs] == [n // cfg.steps] * cfg.steps
    assert all(r["train/n_tokens"] == r["completion_tokens"] > 0 for r in recs)
    assert all(r["train/grad_norm"] > 0 for r in recs)


@pytest.mark.slow
def test_model_cells_train_exactly_once_with_versioned_weights(make_cfg, model_dir, tmp_path):
    """elastic-async on 3 cell processes (~30 s, most of it 3 processes importing torch at once)."""
    policy = "elastic-async"
    # 3 steps: with η = 1 batch 2 can only start after the first weight sync, so some calls run on trained weights
    cfg = make_cfg(steps=3, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler(policy, cfg)
    kept = tmp_path / "kept"
    be = token_backend(cfg, sched.initial_roles(), model_dir, tmp_path / "rt", keep_weights=kept)
    try:
        stats = Driver(sched, be, stall_s=120).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert sum(stats.staleness.values()) == n and stats.aborted_turns == 0
    assert max(stats.staleness) <= 1
    _exactly_once_per_step(be, cfg)
    assert all(len(r["ranks"]) == 1 and len(r["ranks"][0]) == 1 for r in be.workload.records)  # the core, once
    v = [kept / f"v{k}.safetensors" for k in (1, 2, 3)]
    assert all(p.is_file() for p in v)  # the core published every version
    assert len(set().union(*be.pids_seen.values())) == cfg.cluster.cells  # every cell its own process
    assert stats.switches > 0  # cells moved both ways, calls re-issued
    # behaviour log-probs recorded by the cells = a fresh forward pass with the weights of the recorded version
    from safetensors.torch import load_model as load_weights

    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.train.grpo import logprobs_of

    model = load_model(model_dir)
    versions = be.workload.turn_versions()
    x_rec = be.workload.x_rec
    assert max(max(vs) for vs in versions.values()) >= 1  # later turns ran on trained weights
    checked = 0
    for version in sorted({x for vs in versions.values() for x in vs}):
        if version:
            load_weights(model, str(kept / f"v{version}.safetensors"))
        recs = [r for e in sorted(x_rec) for r in x_rec[e] if r[3] == version and r[1]][:4]
        vocab = model.get_output_embeddings().weight.shape[0]
        allowed = torch.zeros(len(recs), max(len(r[1]) for r in recs), vocab, dtype=torch.bool)
        allowed[..., : len(load_tokenizer(model_dir))] = True  # ids >= len(tokenizer) are never sampled
        with torch.no_grad():
            lp = logprobs_of(model, [r[0] for r in recs], [r[1] for r in recs], allowed=allowed)
        for i, r in enumerate(recs):
            assert torch.allclose(lp[i, : len(r[1])], torch.tensor(r[2]), atol=1e-4)
            checked += 1
    assert checked >= 4
    # the run's call trace: every execution once, each call with its behaviour version
    import json

    trace = [json.loads(ln) for ln in (tmp_path / "rt" / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == n == len({t["episode_id"] for t in trace})
    assert sorted(t["turns"][0]["policy_version"] for t in trace) == sorted(vs[0] for vs in versions.values())


def test_gateway_drains_a_switched_rollout_cell_without_aborting_a_turn(make_cfg, model_dir, tmp_path):
    """Calls through the gateway (`runtime.via_gateway`): a group's calls are in flight on
    cell 0 when it switches to train. The drain holds them in the gateway, none is
    aborted, and when the scheduler binds the executions to cell 1 they are re-issued
    there and answered with the weights of version 0 (~15 s: 2 processes start)."""
    from evoharness.runtime.cells import Role
    from evoharness.runtime.events import Bind, Dispatch, ExecutionOrphaned, RoleSwitchDone, SwitchRole

    cfg = make_cfg(cluster={"cells": 2}, workload={"groups_per_step": 1})
    be = token_backend(cfg, [Role.ROLLOUT] * 2, model_dir, tmp_path, via_gateway=True)
    x_rec = be.workload.x_rec
    try:
        be.apply(Dispatch(0, 0))
        members = [ev.execution for ev in be.poll(1.0)]
        for e in members:
            be.apply(Bind(e, 0))
        while len(be._gw_jobs) < len(members):  # every call posted to cell 0, none answered yet
            be._pump()
        be.apply(SwitchRole(0, Role.TRAIN))
        events = be.poll(0.0)
        orphans = [ev for ev in events if isinstance(ev, ExecutionOrphaned)]
        assert sorted(o.execution for o in orphans) == members and not any(o.aborted for o in orphans)
        assert all(be.x_state[e] == "call" for e in members)  # held in the gateway, not aborted
        for e in members:
            be.apply(Bind(e, 1))
        deadline = time.monotonic() + 60
        while any(not x_rec.get(e) for e in members) and time.monotonic() < deadline:
            events += be.poll(0.5)
    finally:
        be.close()
    assert any(isinstance(ev, RoleSwitchDone) and ev.cell == 0 for ev in events)
    assert all(x_rec[e] and x_rec[e][0][3] == 0 for e in members)  # each first turn answered, on v0
    assert be.counts["aborted_turns"] == 0
    assert be.counts["reissued_calls"] == len(members) and be.counts["drains"] == 1
    assert be.counts["drain_s_max"] > 0


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_killed_train_cell_has_its_micro_batch_reclaimed(make_cfg, model_dir, tmp_path, request, backend):
    """elastic-async on 3 model cells (processes, or Ray actors on a local head); kill a satellite
    right after it is sent a micro-batch: the micro-batch is re-claimed by another train cell, its
    lost gradient is never summed, and each step's update sums exactly one micro-batch per
    execution (~20 s each)."""
    from evoharness.runtime.events import RunMicroBatch

    if backend == "ray":
        pytest.importorskip("ray")
        request.getfixturevalue("ray_head")
    cfg = make_cfg(steps=2, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = KillOnCommand(
        token_backend(cfg, sched.initial_roles(), model_dir, tmp_path, backend=backend),
        lambda c: isinstance(c, RunMicroBatch) and c.cell != 0,
    )
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert be.killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert stats.micro_batches_reclaimed >= 1 and stats.aborted_turns == 0
    assert sum(stats.staleness.values()) == n
    _exactly_once_per_step(be, cfg)


def test_engine_cell_answers_alike_alone_or_batched_and_resumes_from_its_save(model_dir, tmp_path):
    """`recipes.engine_cell.EngineCell` in this process: a call's completion depends on its own
    seed only (alone or batched with others, any max_new_tokens / temperature mix), its log-probs
    are the behaviour ones, and a cell built from `save`'s directory has the trained weights and
    the optimizer's state."""
    from synthetic_agents import token_grpo

    from evoharness.recipes.engine_cell import EngineCellFactory
    from evoharness.train.grpo import TurnSample
    from evoharness.train.step import streamed_rows

    make = EngineCellFactory(str(model_dir), token_grpo())
    cell = make(0, None)
    calls = [([5, 6, 7, 8], 6, 11, 1.0), ([9, 10, 11], 4, 12), ([5, 6, 7, 8], 6, 11, 0.0), ([40, 41], 6, 13, 1.0)]
    batched = cell.serve(calls, 3)
    alone = [cell.serve([c], 3)[0] for c in calls]
    for (ids, lps, v), (ids1, lps1, v1) in zip(batched, alone, strict=True):
        assert ids == ids1 and v == v1 == 3 and len(ids) == len(lps) > 0
        assert torch.allclose(torch.tensor(lps), torch.tensor(lps1), atol=1e-4)
    assert batched[0][0] != batched[2][0] or batched[0][1] != batched[2][1]  # sampled vs greedy
    rows = streamed_rows(
        [
            TurnSample(list(c[0]), ids, lps, 1.0 if k % 2 else -1.0, f"e{k}")
            for k, (c, (ids, lps, _)) in enumerate(zip(calls, batched))
        ],
        4,
    )
    w0 = {k: p.detach().clone() for k, p in cell.model.named_parameters()}
    assert cell.accumulate(rows)["n_tokens"] == sum(len(r.completion_ids) for r in rows)
    (upd,) = cell.step({"updates": [], "lr": 1e-2, "step": 0, "scale": 1.0})
    assert upd["grad_norm"] > 0
    assert any(not torch.equal(p, w0[k]) for k, p in cell.model.named_parameters())
    cell.save(str(tmp_path / "ckpt"), optimizer=True)
    again = make(0, str(tmp_path / "ckpt"))
    for (k, p), q in zip(cell.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q), k
    st, st1 = cell.trainer.state_dict()["state"], again.trainer.state_dict()["state"]
    assert st.keys() == st1.keys() and all(torch.equal(st[i]["exp_avg"], st1[i]["exp_avg"]) for i in st)
    assert again.serve(calls[:1], 1)[0][0] == cell.serve(calls[:1], 1)[0][0]
