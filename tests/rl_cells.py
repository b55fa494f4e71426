"""Helpers shared by the RL-on-cells tests (tests/train/test_rl_runtime.py, tests/runtime/...):
the small ALFWorld RL config, the comparison with the in-process loop (`rl_reference` in
tests/conftest.py), the pieces of a hand-built job, a driver run with a cell killer, and a
local backend that kills a cell on a chosen command."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest
from safetensors.torch import load_file

if TYPE_CHECKING:
    from evoharness.config.rl import RLConfig

# the Driver's hang guard in the cell tests: starting Ray actors (Python processes importing torch) took
# over 60 s on 2 cores beside a training job; a real hang still fails, only later
RAY_STALL_S = 300.0

# the in-process loop's per-step numbers a runtime run must reproduce exactly, and to float noise
EXACT = ("success", "reward", "steps_per_episode", "completion_tokens_per_episode", "invalid_per_episode",
         "experience_ops", "experience_epoch", "policy_version", "train/n_tokens", "adv/signal_groups",
         "prompt/cut_tokens", "rollout/env_errors")
CLOSE = ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/forced_fraction")


def rl_config(model_dir: Path, out: Path, steps: int = 2, **runtime: Any) -> RLConfig:
    """2 steps x 2 games x 2 samples, episodes of at most 4 turns of 12 tokens; `runtime` sets
    ``cfg.runtime`` fields (none: the in-process loop)."""
    from evoharness.config.rl import RLConfig

    cfg = RLConfig(model_path=str(model_dir), out_dir=str(out), steps=steps, max_steps=4, max_new_tokens=12,
                   max_prompt_tokens=512, decode_threads=1, seed=3)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
    cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
    for k, v in runtime.items():
        setattr(cfg.runtime, k, v)
    return cfg


def metrics(out: Path) -> list[dict]:
    """A run's per-step records (``metrics.jsonl``)."""
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_steps(got: list[dict], want: list[dict]) -> None:
    """Steps 1 and 2 with the same `EXACT` numbers and `CLOSE` ones within float noise."""
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        for k in CLOSE:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), k


def assert_same_update(final: Path, ref_w: dict, model_dir: Path) -> None:
    """The same AdamW updates: `final`'s weights agree with `ref_w` far below the size of the update.

    1% of each tensor's move: a cell decodes the calls queued together as one batch and the train
    cells sum gradients in another order, so log-probs and gradients differ in the last float bits,
    and AdamW's 1/sqrt(v) scales that up where gradients are tiny (1.2e-3 of the update was seen
    once; another sample or update would differ by ~100%)."""
    w0 = load_file(str(model_dir / "model.safetensors"))
    w = load_file(str(final / "model.safetensors"))
    assert max(float((w[k] - w0[k]).abs().max()) for k in w0) > 0      # the updates changed the weights
    for k in ref_w:
        moved = (ref_w[k] - w0[k]).abs().max()
        assert (w[k] - ref_w[k]).abs().max() <= 1e-2 * moved + 1e-7, k


def job_parts(cfg: RLConfig, tasks: list | None = None) -> tuple[Any, Any, list, list[int]]:
    """``(sim, scheduler, tasks, order)`` for a backend built by hand, as `train.rl.train_rl`
    draws them (`tasks` default: the ALFWorld train games)."""
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.runtime.rl_job import sim_config
    from evoharness.runtime.sim import build_scheduler

    tasks = discover_games("train") if tasks is None else tasks
    order = list(range(len(tasks)))
    random.Random(cfg.seed).shuffle(order)
    sim = sim_config(cfg)
    return sim, build_scheduler(cfg.runtime.schedule, sim), tasks, order


def drive_with_killer(sched: Any, be: Any, killer: Callable[[], None]) -> Any:
    """Run the driver to the end with `killer` on a thread of its own; close the backend."""
    from evoharness.runtime.driver import Driver

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        stats = Driver(sched, be, stall_s=RAY_STALL_S).run()
    finally:
        be.close()
    t.join(timeout=1)
    return stats


def gateway_satellite_killer(be: Any, min_calls: int, killed: list[int]) -> Callable[[], None]:
    """A killer: SIGKILL a satellite cell (not the core) while gateway calls run on it, once
    `min_calls` calls were made; the cell goes into `killed`."""

    def kill() -> None:
        while True:
            try:
                cells = {be._jobs[t][1] for t in list(be._gw_jobs)} - {0}
            except (KeyError, RuntimeError):           # the driver thread moved on meanwhile
                cells = set()
            if cells and be.counts["calls"] >= min_calls:
                break
            time.sleep(0.002)
        os.kill(be.procs[min(cells)].pid, signal.SIGKILL)
        killed.append(min(cells))

    return kill


def assert_micro_batch_reclaimed(be: Any, stats: Any, sim: Any) -> None:
    """One cell lost, its micro-batch re-claimed, and each step's update summing exactly one
    micro-batch per execution (every execution trained once)."""
    n = sim.steps * sim.workload.groups_per_step * sim.workload.group_size
    assert be.killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert stats.micro_batches_reclaimed >= 1 and stats.aborted_turns == 0
    assert sum(stats.staleness.values()) == n
    assert [s["micro_batches"] for s in be.step_stats] == [n // sim.steps] * sim.steps


class KillOnCommand:
    """Mixin for a local cell backend (`runtime.local_backend.LocalBackend` or a subclass):
    SIGKILLs a cell's process right after the first command `kill_on(c)` picks reaches it,
    and reaps it; ``killed``: [that cell]."""

    def __init__(self, *a: Any, kill_on: Callable[[Any], bool], **kw: Any):
        super().__init__(*a, **kw)
        self.kill_on, self.killed = kill_on, []

    def apply(self, c: Any) -> None:
        super().apply(c)
        if not self.killed and self.kill_on(c):
            os.kill(self.procs[c.cell].pid, signal.SIGKILL)
            self.procs[c.cell].join()
            self.killed.append(c.cell)
