"""`evoharness rl` on the runtime: real ALFWorld games, a real (micro) Qwen3 model in cell
processes, the schedulers driving them. The synchronous schedules must reproduce the
in-process run's episodes and updates, whatever cell served a call or trained a turn."""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time

from rl_cells import EXACT, assert_same_steps, assert_same_update, metrics, rl_config
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.recipes.rl import RLJob, train_rl


def _same_run(out, final, ref, model_dir):
    """`rl_reference`'s steps and update; each of the 2 x 4 episodes in the call trace once, its calls in order."""
    assert_same_steps(metrics(out), ref.metrics)
    assert_same_update(final, ref.weights, model_dir)
    assert (final / "experience.json").is_file() and (out / "report.md").is_file()
    # the call trace replays in the simulator
    from evoharness.runtime.workload import load_trace

    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    assert sorted(t["episode_id"] for t in trace) == sorted({t["episode_id"] for t in trace}) and len(trace) == 8
    assert all(a["end"] <= b["start"] for t in trace for a, b in zip(t["turns"], t["turns"][1:]))
    assert len(load_trace(out / "runtime" / "trace.jsonl")) == 8
    return json.loads((out / "runtime.json").read_text())


def test_one_cell_process_reproduces_the_inprocess_run(model_dir, tmp_path, rl_reference):
    out = tmp_path / "colocate"
    cfg = rl_config(model_dir, out, schedule="colocate", cells=1, backend="local")
    cfg.eval_every, cfg.eval_limit = 2, 2  # the periodic evaluation runs in the driver process
    final = train_rl(cfg, progress=False)
    rt = _same_run(out, final, rl_reference, model_dir)
    assert "eval/success" not in metrics(out)[0] and metrics(out)[1]["eval/n"] == 2
    assert rt["runtime/aborted_turns"] == 0 and rt["runtime/staleness_max"] == 0
    assert rt["runtime/micro_batches"] == 8  # one per execution, 2 steps x 4
    # the same command again resumes the finished job from its last checkpoint: nothing runs twice
    before = (out / "metrics.jsonl").read_text()
    train_rl(cfg, progress=False)
    assert (out / "metrics.jsonl").read_text() == before


JOB = """
import sys
from evoharness.config.rl import RLConfig
from evoharness.recipes.rl import train_rl
if __name__ == "__main__":
    train_rl(RLConfig.model_validate_json(open(sys.argv[1]).read()), progress=False)
"""


def test_sigkill_of_the_job_resumes_from_its_checkpoint(model_dir, tmp_path, rl_reference):
    """SIGKILL of the driver process (its cells exit with it) after step 1's checkpoint; the same
    command resumes: the metrics and the final weights are the uninterrupted run's (~15 s)."""
    import subprocess
    import sys

    out = tmp_path / "job"
    cfg = rl_config(model_dir, out, schedule="colocate", cells=2)
    cfg.ckpt_every = 1
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "cfg.json")],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.DEVNULL,
    )
    ckpt = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ckpt.exists() and len(metrics(out)) == 1  # killed in step 2
    final = train_rl(cfg, progress=False)
    rt = _same_run(out, final, rl_reference, model_dir)
    assert rt["runtime/aborted_turns"] == 0


def test_colocate_three_cells_all_reduce_the_same_update(model_dir, tmp_path, rl_reference):
    """colocate on 3 cells: the cells form a gloo group, each accumulates its own micro-batches'
    gradients and all-reduces them at the sync (no gradient files): the in-process episodes and
    update, whichever cell trained which execution (train.distributed; ~20 s)."""
    out = tmp_path / "colocate3"
    final = train_rl(rl_config(model_dir, out, schedule="colocate", cells=3), progress=False)
    rt = _same_run(out, final, rl_reference, model_dir)
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0
    assert not list((out / "runtime").glob("grads/v*/*.pt"))  # nothing went through files
    assert not (out / "runtime" / "dist").exists()  # the group met over TCP on the core's host: no rendezvous file


def test_elastic_three_cells_migrates_calls_and_trains_the_same_update(model_dir, tmp_path, rl_reference):
    """Cells switch roles mid-step; migrated calls are re-issued on another cell (6-20 s)."""
    out = tmp_path / "elastic"
    final = train_rl(rl_config(model_dir, out, schedule="elastic", cells=3), progress=False)
    rt = _same_run(out, final, rl_reference, model_dir)
    assert rt["runtime/switches"] > 0 and rt["runtime/aborted_turns"] == 0
    assert rt["runtime/staleness_max"] == 0


def test_killed_cell_mid_rollout_loses_nothing(model_dir, tmp_path, rl_reference):
    """SIGKILL of the rollout cell in step 1 (elastic-async, core cell 0 trains): its calls
    are re-issued on the replacement, and the run still plays and trains exactly the
    in-process episodes (~15 s)."""
    # elastic-async handles a lost cell; with η = 0 it plays the in-process batches in order
    # (capacity 4: with the rollout cell hosting fewer than a step's executions the scheduler deadlocks,
    # in the simulator too: `simulate` elastic-async, 2 cells, capacity 2, 2x2 executions)
    cfg = rl_config(model_dir, tmp_path, schedule="elastic-async", cells=2, staleness=0, capacity=4)
    job = RLJob(cfg)
    be, killed = job.backend, []

    def killer():
        while be.counts["calls"] < 5:
            time.sleep(0.005)
        killed.append(be.transport.pid(1))
        os.kill(killed[0], signal.SIGKILL)

    threading.Thread(target=killer, daemon=True).start()
    try:
        records = list(job.steps())
    finally:
        job.close()
    stats = job.driver.stats
    assert killed and stats.cells_lost == 1 and be.counts["cells_lost"] == 1
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0
    assert_same_steps(records, rl_reference.metrics)


def test_async_trains_within_the_staleness_bound(model_dir, tmp_path):
    """async, one train cell, η = 1: batch 2 rolls out on v0 while v1 trains; no sample older than η."""
    from evoharness.recipes.alfworld import train_grpo

    out = tmp_path / "async"
    cfg = rl_config(model_dir, out, steps=3, schedule="async", cells=2, staleness=1)
    assert train_grpo(cfg).off_policy == "decoupled"  # stale samples: decoupled PPO on the cells
    train_rl(cfg, progress=False)
    rt = json.loads((out / "runtime.json").read_text())
    # batch 2 is dispatched at once under v0 and trained on v1: off-policy, within η
    assert rt["runtime/staleness_max"] == 1 and rt["runtime/micro_batches"] == 12
    got = metrics(out)
    assert [m["policy_version"] for m in got] == [1, 2, 3]
    assert all(m["train/n_tokens"] > 0 and m["train/grad_norm"] > 0 for m in got)
    # the run's own trace, step by step, on a cluster fitted to its measurements (runtime.calibrate)
    from evoharness.runtime.calibrate import sim_config_from_run
    from evoharness.runtime.sim import simulate

    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    assert all(x["cell"] in (0, 1) for t in trace for x in t["turns"])  # the cell that answered each call
    sim_cfg = sim_config_from_run(out)
    assert 0 < sim_cfg.cluster.gen_concurrency_exponent <= 1  # fitted on each call's cell concurrency
    sim = simulate(sim_cfg, "async")
    assert sim.metrics["model_calls"] == sum(len(t["turns"]) for t in trace)
    assert sim.metrics["staleness_max"] == 1 and len(sim.step_end_s) == 3
    assert len(rt["calibration"]["micro_batches"]) == 12 and len(rt["calibration"]["sync_s"]) == 3
    res = CliRunner().invoke(app, ["simulate", "--workload", str(out / "runtime" / "sim.toml"), "--policies", "async"])
    assert res.exit_code == 0, res.output
    assert f"| async | {sim.wall_s / 3600:.2f} | {sim.wall_s / 3:.2f} |" in res.output


def test_step_cap_mix_plays_the_same_episodes_in_process_and_on_cells(model_dir, tmp_path):
    """step_caps gives each GRPO group its own T_max (a long-tail workload); the in-process
    runtime and the cells play the same capped episodes (~10 s)."""
    runs = {}
    for name, rt in (("inprocess", {}), ("colocate", {"schedule": "colocate", "cells": 1, "backend": "local"})):
        cfg = rl_config(model_dir, tmp_path / name, steps=1, **rt)
        cfg.step_caps, cfg.max_steps = [1, 5], 5
        train_rl(cfg, progress=False)
        runs[name] = metrics(tmp_path / name)[0]
    assert {k: runs["inprocess"][k] for k in EXACT} == {k: runs["colocate"][k] for k in EXACT}
    trace = [json.loads(ln) for ln in (tmp_path / "colocate" / "runtime" / "trace.jsonl").read_text().splitlines()]
    turns = sorted(len(t["turns"]) for t in trace)
    assert turns[:2] == [1, 1] and max(turns) > 1 and runs["colocate"]["steps_per_episode"] == sum(turns) / 4


def test_cli_schedule_flags_reach_the_config(model_dir, tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "rl",
            "--model-path",
            str(model_dir),
            "--out",
            str(tmp_path / "x"),
            "--schedule",
            "elastic",
            "--cells",
            "2",
            "--backend",
            "slurm",
        ],
    )
    assert res.exit_code != 0 and "runtime.backend" in res.output
    res = CliRunner().invoke(app, ["rl", "--model-path", str(model_dir), "--schedule", "streaming"])
    assert res.exit_code != 0 and "runtime.schedule" in res.output


def test_a_resumed_backend_replays_live_episodes_without_model_calls(model_dir, tmp_path):
    """A job checkpoint taken mid-rollout (as async schedules have at a weight sync): the
    live episodes are rebuilt from their recorded completions (same turns, same prompts),
    the experience store's pending writes are not doubled, and calls in flight are re-issued."""
    from evoharness.harness.bpe import ExperienceStore
    from evoharness.recipes.alfworld import AlfworldWorkload, PolicyCellFactory, shuffled_order, train_tasks
    from evoharness.recipes.rl import sim_config
    from evoharness.runtime.cell import ModelCell, WeightStore
    from evoharness.runtime.cell_backend import CellBackend, ModelTraining
    from evoharness.runtime.sim import build_scheduler
    from evoharness.runtime.transport import InProcessTransport

    cfg = rl_config(model_dir, tmp_path)
    cfg.max_steps = 12
    sim, tasks = sim_config(cfg), train_tasks(cfg)
    sched = build_scheduler("colocate", sim)
    make_worker = functools.partial(ModelCell, factory=PolicyCellFactory(cfg), weights=WeightStore(tmp_path / "w"))

    def backend(state=None):
        workload = AlfworldWorkload(cfg, tasks, shuffled_order(len(tasks), cfg.seed), ExperienceStore())
        return CellBackend(
            sim,
            sched.initial_roles(),
            InProcessTransport(),
            make_worker,
            workload,
            ModelTraining(),
            tmp_path / "rt",
            state=state,
        )

    be = backend()
    try:
        for c in sched.start():
            be.apply(c)
        while be.counts["calls"] < 14:
            for ev in be.poll(0.5):
                for c in sched.handle(ev):
                    be.apply(c)
        state = be.state()
        turns = {
            e: [(t.messages, t.completion, t.feedback, t.completion_token_ids) for t in lv.traj.turns]
            for e, lv in be.workload.live.items()
        }
    finally:
        be.close()
    assert turns and any(len(t) >= 2 for t in turns.values())
    in_flight = [e for e, x in state["x_state"].items() if x == "call"]
    be2 = backend(state)
    try:
        assert be2.counts["calls"] == be.counts["calls"] + len(in_flight)  # only the in-flight ones again
        store = be2.workload.store
        assert store.to_dict() == state["workload"]["store"]  # replay wrote nothing twice
        for e, want in turns.items():
            got = [
                (t.messages, t.completion, t.feedback, t.completion_token_ids) for t in be2.workload.live[e].traj.turns
            ]
            assert got == want
            assert be2.workload.live[e].harness.experience is store
    finally:
        be2.close()
