"""Simulator speed at cluster scale: 1,024 cells x 10,000 executions per step.

    python benchmarks/sim_scale.py              # one step per policy, then 3 elastic steps
    python benchmarks/sim_scale.py --steps 1 --policies elastic

Workload: 1,250 GRPO groups x 8 = 10,000 executions per step, ~45 turns each
(lognormal, capped at 200), so ~480K model calls and ~1.2M timed events per
step; cells hold 10 executions (10,240 slots). The target is under 60 s of
wall clock per simulated step on a 2-core machine; the load average is printed
because the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# src/ must be on sys.path before the evoharness imports (run as a script, no install needed): hence noqa E402
from evoharness.config.sim import SimConfig  # noqa: E402
from evoharness.runtime.sim import simulate  # noqa: E402


def config(steps: int) -> SimConfig:
    return SimConfig.model_validate(
        {
            "workload": {
                "name": "scale",
                "groups_per_step": 1250,
                "group_size": 8,
                "initial_prompt_tokens": 4000,
                "turns": {"kind": "lognormal", "median": 40, "sigma": 0.6, "max": 200},
                "completion_tokens": {"kind": "lognormal", "median": 600, "sigma": 0.5},
                "prompt_tokens": {"kind": "lognormal", "median": 1500, "sigma": 0.8},
                "tool_latency_s": {"kind": "lognormal", "median": 10.0, "sigma": 0.8},
            },
            "cluster": {
                "cells": 1024,
                "accelerators_per_cell": 8,
                "capacity": 10,
                "train_tps": 20000.0,
                "weight_sync_s": 20.0,
            },
            "steps": steps,
            "seed": 0,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="colocate,async,elastic,elastic-gated")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--elastic-steps", type=int, default=3, help="an extra multi-step elastic run (0: skip)")
    args = ap.parse_args()
    print(
        f"# simulator scale benchmark: 1,024 cells x 10,000 executions per step "
        f"(python {platform.python_version()}, {os.cpu_count()} CPUs)"
    )
    print(
        f"{'policy':>13} {'steps':>5} {'sim wall s':>10} {'s/step':>7} {'model calls':>11} {'events':>9} "
        f"{'events/s':>9} {'simulated h':>11} {'load avg':>8}"
    )
    runs = [(p.strip(), args.steps) for p in args.policies.split(",") if p.strip()]
    if args.elastic_steps:
        runs.append(("elastic", args.elastic_steps))
    for policy, steps in runs:
        cfg = config(steps)
        t = time.perf_counter()
        r = simulate(cfg, policy)
        dt = time.perf_counter() - t
        m = r.metrics
        assert r.checks["finished_once"] and r.checks["trained_once"]
        print(
            f"{policy:>13} {steps:5d} {dt:10.1f} {dt / steps:7.1f} {m['model_calls']:11.0f} {m['timed_events']:9.0f} "
            f"{m['timed_events'] / dt:9.0f} {m['wall_h']:11.2f} {os.getloadavg()[0]:8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
