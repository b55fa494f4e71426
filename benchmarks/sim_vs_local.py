"""Measured vs simulated: the same schedulers on K cell processes (the replay) and in the simulator.

    python benchmarks/sim_vs_local.py [time_scale ...]   # default 0.005 0.02: ~2 min on 2 shared cores

The replay (`runtime.synthetic.replay_backend`: a `CellBackend` of timed cells on a
process each) plays the simulator's workload draw in real time (``time_scale`` real
seconds per simulated second); a cell serves its calls in parallel, so the simulator is run
with a linear decode curve (gen_concurrency_exponent = 1: each sequence
decodes at gen_tps_single whatever the load) to model the same world. The
gap between the two is what the real control plane adds (process messaging,
the driver's polling, scheduling on a loaded 2-core machine): the simulator
should predict each schedule's wall time within 15%.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evoharness.config.sim import SimConfig  # noqa: E402
from evoharness.runtime.driver import Driver  # noqa: E402
from evoharness.runtime.sim import build_scheduler, simulate  # noqa: E402
from evoharness.runtime.synthetic import replay_backend  # noqa: E402

WORKLOAD = {
    "workload": {
        "name": "long_tail_small",
        "groups_per_step": 4,
        "group_size": 4,
        "initial_prompt_tokens": 500,
        "turns": {"kind": "lognormal", "median": 8, "sigma": 0.9, "max": 80},
        "completion_tokens": {"kind": "lognormal", "median": 200, "sigma": 0.5},
        "prompt_tokens": {"kind": "lognormal", "median": 400, "sigma": 0.7},
        "tool_latency_s": {"kind": "lognormal", "median": 2.0, "sigma": 0.8},
        "timeout_s": 600,
        "timeout_ref_tps": 30,
    },
    "cluster": {
        "cells": 3,
        "accelerators_per_cell": 8,
        "capacity": 6,
        "gen_tps_single": 50.0,
        "gen_concurrency_exponent": 1.0,
        "prefill_speedup": 50.0,
        "train_tps": 2000.0,
        "weight_sync_s": 3.0,
    },
    "policy": {"staleness": 1, "async_train_cells": 1},
    "steps": 3,
    "seed": 1,
}
POLICIES = ("colocate", "async", "elastic", "elastic-async")


def main() -> None:
    for scale in [float(a) for a in sys.argv[1:]] or [0.005, 0.02]:
        table(scale)


def table(SCALE: float) -> None:  # noqa: N803 - the module constant's name, per run
    cfg = SimConfig.model_validate(WORKLOAD)
    t0 = time.perf_counter()
    print(
        f"# measured (replay, {cfg.cluster.cells} cell processes) vs simulated, "
        f"{cfg.workload.groups_per_step}x{cfg.workload.group_size} executions/step, {cfg.steps} steps, "
        f"time_scale {SCALE} (simulated seconds shown)"
    )
    print(
        f"  {'policy':>14} {'measured s':>10} {'simulated s':>11} {'sim/meas':>8} {'s/step':>7} "
        f"{'idle R meas/sim':>15} {'idle T meas/sim':>15} {'switches':>8} {'switch->T s':>11} {'aborted':>7} "
        f"{'stale max':>9}"
    )
    for p in POLICIES:
        sim = simulate(cfg, p)
        sched = build_scheduler(p, cfg)
        be = replay_backend(cfg, sched.initial_roles(), time_scale=SCALE, backend="local")
        try:
            st = Driver(sched, be, stall_s=60).run()
            idle = be.idle()
        finally:
            be.close()
        m = st.metrics()
        meas = st.wall_s / SCALE
        sm = sim.metrics
        print(
            f"  {p:>14} {meas:10.0f} {sim.wall_s:11.0f} {sim.wall_s / meas:7.2f}x "
            f"{m['timing_s/step'] / SCALE:7.0f} {100 * idle['idle_rollout']:7.1f}/{100 * sm['idle_rollout']:5.1f}% "
            f"{100 * idle['idle_train']:7.1f}/{100 * sm['idle_train']:5.1f}% {st.switches:8d} "
            f"{m['runtime/switch_to_train_s'] / SCALE:11.1f} {st.aborted_turns:7d} {m['runtime/staleness_max']:9.0f}"
        )
    print(
        f"  (switch->T: measured rollout->train latency; the workload charges "
        f"{cfg.cluster.switch_to_train_s} s)\n(ran in {time.perf_counter() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
