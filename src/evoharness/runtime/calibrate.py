"""A finished runtime run as a simulator input: its own trace and a cluster fitted to its measurements.

``evoharness rl --schedule ...`` leaves in its out_dir the call trace
(``runtime/trace.jsonl``: per call its prompt/completion tokens and start/end
seconds, per execution its RL step) and the driver's measurements
(``runtime.json``: micro-batch tokens and seconds, weight-sync seconds, role
switch latencies). `sim_config_from_run` turns them into a `SimConfig` that
replays each step's own executions (``trace_replay``, step by step) on a
cluster whose costs are least-squares fits of the same run:

- decode: a call of c completion tokens and p new prompt tokens lasts
  ``(c + p / prefill_speedup) / gen_tps_single`` (non-negative least squares
  over the run's calls), then, where the trace names each call's cell, the
  processor-sharing slowdown with n calls in flight on the cell,
  ``n^(1 - gen_concurrency_exponent)``, by a log-linear fit on each call's
  mean concurrency;
- tool latency: the trace's gaps between an execution's calls (environment
  steps and harness rendering in the driver process, as they happened);
- training: a micro-batch of T trajectory tokens lasts
  ``micro_batch_overhead_s + T / train_tps`` (least squares); weight sync and
  role switches: the run's mean latencies.

`write_sim_toml` writes it as ``runtime/sim.toml`` so ``evoharness simulate
--workload <out>/runtime/sim.toml`` predicts every schedule for this run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from evoharness.config.sim import SimConfig
from evoharness.runtime.workload import load_trace


def _nnls2(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min ||a·x1 + b·x2 - y|| over a, b >= 0 (two columns: check the corners)."""
    best = (float("inf"), 0.0, 0.0)
    cands = []
    A = np.stack([x1, x2], 1)
    sol, *_ = np.linalg.lstsq(A, y, rcond=None)
    cands.append((float(sol[0]), float(sol[1])))
    for col, put in ((x1, 0), (x2, 1)):
        d = float(col @ col)
        k = float(col @ y) / d if d else 0.0
        cands.append((k, 0.0) if put == 0 else (0.0, k))
    for a, b in cands:
        if a < 0 or b < 0:
            continue
        r = float(np.sum((a * x1 + b * x2 - y) ** 2))
        if r < best[0]:
            best = (r, a, b)
    return best[1], best[2]


def _cell_concurrency(raw: list[dict]) -> np.ndarray | None:
    """Per call (trace order), the mean number of calls in flight on its cell over its
    duration, itself included; None when the trace names no cell per call."""
    calls = [(t["start"], t["end"], t["cell"]) for r in raw for t in r["turns"] if "cell" in t]
    if len(calls) != sum(len(r["turns"]) for r in raw):
        return None
    out = []
    for s, e, c in calls:
        if e <= s:
            out.append(1.0)
            continue
        overlap = sum(max(0.0, min(e, e2) - max(s, s2)) for s2, e2, c2 in calls if c2 == c)
        out.append(max(1.0, overlap / (e - s)))
    return np.asarray(out)


def fit_cluster(run: str | Path) -> dict[str, Any]:
    """The cluster section fitted to `run`'s trace and ``runtime.json`` (see module docstring).

    Raises:
        FileNotFoundError: no trace or no runtime.json (an in-process run, or unfinished).
    """
    run = Path(run)
    rt = json.loads((run / "runtime.json").read_text())
    cfg = json.loads((run / "rl_config.json").read_text())
    execs = load_trace(run / "runtime" / "trace.jsonl")
    raw = [json.loads(ln) for ln in (run / "runtime" / "trace.jsonl").read_text().splitlines() if ln.strip()]
    dur = np.array([t["end"] - t["start"] for r in raw for t in r["turns"]], dtype=float)
    comp = np.concatenate([e.completion for e in execs])
    new = np.concatenate([e.prompt for e in execs])
    a, b = _nnls2(comp, new, dur)  # seconds per completion token, per new prompt token
    if a <= 0:  # completion-free fit: charge everything per prompt token
        a = b
    gen_tps = 1.0 / a if a > 0 else 1e6
    prefill_speedup = a / b if b > 0 else 1e6
    exponent = 1.0
    n = _cell_concurrency(raw)
    if n is not None and np.ptp(np.log(n)) > 0:
        # processor sharing: d = work / (g · n^(x-1)) -> log(d / work) = -log g + (1 - x) log n
        work = comp + new / prefill_speedup
        ok = (dur > 0) & (work > 0)
        k, _ = np.polyfit(np.log(n[ok]), np.log(dur[ok] / work[ok]), 1)
        exponent = float(np.clip(1.0 - k, 0.05, 1.0))
        # the speed that gives the run's total call time (a log fit's intercept underestimates it)
        gen_tps = float(np.sum(work[ok] * n[ok] ** (1.0 - exponent)) / np.sum(dur[ok]))
    mb = np.array(rt.get("calibration", {}).get("micro_batches", []), dtype=float).reshape(-1, 2)
    if len(mb) >= 2 and np.ptp(mb[:, 0]) > 0:
        slope, icpt = np.polyfit(mb[:, 0], mb[:, 1], 1)
        if slope <= 0:
            slope, icpt = 0.0, float(mb[:, 1].mean())
        icpt = max(0.0, float(icpt))
    else:
        slope, icpt = 0.0, float(mb[:, 1].mean()) if len(mb) else 0.0
    rtc = cfg["runtime"]
    n = cfg["grpo"]["prompts_per_step"] * cfg["grpo"]["group_size"]
    return {
        "cells": rtc["cells"],
        "capacity": rtc.get("capacity") or -(-n // rtc["cells"]),
        "gen_tps_single": gen_tps,
        "gen_concurrency_exponent": exponent,
        "prefill_speedup": prefill_speedup,
        "train_tps": 1.0 / slope if slope > 0 else 1e9,
        "micro_batch_overhead_s": icpt,
        "weight_sync_s": float(rt.get("runtime/sync_s", 0.0)),
        "switch_to_train_s": float(rt.get("runtime/switch_to_train_s", 0.0)),
        "switch_to_rollout_s": float(rt.get("runtime/switch_to_rollout_s", 0.0)),
        # the cells reload weights at a sync; their KV is never kept across calls (no prefix cache)
        "sync_flushes_kv": False,
    }


def sim_config_from_run(run: str | Path) -> SimConfig:
    """`run`'s workload (its trace, step by step) on its fitted cluster, its schedule's knobs."""
    run = Path(run)
    cfg = json.loads((run / "rl_config.json").read_text())
    g, rtc = cfg["grpo"], cfg["runtime"]
    return SimConfig.model_validate(
        {
            "workload": {
                "name": run.name,
                "groups_per_step": g["prompts_per_step"],
                "group_size": g["group_size"],
                "trace": str((run / "runtime" / "trace.jsonl").resolve()),
                "trace_replay": True,
            },
            "cluster": fit_cluster(run),
            "policy": {"staleness": rtc["staleness"], "async_train_cells": rtc.get("async_train_cells")},
            "steps": cfg["steps"],
            "seed": cfg["seed"],
        }
    )


def write_sim_toml(run: str | Path) -> Path:
    """``run/runtime/sim.toml``: `sim_config_from_run` for ``evoharness simulate --workload``."""
    from evoharness.files import atomic_write_text

    sc = sim_config_from_run(run).model_dump(exclude_none=True)

    def val(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)

    lines = [f"steps = {sc['steps']}", f"seed = {sc['seed']}"]
    for sec in ("workload", "cluster", "policy"):
        lines.append(f"\n[{sec}]")
        lines += [f"{k} = {val(v)}" for k, v in sc[sec].items() if not isinstance(v, dict)]
    path = Path(run) / "runtime" / "sim.toml"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
