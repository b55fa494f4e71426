"""`evoharness rl --backend ray`: the ALFWorld RL workload on Ray actors that hold a real (micro)
Qwen3 model, a local Ray head on 127.0.0.1 (runs when Ray is installed)."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from micro_model import build_micro_model_dir
from safetensors.torch import load_file
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.train.rl import RLConfig, train_rl

ray = pytest.importorskip("ray")

# the in-process loop's per-step numbers a runtime run must reproduce exactly
EXACT = ("success", "reward", "steps_per_episode", "completion_tokens_per_episode", "policy_version",
         "train/n_tokens", "rollout/env_errors")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_micro_model_dir(tmp_path_factory.mktemp("micro"))


@pytest.fixture(scope="module")
def ray_head():
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(model_dir, out, **runtime) -> RLConfig:
    cfg = RLConfig(model_path=str(model_dir), out_dir=str(out), steps=2, max_steps=3, max_new_tokens=12,
                   max_prompt_tokens=512, decode_threads=1, seed=3)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
    cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
    for k, v in runtime.items():
        setattr(cfg.runtime, k, v)
    return cfg


def _metrics(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def inprocess(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("inprocess")
    train_rl(_cfg(model_dir, out), progress=False)
    return out


def test_rl_on_ray_actors_trains_each_episode_once_as_the_inprocess_loop(model_dir, ray_head, tmp_path, inprocess):
    """elastic on 3 Ray cell actors, 2 steps x 2 games x 2 samples, via the CLI: every
    episode is played and trained once, the weights move, and the steps equal the
    in-process loop's (same episodes, same update) (~20 s, mostly 3 actors importing torch)."""
    ref = inprocess
    out = tmp_path / "ray"
    cfg = _cfg(model_dir, out)
    res = CliRunner().invoke(app, ["rl", "--model-path", str(model_dir), "--out", str(out), "--schedule", "elastic",
                                   "--cells", "3", "--backend", "ray",
                                   *[f"--set={k}={v}" for k, v in (
                                       ("steps", cfg.steps), ("max_steps", cfg.max_steps),
                                       ("max_new_tokens", cfg.max_new_tokens), ("max_prompt_tokens", 512),
                                       ("decode_threads", 1), ("seed", cfg.seed), ("grpo.group_size", 2),
                                       ("grpo.prompts_per_step", 2), ("grpo.lr", 1e-3), ("grpo.temperature", 1.0),
                                       ("grpo.micro_batch_size", 8))]])
    assert res.exit_code == 0, res.output
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0 and rt["runtime/cells_lost"] == 0
    assert rt["runtime/switches"] > 0                                  # cells changed roles mid-run
    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    eids = [t["episode_id"] for t in trace]
    assert len(eids) == 8 == len(set(eids))                           # 2 steps x 4 episodes, each once
    got, want = _metrics(out), _metrics(ref)
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    w0 = load_file(str(model_dir / "model.safetensors"))
    w, w_ref = load_file(str(out / "final" / "model.safetensors")), load_file(str(ref / "final" / "model.safetensors"))
    moved = max(float((w[k] - w0[k]).abs().max()) for k in w0)
    assert moved > 0                                                    # the two updates changed the weights
    # the same two AdamW updates: the gradients are summed in another order (float32 noise, ~1e-3 of the step)
    assert all(float((w[k] - w_ref[k]).abs().max()) <= 1e-2 * moved for k in w_ref)


def test_a_killed_rollout_actor_mid_step_loses_nothing(model_dir, ray_head, tmp_path, inprocess):
    """Kill the rollout cell's actor while it serves calls (elastic-async, which replaces a
    lost cell): its calls are re-issued on the new actor, the step completes, and the run
    plays and trains exactly the in-process episodes (~20 s)."""
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.harness.bpe import ExperienceStore
    from evoharness.runtime.driver import Driver
    from evoharness.runtime.ray_backend import RayAlfworldBackend
    from evoharness.runtime.rl_job import sim_config
    from evoharness.runtime.sim import build_scheduler

    cfg = _cfg(model_dir, tmp_path, schedule="elastic-async", cells=2, staleness=0, capacity=4)
    tasks = discover_games("train")
    order = list(range(len(tasks)))
    random.Random(cfg.seed).shuffle(order)
    sim = sim_config(cfg)
    sched = build_scheduler("elastic-async", sim)
    be = RayAlfworldBackend(sim, sched.initial_roles(), cfg, tasks, order, ExperienceStore(), str(tmp_path / "rt"))
    killed = []

    def killer():      # kill cell 1 (a satellite) while calls run on it
        while not killed:
            try:
                busy = any(j[0] == "call" and j[1] == 1 for j in list(be._jobs.values()))
            except RuntimeError:                        # the driver thread changed the dict meanwhile
                busy = False
            if busy and be.counts["calls"] >= 5:
                be.kill_cell(1)
                killed.append(1)
            time.sleep(0.002)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        stats = Driver(sched, be, stall_s=120).run()
    finally:
        be.close()
    t.join(timeout=1)
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0
    got, want = be.records, _metrics(inprocess)
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}


def test_a_killed_train_actor_has_its_micro_batch_reclaimed(model_dir, ray_head, tmp_path, make_cfg):
    """elastic-async on 3 Ray model cells with calls through the gateway; kill a satellite
    actor right after it is sent a micro-batch: the micro-batch is re-claimed, and each
    step's update sums exactly one micro-batch per execution (~15 s)."""
    from evoharness.runtime.driver import Driver
    from evoharness.runtime.events import RunMicroBatch
    from evoharness.runtime.ray_backend import RayModelBackend
    from evoharness.runtime.sim import build_scheduler

    class Killer(RayModelBackend):
        killed: list = []

        def apply(self, c):
            super().apply(c)
            if not self.killed and isinstance(c, RunMicroBatch) and c.cell != 0:
                self.kill_cell(c.cell)
                self.killed = [c.cell]

    cfg = make_cfg(steps=2, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = Killer(cfg, sched.initial_roles(), model_dir, tmp_path, lr=1e-2, time_scale=1e-3, via_gateway=True)
    try:
        stats = Driver(sched, be, stall_s=120).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert be.killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert stats.micro_batches_reclaimed >= 1 and stats.aborted_turns == 0
    assert sum(stats.staleness.values()) == n
    assert [s["micro_batches"] for s in be.step_stats] == [n // cfg.steps] * cfg.steps


def test_colocate_on_ray_actors_all_reduces_to_the_inprocess_update(model_dir, ray_head, tmp_path, inprocess):
    """colocate on 3 Ray actors that form a torch.distributed (gloo) group: each step's
    gradients are all-reduced in memory, never written, and the run equals the in-process
    loop (~20 s)."""
    out = tmp_path / "dp"
    train_rl(_cfg(model_dir, out, schedule="colocate", cells=3, backend="ray"), progress=False)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0
    assert not list((out / "runtime").glob("grads/**/*.pt"))            # no gradient files: all-reduced
    got, want = _metrics(out), _metrics(inprocess)
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    w0, w = load_file(str(model_dir / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    w_ref = load_file(str(inprocess / "final" / "model.safetensors"))
    moved = max(float((w_ref[k] - w0[k]).abs().max()) for k in w0)
    assert all(float((w[k] - w_ref[k]).abs().max()) <= 1e-2 * moved for k in w_ref)
