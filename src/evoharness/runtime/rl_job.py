"""``evoharness rl --schedule ...``: the RL job on the elastic runtime.

Build the runtime from the config (a scheduler from `runtime.schedulers`, an
`runtime.alfworld_backend.AlfworldBackend` of K cell processes), drive it
with `runtime.driver.Driver` until the last weight sync, write one metrics
record per step (``metrics.jsonl``, `train.rl`'s names), the run's runtime
measurements (``runtime.json``: wall time per step, idle ratio per role,
switches and their latency, aborted turns, staleness, cells lost) and the
final model, and the run's call trace (``runtime/trace.jsonl``, the
simulator's trace format: ``evoharness simulate --workload`` replays it).
``schedule = "inprocess"`` (the default) keeps `train.rl`'s
single-process loop.

A job checkpoint (``runtime/job.pkl``, `Driver`) is written at every weight
sync, after that step's metrics record; the same command on the same out_dir
resumes from it (metrics past it are dropped, so none is lost or repeated;
the core's optimizer state is kept per weights version). Episodes live at
that moment (async schedules) are rebuilt by replaying their recorded
completions; a step with none (colocate, elastic) resumes exactly.

Not yet here: the Ray backend for the model workload, and rollout calls
through the gateway (the driver process routes them).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from evoharness.config import Strict

if TYPE_CHECKING:
    from evoharness.runtime.workload import SimConfig
    from evoharness.train.rl import RLConfig


class RuntimeConfig(Strict):
    """Where the RL steps run (``RLConfig.runtime``; CLI ``--schedule/--cells/--backend``)."""

    schedule: Literal["inprocess", "colocate", "async", "elastic", "elastic-async"] = "inprocess"
    cells: int = Field(1, ge=1)
    backend: Literal["local", "ray"] = "local"
    # executions one rollout cell hosts at once (C_e); None: a step's executions spread over all cells
    capacity: int | None = Field(None, ge=1)
    staleness: int = Field(1, ge=0)          # η of async / elastic-async
    async_train_cells: int | None = Field(None, ge=1)
    stall_s: float = Field(900.0, gt=0)      # no event for this long: the run fails (a dead backend)


def sim_config(cfg: "RLConfig") -> "SimConfig":
    """The scheduler's view of `cfg`: P groups of G executions per step on K cells."""
    from evoharness.runtime.workload import SimConfig

    rt, g = cfg.runtime, cfg.grpo
    n = g.prompts_per_step * g.group_size
    return SimConfig.model_validate({
        "workload": {"groups_per_step": g.prompts_per_step, "group_size": g.group_size},
        "cluster": {"cells": rt.cells, "capacity": rt.capacity or math.ceil(n / rt.cells)},
        "policy": {"staleness": rt.staleness, "async_train_cells": rt.async_train_cells},
        "steps": cfg.steps, "seed": cfg.seed,
    })


def train_rl_runtime(cfg: "RLConfig", progress: bool = True) -> Path:
    """Run `cfg`'s RL on its runtime schedule; returns the final model directory.

    Raises:
        ValueError: an unsupported setting (Ray backend, a non-CPU device, an
            out_dir of an in-process run), or a bad task filter.
        runtime.driver.DriverError: the run stalled or broke an invariant.
    """
    import torch
    from safetensors.torch import load_model as load_weights
    from tqdm.auto import tqdm

    from evoharness.envs.alfworld.games import discover_games
    from evoharness.eval.run_report import write_rl_report
    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.runtime.alfworld_backend import AlfworldBackend
    from evoharness.runtime.driver import Driver
    from evoharness.runtime.sim import build_scheduler
    from evoharness.train.checkpoint import append_jsonl, atomic_dir, atomic_write_text
    from evoharness.train.precision import export_dtype, save_exported
    from evoharness.train.rl import load_experience_fresh, select_tasks

    rt = cfg.runtime
    if rt.backend != "local":
        raise ValueError("the RL workload runs on the local backend for now (runtime.backend = 'local')")
    if cfg.device != "cpu":
        raise ValueError("runtime cells run on CPU for now (device = 'cpu')")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    if (out / "checkpoints").exists():
        raise ValueError(f"{out} holds an in-process run (checkpoints/); give the runtime its own out_dir")
    job = out / "runtime" / "job.pkl"
    atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
    tasks = select_tasks(discover_games(cfg.split, cfg.data_path), cfg.task_types)
    order = list(range(len(tasks)))
    random.Random(cfg.seed).shuffle(order)           # the in-process loop's game order
    store = load_experience_fresh(cfg.harness.experience_path)
    sim = sim_config(cfg)
    sched = build_scheduler(rt.schedule, sim)
    bar = tqdm(total=cfg.steps, desc=f"rl[{rt.schedule}x{rt.cells}]", unit="step", disable=not progress)

    def on_step(rec: dict) -> None:
        append_jsonl(metrics_path, rec, step=rec["step"])
        bar.update(1)
        bar.set_postfix(success=f"{rec['success']:.2f}", reward=f"{rec['reward']:.2f}")

    def make_backend(sched, state=None) -> AlfworldBackend:
        roles = [c.role for c in sched.pool.cells] if state else sched.initial_roles()
        for path in (metrics_path, out / "runtime" / "trace.jsonl"):       # steps past the checkpoint redo
            _keep_steps(path, state["alf"]["newest"] if state else 0)
        bar.update(state["alf"]["newest"] if state else 0)
        return AlfworldBackend(sim, roles, cfg, tasks, order, store, str(out / "runtime"), on_step, state=state)

    if job.exists():
        driver = Driver.resume(job, make_backend, stall_s=rt.stall_s)
    else:
        driver = Driver(sched, make_backend(sched), stall_s=rt.stall_s, checkpoint=job)
    backend = driver.backend
    try:
        stats = driver.run()
        summary = {"schedule": rt.schedule, "cells": rt.cells, **stats.metrics(),
                   **{f"runtime/{k}": v for k, v in backend.idle().items()},
                   **{f"runtime/{k}": v for k, v in backend.counts.items()}}
    finally:
        backend.close()
        bar.close()
    atomic_write_text(out / "runtime.json", json.dumps(summary, indent=2))
    write_rl_report(out, metrics_path)

    def write_final(tmp: Path) -> None:
        model = load_model(cfg.model_path, "cpu", torch.float32)
        load_weights(model, str(out / "runtime" / "weights" / f"v{cfg.steps}.safetensors"))
        save_exported(model, tmp, export_dtype(cfg.model_path))
        load_tokenizer(cfg.model_path).save_pretrained(str(tmp))
        backend.store.save(tmp / "experience.json")

    return atomic_dir(out / "final", write_final)


def _keep_steps(path: Path, steps: int) -> None:
    """Keep the JSONL records of steps 1..`steps` (their ``step`` field) of `path`
    (atomically; a torn last line goes too)."""
    from evoharness.train.checkpoint import atomic_write_text

    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step", 0) <= steps:
            keep.append(line + "\n")
    atomic_write_text(path, "".join(keep))
