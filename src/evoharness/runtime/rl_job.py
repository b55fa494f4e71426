"""``evoharness rl --schedule ...``: the RL job on the elastic runtime.

Build the runtime from the config (a scheduler from `runtime.schedulers`, an
`runtime.alfworld_backend.AlfworldBackend` of K cell processes), drive it
with `runtime.driver.Driver` until the last weight sync, write one metrics
record per step (``metrics.jsonl``, `train.rl`'s names), the run's runtime
measurements (``runtime.json``: wall time per step, idle ratio per role,
switches and their latency, aborted turns, staleness, cells lost) and the
final model, and the run's call trace (``runtime/trace.jsonl``, the
simulator's trace format: ``evoharness simulate --workload`` replays it).
``schedule = "inprocess"`` (the default) is the colocate schedule on one cell
that is the driver process (`runtime.inprocess`). `build_runtime` picks.

A job checkpoint (``runtime/job.pkl``, `Driver.save`) is written at every
weight sync, after that step's metrics record; the same command on the same out_dir
resumes from it (metrics past it are dropped, so none is lost or repeated;
the core's optimizer state is kept per weights version). Episodes live at
that moment (async schedules) are rebuilt by replaying their recorded
completions; a step with none (colocate, elastic) resumes exactly.

Colocate and async train cells (a fixed set) all-reduce their gradients in a
torch.distributed group (`runtime.replicas`); elastic schedules, whose train
membership changes within a step, exchange gradient files with the core.

``env = "repo"`` swaps the workload for repository tasks
(`runtime.repo_backend.RepoBackend`; docs/repo_env.md), on the same cells.

``runtime.backend = "ray"`` runs the cells as Ray actors
(`runtime.ray_backend.RayAlfworldBackend`), joining ``runtime.ray_address``
or starting a local head.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING



if TYPE_CHECKING:
    from evoharness.config.sim import SimConfig
    from evoharness.config.rl import RLConfig


def sim_config(cfg: "RLConfig") -> "SimConfig":
    """The scheduler's view of `cfg`: P groups of G executions per step on K cells."""
    from evoharness.config.sim import SimConfig

    rt, g = cfg.runtime, cfg.grpo
    n = g.prompts_per_step * g.group_size
    return SimConfig.model_validate({
        "workload": {"groups_per_step": g.prompts_per_step, "group_size": g.group_size},
        "cluster": {"cells": rt.cells, "capacity": rt.capacity or math.ceil(n / rt.cells)},
        "policy": {"staleness": rt.staleness, "async_train_cells": rt.async_train_cells},
        "steps": cfg.steps, "seed": cfg.seed,
    })


def build_runtime(cfg: "RLConfig"):
    """The runtime `train.rl.train_rl` drives for `cfg` (resumed from ``out_dir``): the
    in-process one (`runtime.inprocess.InProcessRuntime`) or K cells (`CellRuntime`).
    Both offer ``step`` (steps done), ``steps()`` (each step's metrics record, at its
    weight sync), ``evaluate()``, ``save(step)``, ``close()`` and ``export(dir)``."""
    if cfg.runtime.schedule == "inprocess":
        from evoharness.runtime.inprocess import InProcessRuntime

        if cfg.env == "repo":
            raise ValueError("env = 'repo' runs on the runtime cells: --schedule colocate|async|elastic|elastic-async")

        return InProcessRuntime(cfg)
    return CellRuntime(cfg)


class CellRuntime:
    """`cfg`'s RL on its runtime schedule: K cell processes (or Ray actors) under the
    driver; see the module docstring.

    Raises:
        ValueError: a setting the cells cannot honour (a non-CPU device, tree packing,
            gateway rollouts, grpo.mini_batches or grpo.epochs > 1, an SFT anchor, ckpt_every > 1),
            an out_dir of an in-process run, or a bad task filter.
    """

    def __init__(self, cfg: "RLConfig"):
        from evoharness.runtime.alfworld_backend import AlfworldBackend
        from evoharness.runtime.cells import Role
        from evoharness.runtime.driver import Driver
        from evoharness.runtime.sim import build_scheduler
        from evoharness.files import atomic_write_text
        from evoharness.train.rl import load_experience_fresh, train_tasks

        rt = cfg.runtime
        refused = {"grpo.packing runs with runtime.schedule = 'inprocess' only (cells train turn rows)": cfg.grpo.packing,
                   "rollout_via_gateway runs with runtime.schedule = 'inprocess' only (on cells: runtime.via_gateway)":
                       cfg.rollout_via_gateway,
                   "grpo.mini_batches > 1 runs with runtime.schedule = 'inprocess' only (the cells' streaming trainer "
                   "makes one update per step)": cfg.grpo.mini_batches != 1,
                   "grpo.epochs > 1 runs with runtime.schedule = 'inprocess' only (one update per step)":
                       cfg.grpo.epochs != 1,
                   "sft_anchor runs with runtime.schedule = 'inprocess' only": cfg.sft_anchor is not None,
                   "branches run with runtime.schedule = 'inprocess' only": bool(cfg.branches),
                   "the cells' job checkpoint is taken at every weight sync (ckpt_every = 1)": cfg.ckpt_every != 1,
                   "runtime cells run on CPU for now (device = 'cpu')": cfg.device != "cpu",
                   "env = 'repo' has no periodic evaluation yet (eval_every = 0; `eval --env repo` evaluates)":
                       cfg.env == "repo" and cfg.eval_every > 0}
        if why := [k for k, v in refused.items() if v]:
            raise ValueError("; ".join(why))
        self.cfg, self.out = cfg, Path(cfg.out_dir)
        out, metrics_path = self.out, self.out / "metrics.jsonl"
        if (out / "checkpoints").exists():
            raise ValueError(f"{out} holds an in-process run (checkpoints/); give the runtime its own out_dir")
        self.job = out / "runtime" / "job.pkl"
        atomic_write_text(out / "rl_config.json", cfg.model_dump_json(indent=2))
        tasks = train_tasks(cfg) if cfg.env == "alfworld" else repo_tasks(cfg)
        order = list(range(len(tasks)))
        random.Random(cfg.seed).shuffle(order)           # the in-process loop's game order
        store = load_experience_fresh(cfg.harness.experience_path) if cfg.env == "alfworld" else None
        sim = sim_config(cfg)
        self.step = 0

        def make_backend(sched, state=None) -> AlfworldBackend:
            roles = [c.role for c in sched.pool.cells] if state else sched.initial_roles()
            self.step = state["alf"]["newest"] if state else 0
            for path in (metrics_path, out / "runtime" / "trace.jsonl"):       # steps past the checkpoint redo
                _keep_steps(path, self.step)
            kw: dict = {"state": state, "via_gateway": rt.via_gateway}
            ray = rt.backend == "ray"
            if ray:
                from evoharness.runtime import ray_backend
                kw.update(address=rt.ray_address, num_cpus=rt.ray_num_cpus)
            if rt.allreduce and rt.schedule in ("colocate", "async"):
                from evoharness.runtime.replicas import AllReduceAlfworldBackend

                fixed = sched.initial_roles()           # async: its train split; colocate: every cell trains
                members = [c for c, r in enumerate(fixed) if r == Role.TRAIN] if rt.schedule == "async" \
                    else list(range(rt.cells))
                cls = ray_backend.RayAllReduceAlfworldBackend if ray else AllReduceAlfworldBackend
                if cfg.env == "repo":
                    from evoharness.runtime import repo_backend
                    cls = repo_backend.ray_classes()[1] if ray else repo_backend.AllReduceRepoBackend
                return cls(sim, roles, cfg, tasks, order, store, str(out / "runtime"), None, members=members, **kw)
            cls = ray_backend.RayAlfworldBackend if ray else AlfworldBackend
            if cfg.env == "repo":
                from evoharness.runtime import repo_backend
                cls = repo_backend.ray_classes()[0] if ray else repo_backend.RepoBackend
            return cls(sim, roles, cfg, tasks, order, store, str(out / "runtime"), None, **kw)

        if self.job.exists():
            self.driver = Driver.resume(self.job, make_backend, stall_s=rt.stall_s)
            self.driver.checkpoint = None                  # `save` writes it, after the step's metrics
        else:
            sched = build_scheduler(rt.schedule, sim)
            self.driver = Driver(sched, make_backend(sched), stall_s=rt.stall_s)
        self.backend = self.driver.backend
        self._eval_policy = None

    def steps(self):
        """Each step's metrics record (`alfworld_backend.step_record`'s names) at its weight sync."""
        for version in self.driver.steps():
            rec = self.backend.records[-1]
            if rec["step"] != version:
                raise RuntimeError(f"weights v{version} synced without their step record (last: {rec['step']})")
            self.step = version
            yield dict(rec)

    def save(self, step: int) -> None:
        self.driver.save(self.job)

    def _weights(self) -> Path:
        return self.out / "runtime" / "weights" / f"v{self.step}.safetensors"

    def evaluate(self) -> dict[str, float]:
        """`train.rl.quick_eval` in the driver process, on the newest weights."""
        import torch
        from safetensors.torch import load_model as load_weights

        from evoharness.policies.local import LocalHFPolicy
        from evoharness.train.rl import quick_eval

        cfg = self.cfg
        if self._eval_policy is None:
            self._eval_policy = LocalHFPolicy(cfg.model_path, device="cpu", dtype=torch.float32,
                                              max_new_tokens=cfg.max_new_tokens,
                                              max_prompt_tokens=cfg.max_prompt_tokens, constrained=cfg.constrained,
                                              seed=cfg.seed, num_threads=cfg.decode_threads)
        load_weights(self._eval_policy.model, str(self._weights()))
        self._eval_policy.policy_version = self.step
        return quick_eval(cfg, self._eval_policy, self.backend.store)

    def close(self) -> None:
        """Stop the cells; a finished run writes its measurements (``runtime.json``)."""
        from evoharness.files import atomic_write_text

        try:
            if self.driver.sched.done:
                rt, be = self.cfg.runtime, self.backend
                st = self.driver.stats
                summary = {"schedule": rt.schedule, "cells": rt.cells, **st.metrics(),
                           **{f"runtime/{k}": v for k, v in be.idle().items()},
                           **{f"runtime/{k}": v for k, v in be.counts.items()},
                           # what `runtime.calibrate` fits the simulator's cluster to
                           "calibration": {"micro_batches": st.micro_batch_s, "sync_s": st.sync_s}}
                atomic_write_text(self.out / "runtime.json", json.dumps(summary, indent=2))
                from evoharness.runtime.calibrate import write_sim_toml

                write_sim_toml(self.out)         # `evoharness simulate --workload runtime/sim.toml`
        finally:
            self.backend.close()

    def export(self, final: Path) -> Path:
        """The newest weights in the SFT model's dtype, its tokenizer and the experience store."""
        import torch
        from safetensors.torch import load_model as load_weights

        from evoharness.models.init import load_model, load_tokenizer
        from evoharness.files import atomic_dir
        from evoharness.train.precision import export_dtype, save_exported

        def write(tmp: Path) -> None:
            model = load_model(self.cfg.model_path, "cpu", torch.float32)
            load_weights(model, str(self._weights()))
            save_exported(model, tmp, export_dtype(self.cfg.model_path))
            load_tokenizer(self.cfg.model_path).save_pretrained(str(tmp))
            if self.backend.store is not None:        # (ALFWorld's experience store; none for env = 'repo')
                self.backend.store.save(tmp / "experience.json")

        return atomic_dir(final, write)


def repo_tasks(cfg: "RLConfig") -> list:
    """The repository tasks RL trains on (``cfg.repo.tasks``, only ``repo.task_ids`` when given).

    Raises:
        ValueError: a task id that names no task.
    """
    from evoharness.envs.repo.task import load_tasks

    tasks = load_tasks(cfg.repo.tasks)
    if not cfg.repo.task_ids:
        return tasks
    known = {t.task_id: t for t in tasks}
    if unknown := sorted(set(cfg.repo.task_ids) - set(known)):
        raise ValueError(f"repo.task_ids {unknown} name no task in {cfg.repo.tasks!r}")
    return [known[i] for i in cfg.repo.task_ids]


def _keep_steps(path: Path, steps: int) -> None:
    """Keep the JSONL records of steps 1..`steps` (their ``step`` field) of `path`
    (atomically; a torn last line goes too)."""
    from evoharness.files import atomic_write_text

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
