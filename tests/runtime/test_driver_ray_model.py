"""`evoharness rl --backend ray`: the ALFWorld RL workload on Ray actors that hold a real (micro)
Qwen3 model, a local Ray head on 127.0.0.1 (runs when Ray is installed)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from rl_cells import RAY_STALL_S, assert_same_steps, assert_same_update, metrics, rl_config
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.recipes.rl import RLJob, train_rl

pytest.importorskip("ray")


def test_rl_on_ray_actors_trains_each_episode_once_as_the_inprocess_loop(model_dir, ray_head, tmp_path, rl_reference):
    """elastic on 3 Ray cell actors, 2 steps x 2 games x 2 samples, via the CLI: every
    episode is played and trained once, the weights move, and the steps equal the
    in-process loop's (same episodes, same update) (~20 s, mostly 3 actors importing torch)."""
    out = tmp_path / "ray"
    cfg = rl_config(model_dir, out)
    res = CliRunner().invoke(
        app,
        [
            "rl",
            "--model-path",
            str(model_dir),
            "--out",
            str(out),
            "--schedule",
            "elastic",
            "--cells",
            "3",
            "--backend",
            "ray",
            *[
                f"--set={k}={v}"
                for k, v in (
                    ("steps", cfg.steps),
                    ("max_steps", cfg.max_steps),
                    ("max_new_tokens", cfg.max_new_tokens),
                    ("max_prompt_tokens", 512),
                    ("decode_threads", 1),
                    ("seed", cfg.seed),
                    ("grpo.group_size", 2),
                    ("grpo.prompts_per_step", 2),
                    ("grpo.lr", 1e-3),
                    ("grpo.temperature", 1.0),
                    ("grpo.micro_batch_size", 8),
                )
            ],
        ],
    )
    assert res.exit_code == 0, res.output
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0 and rt["runtime/cells_lost"] == 0
    assert rt["runtime/switches"] > 0  # cells changed roles mid-run
    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    eids = [t["episode_id"] for t in trace]
    assert len(eids) == 8 == len(set(eids))  # 2 steps x 4 episodes, each once
    assert_same_steps(metrics(out), rl_reference.metrics)
    # the same two AdamW updates: the gradients are summed in another order (float32 noise, ~1e-3 of the step)
    assert_same_update(out / "final", rl_reference.weights, model_dir)


def test_a_killed_rollout_actor_mid_step_loses_nothing(model_dir, ray_head, tmp_path, rl_reference):
    """SIGKILL of the rollout cell's actor while it serves calls (`RLJob` on Ray, elastic-async,
    which replaces a lost cell): its calls are re-issued on the new actor, the step completes, and
    the run plays and trains exactly the in-process episodes (~20 s)."""
    job = RLJob(
        rl_config(
            model_dir,
            tmp_path,
            schedule="elastic-async",
            cells=2,
            staleness=0,
            capacity=4,
            backend="ray",
            stall_s=RAY_STALL_S,
        )
    )
    be, killed = job.backend, []

    def killer():  # kill cell 1 (a satellite) while calls run on it, after 5 calls
        while not killed:
            try:
                busy = any(j[0] == "call" and j[1] == 1 for j in list(be._jobs.values()))
            except RuntimeError:  # the driver thread changed the dict meanwhile
                busy = False
            if busy and be.counts["calls"] >= 5:
                os.kill(be.transport.pid(1), signal.SIGKILL)
                killed.append(1)
            time.sleep(0.002)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        records = list(job.steps())
    finally:
        job.close()
    t.join(timeout=1)
    stats = job.driver.stats
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0
    assert len(set().union(*be.pids_seen.values())) == 3  # the replacement is a new actor process
    assert_same_steps(records, rl_reference.metrics)


def test_a_killed_train_actor_has_its_micro_batch_reclaimed(model_dir, ray_head, tmp_path, make_cfg):
    """elastic-async on 3 Ray model cells with calls through the gateway; kill a satellite
    actor right after it is sent a micro-batch: the micro-batch is re-claimed, and each
    step's update sums exactly one micro-batch per execution (~15 s)."""
    from synthetic_agents import KillOnCommand, token_backend

    from evoharness.runtime.driver import Driver
    from evoharness.runtime.events import RunMicroBatch
    from evoharness.runtime.sim import build_scheduler

    cfg = make_cfg(steps=2, cluster={"cells": 3}, workload={"groups_per_step": 2}, policy={"staleness": 1})
    sched = build_scheduler("elastic-async", cfg)
    be = KillOnCommand(
        token_backend(cfg, sched.initial_roles(), model_dir, tmp_path, backend="ray", via_gateway=True),
        lambda c: isinstance(c, RunMicroBatch) and c.cell != 0,
    )
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    n = cfg.steps * cfg.workload.groups_per_step * cfg.workload.group_size
    assert be.killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert stats.micro_batches_reclaimed >= 1 and stats.aborted_turns == 0 == be.counts["aborted_turns"]
    assert sum(stats.staleness.values()) == n
    recs = be.workload.records
    assert [r["step"] for r in recs] == [1, 2]
    assert [r["micro_batches"] for r in recs] == [n // cfg.steps] * cfg.steps
    assert all(r["train/n_tokens"] == r["completion_tokens"] > 0 for r in recs)  # every token trained once


def test_colocate_on_ray_actors_all_reduces_to_the_inprocess_update(model_dir, ray_head, tmp_path, rl_reference):
    """colocate on 3 Ray actors that form a torch.distributed (gloo) group: each step's
    gradients are all-reduced in memory, never written, and the run equals the in-process
    loop (~20 s)."""
    out = tmp_path / "dp"
    train_rl(rl_config(model_dir, out, schedule="colocate", cells=3, backend="ray"), progress=False)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0
    assert not list((out / "runtime").glob("grads/**/*.pt"))  # no gradient files: all-reduced
    assert_same_steps(metrics(out), rl_reference.metrics)
    assert_same_update(out / "final", rl_reference.weights, model_dir)
