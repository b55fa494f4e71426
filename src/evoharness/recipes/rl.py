"""Stage 2: GRPO with the EvoHarness reward on any schedule (EvoHarness-RL §4; QwenGyre §2-3).

`train_rl` is the whole loop: build the job from the config (resuming from ``out_dir``'s last
checkpoint), run its steps, write one metrics record per step and the checkpoints, then the
report and the final model. The job is one composition for every schedule and backend:

    scheduler   `runtime.schedulers` (colocate, async, elastic, elastic-async) over K cells
    transport   `runtime.transport`: the driver process itself (``runtime.backend = "inprocess"``,
                one cell), a process per cell (``local``) or a Ray actor per cell (``ray``)
    training    `runtime.cell_backend.ModelTraining`: the core alone (gradient files from other
                cells) or an all-reduce group of replicas (``runtime.trainer``)
    workload    the environment's recipe (`WORKLOADS`): its agents and its cells' parts

and every one of them runs the same RL step (`train.step`, `train.trainer`). In-process is the
one-cell colocate case of the same code.

A step commits in this order: append its metrics record, write the checkpoint (every
``ckpt_every`` steps and the last), move the ``latest`` pointer. A checkpoint
``checkpoints/step_N`` holds the core's weights (an HF directory) and ``trainer_state.pt``
(AdamW moments, RNG states), the experience store, ``state.json``, a copy of ``metrics.jsonl`` as
of step N and ``job.pkl`` (the scheduler, the driver's and the runtime's books: `Driver.save`).
After a kill at any point the same command resumes from the committed checkpoint, cells start
from its weights, and ``metrics.jsonl`` continues without gaps, duplicates or torn lines. A
finished run also writes ``runtime.json`` (the runtime's measurements), ``report.md`` and
``rl_curves.png``.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from evoharness.config.recipe import ModelRecipe, write_recipe
from evoharness.config.rl import RLConfig
from evoharness.config.sim import SimConfig
from evoharness.files import append_jsonl, atomic_dir, atomic_write_text, failpoint, truncate_jsonl
from evoharness.recipes.base import Recipe
from evoharness.recipes.vllm_cell import check_rollout_engine
from evoharness.runtime.cell import ModelCell, WeightStore
from evoharness.runtime.cell_backend import CellBackend, ModelTraining
from evoharness.runtime.cells import Role
from evoharness.runtime.driver import Driver
from evoharness.runtime.sim import build_scheduler
from evoharness.runtime.transport import make_transport
from evoharness.tracking import Tracker
from evoharness.train.checkpoint import check_resume_config, load_checkpoint, restore_metrics, snapshot_metrics


def _alfworld(cfg: RLConfig) -> Recipe:
    from evoharness.recipes.alfworld import alfworld_recipe

    return alfworld_recipe(cfg)


def _repo(cfg: RLConfig) -> Recipe:
    from evoharness.recipes.repo import repo_recipe

    return repo_recipe(cfg)


# ``RLConfig.env`` -> its recipe
WORKLOADS: dict[str, Callable[[RLConfig], Recipe]] = {"alfworld": _alfworld, "repo": _repo}


def sim_config(cfg: RLConfig) -> SimConfig:
    """The scheduler's view of `cfg`: P groups of G executions per step on K cells."""
    rt, g = cfg.runtime, cfg.grpo
    n = g.prompts_per_step * g.group_size
    return SimConfig.model_validate(
        {
            "workload": {"groups_per_step": g.prompts_per_step, "group_size": g.group_size},
            "cluster": {"cells": rt.cells, "capacity": rt.capacity or math.ceil(n / rt.cells)},
            "policy": {"staleness": rt.staleness, "async_train_cells": rt.async_train_cells},
            "steps": cfg.steps,
            "seed": cfg.seed,
        }
    )


class RLJob:
    """`cfg`'s RL run, resumed from ``out_dir``'s last checkpoint (module docstring).

    Attributes:
        step: the steps done (the weights version).

    Raises:
        ValueError: an out_dir holding another run's checkpoints (the differing settings named).
        RuntimeError: a cell did not start.
    """

    def __init__(self, cfg: RLConfig):
        self.cfg, rt = cfg, cfg.runtime
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.out = out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if any((out / "checkpoints").glob("step_*")):  # a resume continues the same run only
            check_resume_config(out / "rl_config.json", json.loads(cfg.model_dump_json()), RLConfig.RESUME_FREE)
        atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
        self.work = out / "runtime"
        found = load_checkpoint(out, _read_checkpoint)
        if cfg.runtime.trainer == "fsdp":  # before anything starts
            raise ValueError(
                "runtime.trainer = 'fsdp' is planned (`evoharness plan`) and trains in `evoharness sft` "
                "(shard.ranks), but rl's cells do not run FSDP ranks yet; use runtime.trainer = 'allreduce' or "
                "'single', or LoRA (lora.r > 0) for a model whose full optimizer state does not fit one device"
            )
        check_rollout_engine(cfg)  # before any cell starts: vllm importable, a setting it serves
        self.recipe = WORKLOADS[cfg.env](cfg)
        sim = sim_config(cfg)
        self.step, init_dir = 0, None
        if found:
            ckpt, (state, job) = found
            self.step, init_dir = state["step"], str(ckpt)
            restore_metrics(out / "metrics.jsonl", ckpt, self.step)
            truncate_jsonl(self.work / "trace.jsonl", self.step)  # steps past the checkpoint redo
        threads = cfg.threads if rt.backend == "inprocess" else 1

        def make_backend(sched: Any, state: dict[str, Any] | None = None) -> CellBackend:
            roles = [c.role for c in sched.pool.cells] if state else sched.initial_roles()
            mode = rt.resolved_trainer()
            fixed = sched.initial_roles()  # async: its train split; colocate: every cell trains
            members = (
                [c for c, r in enumerate(fixed) if r == Role.TRAIN] if rt.schedule == "async" else list(range(rt.cells))
            )
            gateway = None
            if rt.via_gateway:
                from evoharness.runtime.gateway_cells import CellGateway

                gateway = CellGateway(rt.cells, records=out / "gateway")
            transport = make_transport(rt.backend, rt.gpus_per_cell, address=rt.ray_address, num_cpus=rt.ray_num_cpus)
            # weights and gradients travel as the transport says: files here, Ray's object store on a cluster
            self.weights = WeightStore(self.work / "weights", transport.exchange(self.work / "weights"))
            make_worker = functools.partial(
                ModelCell, factory=self.recipe.cell(threads), weights=self.weights, version=self.step, init_dir=init_dir
            )
            return CellBackend(
                sim,
                roles,
                transport,
                make_worker,
                self.recipe.workload,
                ModelTraining(mode, members),
                self.work,
                gateway=gateway,
                state=state,
            )

        if found:
            self.driver = Driver.resume(job, make_backend, stall_s=rt.stall_s)
            self.driver.checkpoint = None  # `save` writes it, at ckpt_every
            # taken before the scheduler saw the step's weight sync: a run given more steps goes on
            self.driver.sched.steps = max(cfg.steps, self.step)
        else:
            sched = build_scheduler(rt.schedule, sim)
            self.driver = Driver(sched, make_backend(sched), stall_s=rt.stall_s)
        self.backend: CellBackend = self.driver.backend

    @property
    def store(self) -> Any:
        """The workload's experience store (None: an environment without one)."""
        return getattr(self.backend.workload, "store", None)

    def steps(self):
        """Each step's metrics record, as its weights become the policy's."""
        for version in self.driver.steps():
            rec = self.backend.records.pop()
            if rec["step"] != version:
                raise RuntimeError(f"weights v{version} synced without their step record (last: {rec['step']})")
            self.step = version
            yield rec

    def evaluate(self) -> dict[str, float]:
        """The recipe's periodic evaluation of the newest weights (published by the core)."""
        if self.recipe.evaluate is None:
            return {}
        self.backend.run_job(0, "publish", None)
        return self.recipe.evaluate(self.weights.path(self.step), self.step, self.store)

    def save(self, step: int) -> None:
        """Commit step `step`: the checkpoint written atomically (module docstring), then ``latest``."""
        ckpts = self.out / "checkpoints"

        def write(tmp: Path) -> None:
            self.backend.run_job(0, "save", {"dir": str(tmp), "optimizer": True})
            failpoint("mid_checkpoint", step)
            if self.store is not None:
                self.store.save(tmp / "experience.json")
            self.write_recipe(tmp)
            snapshot_metrics(self.out / "metrics.jsonl", tmp)
            self.driver.save(tmp / "job.pkl")
            (tmp / "state.json").write_text(
                json.dumps({"step": step, "policy_version": step, "schedule": self.cfg.runtime.schedule})
            )

        path = atomic_dir(ckpts / f"step_{step:07d}", write)
        failpoint("after_checkpoint", step)
        atomic_write_text(ckpts / "latest", path.name)
        for old in sorted(ckpts.glob("step_*"))[: -max(1, self.cfg.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    def write_recipe(self, model_dir: Path) -> None:
        """The harness recipe the policy trained under (`config.recipe`), beside its weights: an
        ALFWorld run's only (a repository run's prompts are its scaffold's)."""
        cfg = self.cfg
        if cfg.env != "alfworld":
            return
        recipe = ModelRecipe(
            harness=cfg.harness,
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_new_tokens=cfg.max_new_tokens,
            constrained=cfg.constrained,
            wording=cfg.wording,
        )
        store = model_dir / "experience.json"
        write_recipe(model_dir, recipe, store if store.is_file() else cfg.harness.experience_path)

    def export(self, final: Path) -> Path:
        """The final model in the SFT model's dtype, its tokenizer and the experience store."""

        def write(tmp: Path) -> None:
            self.backend.run_job(0, "save", {"dir": str(tmp), "optimizer": False, "export": True})
            if self.store is not None:
                self.store.save(tmp / "experience.json")
            self.write_recipe(tmp)

        return atomic_dir(final, write)

    def close(self) -> None:
        """Stop the cells; a finished run writes its measurements (``runtime.json``)."""
        try:
            if self.driver.sched.done:
                from evoharness.runtime.calibrate import write_sim_toml

                rt, be, st = self.cfg.runtime, self.backend, self.driver.stats
                summary = {
                    "schedule": rt.schedule,
                    "cells": rt.cells,
                    "backend": rt.backend,
                    **st.metrics(),
                    **{f"runtime/{k}": v for k, v in be.idle().items()},
                    **{f"runtime/{k}": v for k, v in be.counts.items()},
                    # what `runtime.calibrate` fits the simulator's cluster to
                    "calibration": {"micro_batches": st.micro_batch_s, "sync_s": st.sync_s},
                }
                atomic_write_text(self.out / "runtime.json", json.dumps(summary, indent=2))
                write_sim_toml(self.out)  # `evoharness simulate --workload runtime/sim.toml`
        finally:
            self.backend.close()


def _read_checkpoint(path: Path) -> tuple[dict[str, Any], Path]:
    """A checkpoint's ``state.json`` and job file, with its job, trainer state and weights files
    read (an unreadable one raises: the previous checkpoint is tried)."""
    from safetensors import safe_open

    from evoharness.runtime.driver import load_job
    from evoharness.train.checkpoint import load_trainer_state

    state = json.loads((path / "state.json").read_text())
    load_job(path / "job.pkl")
    load_trainer_state(path / "trainer_state.pt")
    shards = sorted(path.glob("model*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path} holds no model weights")
    for shard in shards:  # the header and the size it declares (a torn copy fails here)
        with safe_open(str(shard), framework="pt") as f:
            f.keys()
    return state, path / "job.pkl"


def train_rl(cfg: RLConfig, progress: bool = True) -> Path:
    """Run (or resume) GRPO from ``cfg.model_path``; returns the final model directory (with
    ``soup_seeds`` > 1: the seeds' weight average, `recipes.soup.train_soup`).

    Raises:
        ValueError: no model path, another run's checkpoints in out_dir, a bad task filter;
            GameDataError: a bad data path or split.
    """
    from evoharness.eval.run_report import write_rl_report

    if not cfg.model_path:
        raise ValueError("rl needs model_path (the SFT model directory)")
    if cfg.soup_seeds > 1:
        from evoharness.recipes.soup import train_soup

        return train_soup(cfg, progress)
    out, t_start = Path(cfg.out_dir), time.perf_counter()
    metrics_path = out / "metrics.jsonl"
    job = RLJob(cfg)
    rt = cfg.runtime
    tracker = Tracker(cfg.tracking, out, "rl", json.loads(cfg.model_dump_json()))
    bar = tqdm(
        total=cfg.steps,
        initial=job.step,
        desc=f"rl[{rt.schedule}x{rt.cells}]",
        unit="step",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for rec in job.steps():
            step = rec["step"]
            if cfg.eval_every and step % cfg.eval_every == 0:
                rec.update(job.evaluate())
            failpoint("before_metrics", step)
            append_jsonl(metrics_path, rec, step=step)
            tracker.log(rec, step)
            failpoint("after_metrics", step)
            late = bool(cfg.max_minutes) and (time.perf_counter() - t_start) / 60 > cfg.max_minutes
            if step % cfg.ckpt_every == 0 or step == cfg.steps or late:
                job.save(step)
            bar.update(1)
            bar.set_postfix(success=f"{rec['success']:.2f}", reward=f"{rec['reward']:.2f}")
            if late:
                break
        final = job.export(out / "final")
    finally:
        bar.close()
        tracker.close()
        job.close()
    write_rl_report(out, metrics_path)
    return final
