"""`evoharness rl` on the runtime, measured and simulated: the same ALFWorld RL workload under each schedule.

    python benchmarks/rl_runtime.py [steps] [cells]     # default 3 steps, 3 cells: ~5 min on 2 shared cores
    RL_RUNTIME_KEEP=/tmp/runs python benchmarks/rl_runtime.py   # keep each run (trace, runtime.json, sim.toml)
    RL_RUNTIME_RESIM=/tmp/runs python benchmarks/rl_runtime.py  # predict the kept runs again (seconds)

A micro Qwen3 model (tokenizer trained on real BPE-harness prompts, as the
tests build it), P=4 games x G=2 samples per step with a step-cap mix (T_max
3, 3, 3, 12 cycling over the groups: one long group in four gives each step a
long tail), the BPE harness with the action grammar, GRPO (KL 0.01), seed 3.
Every row is `recipes.rl.train_rl` with its ``runtime`` settings: "inprocess" is
one cell in the driver process (``runtime.backend = "inprocess"``), then each
schedule on K cell processes (``backend = "local"``; colocate and async train
cells all-reduce gradients in a gloo group, ``runtime.trainer = "allreduce"``,
`train.distributed`; "colocate/files" is colocate with ``trainer = "single"``:
the elastic schedules' gradient files summed by the core instead).

Measured (the run's ``runtime.json``): the driver's seconds per step (first
command to last weight sync), idle ratio per role, role switches and their
mean latency, aborted turns, max staleness (torch runs one thread per cell: with
torch's default threads the in-process row ran 5-15x slower on 2 loaded cores,
oversubscribed). Simulated: the same run's own
trace replayed step by step in `runtime.sim` on a cluster fitted to that run
(`runtime.calibrate`: decode, micro-batch, sync and switch costs), so the gap
is what the simulator's model of the schedule leaves out. The machine is
shared: expect +-30% between runs; the load is printed with the table.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MICRO = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def build_model(d: Path) -> None:
    from evoharness.envs.alfworld import make_env
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.harness.bpe import BPEHarness, ExperienceStore
    from evoharness.models.init import init_model
    from evoharness.models.tokenizer import build_tokenizer

    corpus = []
    for task in discover_games("train")[:12]:
        h = BPEHarness(ExperienceStore())
        h.reset(task, make_env(task, engine="fast").reset())
        corpus += [m["content"] for m in h.messages()]
        corpus.append("<think>go</think><action>go to countertop 1</action> track commit recall note")
    init_model(MICRO, build_tokenizer(corpus, d, vocab_size=1024), out_dir=d, seed=0)


# label -> (schedule, cells: 1 or K, other ``runtime`` settings); K cells without a backend: processes
ROWS = {
    "inprocess": ("colocate", 1, {"backend": "inprocess"}),
    "colocate": ("colocate", None, {}),
    "colocate/files": ("colocate", None, {"trainer": "single"}),
    "async": ("async", None, {}),
    "elastic": ("elastic", None, {}),
    "elastic-async": ("elastic-async", None, {}),
}


def run(model: Path, out: Path, steps: int, schedule: str, cells: int, **runtime) -> dict:
    from evoharness.config.rl import RLConfig
    from evoharness.recipes.rl import train_rl

    cfg = RLConfig(
        model_path=str(model),
        out_dir=str(out),
        steps=steps,
        max_steps=12,
        step_caps=[3, 3, 3, 12],
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
        seed=3,
        threads=1,
    )  # one torch thread per cell, as cell processes get (in process: the driver's)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 4, 1e-3
    cfg.runtime = cfg.runtime.model_validate({"schedule": schedule, "cells": cells, "stall_s": 300, **runtime})
    t0 = time.perf_counter()
    try:
        train_rl(cfg, progress=False)
    except Exception as e:  # noqa: BLE001 -- a schedule that cannot run this shape is a row, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:80]}"}
    wall = time.perf_counter() - t0
    last = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()][-1]
    rt = json.loads((out / "runtime.json").read_text()) if (out / "runtime.json").exists() else {}
    return {"wall": wall, "step_s": wall / steps, "success": last["success"], "reward": last["reward"], **rt}


def saved(out: Path, steps: int) -> dict:
    """A kept run's measurements (RL_RUNTIME_RESIM): its runtime.json and last metrics record."""
    last = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()][-1]
    rt = json.loads((out / "runtime.json").read_text()) if (out / "runtime.json").exists() else {}
    return {"success": last["success"], "reward": last["reward"], **rt}


def predict(out: Path, schedule: str) -> dict:
    """The simulator on this run's own trace and fitted cluster (`runtime.calibrate`)."""
    from evoharness.runtime.calibrate import sim_config_from_run
    from evoharness.runtime.sim import simulate

    cfg = sim_config_from_run(out)
    r = simulate(cfg, schedule)
    return {"step_s": r.wall_s / cfg.steps, **r.metrics, "cluster": cfg.cluster.model_dump()}


def main() -> None:
    import subprocess

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    keep = os.environ.get("RL_RUNTIME_KEEP")  # a directory: keep the runs there (traces, sim.toml) to inspect
    resim = os.environ.get("RL_RUNTIME_RESIM")  # a kept directory: predict its runs again, run nothing
    tmp = Path(resim or keep) if resim or keep else Path(tempfile.mkdtemp(prefix="rl_runtime_"))
    try:
        if not resim:
            build_model(tmp / "model")
        lines = [
            f"RL on the runtime, measured vs simulated: micro Qwen3, 4 games x 2 samples, T_max mix 3/3/3/12, "
            f"{steps} steps, K={k}",
            "| schedule | cells | s/step meas | s/step sim | sim/meas | idle R meas/sim | idle T meas/sim "
            "| switches meas/sim | switch s to T/R | aborted | max stale meas/sim | success | reward |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        fits = []
        for label, (name, cells, runtime) in ROWS.items():
            cells = cells or k
            out = tmp / f"{label.replace('/', '_')}{cells}"
            r = saved(out, steps) if resim else run(tmp / "model", out, steps, name, cells, **runtime)
            if "error" in r:
                lines.append(f"| {label} | {cells} | {r['error']} |")
            else:
                sim = predict(out, name)
                fits.append((label, sim["cluster"]))
                meas = r["timing_s/step"]
                lines.append(
                    f"| {label} | {cells} | {meas:.2f} | {sim['step_s']:.2f} | {sim['step_s'] / meas:.2f} | "
                    f"{r['runtime/idle_rollout']:.2f}/{sim['idle_rollout']:.2f} | "
                    f"{r['runtime/idle_train']:.2f}/{sim['idle_train']:.2f} | "
                    f"{r['runtime/switches']:.0f}/{sim['switches']:.0f} | "
                    f"{r['runtime/switch_to_train_s']:.2f}/{r['runtime/switch_to_rollout_s']:.2f} | "
                    f"{r['runtime/aborted_turns']:.0f} | "
                    f"{r['runtime/staleness_max']:.0f}/{sim['staleness_max']:.0f} | "
                    f"{r['success']:.2f} | {r['reward']:.3f} |"
                )
            print(lines[-1], flush=True)
        lines.append(
            "\nFitted clusters (runtime.calibrate): gen tok/s, concurrency exponent, prefill speedup, "
            "train tok/s, micro-batch overhead s, sync s"
        )
        for name, c in fits:
            lines.append(
                f"  {name:>14}: {c['gen_tps_single']:8.1f} {c['gen_concurrency_exponent']:5.2f} "
                f"{c['prefill_speedup']:8.1f} "
                f"{c['train_tps']:10.0f} {c['micro_batch_overhead_s']:6.3f} {c['weight_sync_s']:6.3f}"
            )
        lines.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        print("\n".join(lines))
    finally:
        if not (keep or resim):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
