"""Elastic vs colocate vs async on QwenGyre-like workloads, and what the gap depends on.

    python benchmarks/sim_speedups.py            # ~8 min on 2 shared cores
    python benchmarks/sim_speedups.py --quick    # main tables only

Workloads: configs/workloads/qwengyre_nl2repo.toml and qwengyre_122b.toml
(hours-long executions, ~700K tokens, a tail piled up under the timeout;
every number there is an assumption written to match QwenGyre's description,
arXiv 2609.33848). Paper: elastic is 1.36-1.85x faster than colocate and
1.38-1.78x faster than async (1.38-1.57x on the 122B model); 4 cells of 8
nodes instead of 8 of 4 cost +2.2%.

Two ways a finished execution may become trainable are shown, because the
speedup depends on it: ``group`` (GRPO: the advantage needs every member of the
group, so a group trains once its slowest member finished) and ``execution``
(trainable at once: an upper bound for streaming training). Async is shown at
the default split (K/4 train cells, AReaL-like: a step starts when its batch
is in), at its best split, and with a streaming trainer at its best split.
Elastic is shown twice: ``elastic`` is the paper's rule alone (w(t) <= C_R(t) -
C_e), ``elastic-gated`` adds the ready-work gate (a cell moves to train only
when trainable micro-batches are waiting for it; not in the paper).
``elastic-async`` (runtime/schedulers/elastic_async.py) combines elastic cells
with bounded-staleness streaming and completion-order batches; it is compared
with every baseline, streaming async in completion order included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# src/ must be on sys.path before the evoharness imports (run as a script, no install needed): hence noqa E402
from evoharness.config.sim import SimConfig  # noqa: E402
from evoharness.runtime.sim import SimResult, simulate  # noqa: E402
from evoharness.runtime.workload import Workload, load_sim_config  # noqa: E402

WORKLOADS = ROOT / "configs" / "workloads"
PAPER_VS_COLOCATE = (1.36, 1.85)
PAPER_VS_ASYNC = {"qwengyre_nl2repo": (1.38, 1.78), "qwengyre_122b": (1.38, 1.57)}
PAPER_GRANULARITY = 0.022


def load(name: str, *sets: str) -> SimConfig:
    return load_sim_config(WORKLOADS / f"{name}.toml", list(sets))[0]


def with_policy(cfg: SimConfig, **policy) -> SimConfig:
    c = cfg.model_copy(deep=True)
    for k, v in policy.items():
        setattr(c.policy, k, v)
    return c


def verdict(x: float, lo: float, hi: float) -> str:
    return "inside" if lo <= x <= hi else ("BELOW" if x < lo else "ABOVE")


def best_async(cfg: SimConfig, stream: bool) -> tuple[int, SimResult]:
    runs = {
        k: simulate(with_policy(cfg, async_train_cells=k, async_stream=stream), "async")
        for k in range(1, cfg.cluster.cells // 2 + 1)
    }
    k = min(runs, key=lambda i: runs[i].wall_s)
    return k, runs[k]


def row(label: str, r: SimResult, ref: SimResult) -> str:
    m = r.metrics
    return (
        f"  {label:<30} {m['wall_h']:7.2f} {r.wall_s / ref.wall_s:7.2f}x {m['accelerator_hours']:9.0f} "
        f"{m['post_rollout_h']:6.2f} {100 * m['idle_rollout']:6.1f}% {100 * m['util_rollout']:6.1f}% "
        f"{100 * m['idle_train']:6.1f}% {m['staleness_max']:5.0f} {m['aborted_turns']:5.0f} {m['switches']:5.0f}"
    )


def speedups(
    label: str, ela: SimResult, col: SimResult, adef: SimResult, abest: SimResult, astream: SimResult, name: str
) -> dict[str, float]:
    lo, hi = PAPER_VS_COLOCATE
    alo, ahi = PAPER_VS_ASYNC[name]
    x = {
        "vs_colocate": col.wall_s / ela.wall_s,
        "vs_async_default": adef.wall_s / ela.wall_s,
        "vs_async_best": abest.wall_s / ela.wall_s,
        "vs_async_stream": astream.wall_s / ela.wall_s,
    }
    print(
        f"  {label} vs colocate {x['vs_colocate']:.2f}x (paper {lo}-{hi}x: {verdict(x['vs_colocate'], lo, hi)}); "
        f"vs async default {x['vs_async_default']:.2f}x, best split {x['vs_async_best']:.2f}x, streaming best "
        f"{x['vs_async_stream']:.2f}x (paper {alo}-{ahi}x: {verdict(x['vs_async_default'], alo, ahi)} / "
        f"{verdict(x['vs_async_best'], alo, ahi)} / {verdict(x['vs_async_stream'], alo, ahi)})"
    )
    return x


def main_tables(name: str) -> dict[str, dict[str, float]]:
    base = load(name)
    b = Workload(base.workload, base.seed).sample_step(0)
    cl = base.cluster
    print(
        f"\n## {name}: {cl.cells} cells x {cl.accelerators_per_cell} accelerators, "
        f"{base.workload.groups_per_step}x{base.workload.group_size} executions/step, {base.steps} steps"
    )
    print(
        f"   step 0: tokens/execution mean {b.tokens.mean() / 1e3:.0f}K (p50 {np.median(b.tokens) / 1e3:.0f}K, "
        f"max {b.tokens.max() / 1e3:.0f}K), turns mean {b.n_turns.mean():.0f}, training of one step on all cells "
        f"{b.tokens.sum() / cl.train_tps / cl.cells / 3600:.2f} h"
    )
    out: dict[str, dict[str, float]] = {}
    for unit in ("group", "execution"):
        cfg = with_policy(base, train_unit=unit)
        col, ela, gated = simulate(cfg, "colocate"), simulate(cfg, "elastic"), simulate(cfg, "elastic-gated")
        easync = simulate(cfg, "elastic-async")
        adef = simulate(cfg, "async")
        k, abest = best_async(cfg, stream=False)
        ks, astream = best_async(cfg, stream=True)
        kc, acomp = best_async(with_policy(cfg, async_batch_order="completion"), stream=True)
        print(f"\n  trainable unit: {unit}")
        print(
            f"  {'policy':<30} {'wall h':>7} {'elastic':>8} {'accel-h':>9} {'post h':>6} {'idle R':>7} "
            f"{'util R':>7} {'idle T':>7} {'stale':>5} {'abort':>5} {'switch':>5}"
        )
        d = max(1, cl.cells // 4)
        for label, r in (
            ("colocate", col),
            (f"async (default {d} train cells)", adef),
            (f"async (best: {k} train cells)", abest),
            (f"async stream (best: {ks})", astream),
            (f"async stream compl. (best: {kc})", acomp),
            ("elastic (paper rule)", ela),
            ("elastic-gated (+ ready work)", gated),
            ("elastic-async (this repo)", easync),
        ):
            print(row(label, r, ela))
        best_stream = min(astream, acomp, key=lambda r: r.wall_s)
        out[f"{unit}/elastic"] = speedups("elastic      ", ela, col, adef, abest, best_stream, name)
        out[f"{unit}/elastic-gated"] = speedups("elastic-gated", gated, col, adef, abest, best_stream, name)
        out[f"{unit}/elastic-async"] = speedups("elastic-async", easync, col, adef, abest, best_stream, name)
        others = {
            "colocate": col,
            "elastic": ela,
            "elastic-gated": gated,
            "async default": adef,
            "async best": abest,
            "async stream": astream,
            "async stream completion": acomp,
        }
        slowest = min(others, key=lambda n: others[n].wall_s / easync.wall_s)
        print(
            f"  elastic-async vs the strongest other schedule ({slowest}): "
            f"{others[slowest].wall_s / easync.wall_s:.2f}x"
        )
    return out


def sweep_switch_cost() -> None:
    print("\n## Sensitivity: role-switch cost (qwengyre_nl2repo, 3 steps, trainable unit group)")
    print(
        f"  {'x measured':>10} {'to train s':>10} {'to rollout s':>12} {'colocate h':>10} {'elastic h':>9} "
        f"{'speedup':>8} {'switches':>8}"
    )
    for mult in (0, 1, 5, 20, 60):
        cfg = load(
            "qwengyre_nl2repo",
            "steps=3",
            f"cluster.switch_to_train_s={8.52 * mult}",
            f"cluster.switch_to_rollout_s={3.46 * mult}",
        )
        col, ela = simulate(cfg, "colocate"), simulate(cfg, "elastic")
        print(
            f"  {mult:>10} {8.52 * mult:10.1f} {3.46 * mult:12.1f} {col.metrics['wall_h']:10.2f} "
            f"{ela.metrics['wall_h']:9.2f} {col.wall_s / ela.wall_s:7.2f}x {ela.metrics['switches']:8.0f}"
        )


def sweep_tail() -> None:
    print("\n## Sensitivity: tail heaviness (qwengyre_nl2repo, 3 steps; turns lognormal median 110)")
    print(
        f"  {'sigma':>5} {'timeout':>7} {'p50 h':>6} {'max h':>6} {'at cap':>6} {'unit':>9} {'colocate h':>10} "
        f"{'elastic h':>9} {'vs col':>7} {'async h':>8} {'vs async':>8} {'gated h':>8} {'vs col':>7} {'vs async':>8}"
    )
    for sigma in (0.3, 0.5, 0.75, 1.0):
        for timeout in ("18000", "none"):
            sets = ["steps=3", f"workload.turns.sigma={sigma}"]
            cfg0 = load("qwengyre_nl2repo", *sets)
            if timeout == "none":
                cfg0.workload.timeout_s = None
            b = Workload(cfg0.workload, 0).sample_step(0)
            nominal = np.add.reduceat(b.completion / cfg0.workload.timeout_ref_tps + b.tool_s, b.offsets[:-1])
            cap = float(np.mean(nominal > 0.95 * 18000))
            for unit in ("group", "execution"):
                cfg = with_policy(cfg0, train_unit=unit)
                col, ela, gat = simulate(cfg, "colocate"), simulate(cfg, "elastic"), simulate(cfg, "elastic-gated")
                _, asy = best_async(cfg, stream=False)
                print(
                    f"  {sigma:5.2f} {timeout:>7} {np.median(nominal) / 3600:6.2f} {nominal.max() / 3600:6.2f} "
                    f"{100 * cap:5.1f}% {unit:>9} {col.metrics['wall_h']:10.2f} {ela.metrics['wall_h']:9.2f} "
                    f"{col.wall_s / ela.wall_s:6.2f}x {asy.metrics['wall_h']:8.2f} {asy.wall_s / ela.wall_s:7.2f}x "
                    f"{gat.metrics['wall_h']:8.2f} {col.wall_s / gat.wall_s:6.2f}x {asy.wall_s / gat.wall_s:7.2f}x"
                )
    print("  (nominal durations count tool latency and decoding at timeout_ref_tps; async = best split)")


def sweep_granularity() -> None:
    print("\n## Sensitivity: cell granularity, same 256 accelerators (qwengyre_nl2repo, 3 steps, trainable unit group)")
    print("   a cell of f x 4 nodes = f replicas of a 4-node cell: one trajectory decodes and trains at a 4-node")
    print("   replica's speed; replicas train in lockstep (FSDP), claiming from the shared queue in order, or")
    print("   longest first (balanced). 16 x 2 nodes: half-size replicas.")
    base = load("qwengyre_nl2repo", "steps=3")
    pols = ("colocate", "elastic", "elastic-gated", "elastic-async")
    print(f"  {'layout':>12} {'claim':>9} " + " ".join(f"{p + ' h':>15} {'vs 8x4':>7}" for p in pols))
    for balance in (False, True):
        ref: dict[str, float] = {}
        for factor in (1, 0.5, 2, 4):
            cfg = with_policy(base, balance_micro_batches=balance)
            cfg.cluster = base.cluster.regrouped(factor)
            cols = []
            for p in pols:
                r = simulate(cfg, p)
                ref.setdefault(p, r.wall_s)
                cols.append(f"{r.metrics['wall_h']:15.2f} {100 * (r.wall_s / ref[p] - 1):+6.1f}%")
            layout = f"{cfg.cluster.cells} x {cfg.cluster.accelerators_per_cell // 8}"
            print(f"  {layout:>12} {'balanced' if balance else 'in order':>9} " + " ".join(cols))
    print(f"  (paper: 4 cells x 8 nodes costs +{100 * PAPER_GRANULARITY:.1f}% vs 8 x 4; each session is pinned to one")
    print("   inference replica of its cell; 'balanced' claims longest first at every cell size)")


def sweep_gate() -> None:
    print("\n## Sensitivity: ready-work gate threshold (3 steps, trainable unit group)")
    print("  gate_ready_per_cell = unclaimed micro-batches per train cell (the moving one included) before a move")
    print(
        f"  {'workload':>16} {'per cell':>8} {'elastic h':>9} {'vs paper rule':>13} {'idle T':>7} "
        f"{'train share':>11} {'migrations':>10}"
    )
    for name in ("qwengyre_nl2repo", "qwengyre_122b"):
        cfg = load(name, "steps=3")
        ref = simulate(cfg, "elastic")
        runs = [("paper rule", ref)] + [
            (f"{g:g}", simulate(load(name, "steps=3", f"policy.elastic_gate_ready_per_cell={g}"), "elastic-gated"))
            for g in (0.25, 1, 2, 4, 8)
        ]
        for label, r in runs:
            m = r.metrics
            print(
                f"  {name:>16} {label:>8} {m['wall_h']:9.2f} {ref.wall_s / r.wall_s:12.3f}x "
                f"{100 * m['idle_train']:6.1f}% {100 * m['frac_train']:10.1f}% {m['migrations']:10.0f}"
            )
    print("  (0.25: one waiting micro-batch per four train cells; the elastic-gated rows above use the default, 1)")


def sweep_train_share() -> None:
    print("\n## Sensitivity: training time vs rollout time (qwengyre_nl2repo, 3 steps, trainable unit group)")
    print("  T = one step's training on all cells; R = colocate's rollout per step (start -> last execution)")
    print(
        f"  {'train_tps':>9} {'T h':>5} {'R h':>5} {'T/R':>5} {'colocate h':>10} {'elastic h':>9} {'vs col':>7} "
        f"{'gated h':>8} {'vs col':>7} {'bound':>6}"
    )
    base = load("qwengyre_nl2repo", "steps=3")
    tokens = Workload(base.workload, base.seed).sample_step(0).tokens.sum()
    for mult in (4.0, 2.0, 1.0, 0.5, 0.25):
        tps = base.cluster.train_tps * mult
        cfg = load("qwengyre_nl2repo", "steps=3", f"cluster.train_tps={tps}")
        col, ela, gat = simulate(cfg, "colocate"), simulate(cfg, "elastic"), simulate(cfg, "elastic-gated")
        T = tokens / tps / cfg.cluster.cells / 3600
        R = col.metrics["wall_h"] / cfg.steps - col.metrics["post_rollout_h"]
        print(
            f"  {tps:9.0f} {T:5.2f} {R:5.2f} {T / R:5.2f} {col.metrics['wall_h']:10.2f} {ela.metrics['wall_h']:9.2f} "
            f"{col.wall_s / ela.wall_s:6.2f}x {gat.metrics['wall_h']:8.2f} {col.wall_s / gat.wall_s:6.2f}x "
            f"{(R + T) / max(R, T):5.2f}x"
        )
    print("  (bound: (R + T) / max(R, T): with a per-step on-policy barrier a step lasts at least its rollout R and at")
    print("   least its training on every cell T, while colocate pays R + T; the paper's 1.85x needs T close to R and")
    print("   nearly all training hidden behind rollout)")


def sweep_decode_scaling() -> None:
    print("\n## Sensitivity: how much faster a sequence decodes on a lightly loaded cell (qwengyre_nl2repo, 3 steps,")
    print("   trainable unit group; throughput at full load fixed, tps(n) = g * n**exponent)")
    print(
        f"  {'exponent':>8} {'alone/full':>10} {'colocate h':>10} {'elastic h':>9} {'vs col':>7} {'gated h':>8} "
        f"{'vs col':>7}"
    )
    base = load("qwengyre_nl2repo", "steps=3")
    C = base.cluster.capacity
    full = base.cluster.per_seq_tps(C)
    for ex in (0.7, 0.85, 1.0):
        g = full / C ** (ex - 1)
        cfg = load(
            "qwengyre_nl2repo", "steps=3", f"cluster.gen_concurrency_exponent={ex}", f"cluster.gen_tps_single={g}"
        )
        col, ela, gat = simulate(cfg, "colocate"), simulate(cfg, "elastic"), simulate(cfg, "elastic-gated")
        print(
            f"  {ex:8.2f} {g / full:9.2f}x {col.metrics['wall_h']:10.2f} {ela.metrics['wall_h']:9.2f} "
            f"{col.wall_s / ela.wall_s:6.2f}x {gat.metrics['wall_h']:8.2f} {col.wall_s / gat.wall_s:6.2f}x"
        )
    print("  (elastic packs the tail onto fewer rollout cells, colocate leaves stragglers alone on theirs: the more a")
    print("   lone sequence speeds up, the more colocate's tail gains)")


def sweep_staleness() -> None:
    print(
        "\n## Sensitivity: staleness bound η (qwengyre_nl2repo, 3 steps; async: 4 train cells; e-async: elastic-async)"
    )
    print(f"  {'eta':>3} {'stream':>6} {'async h':>8} {'stale mean':>10} {'stale max':>9} {'idle train':>10}")
    for eta in (0, 1, 2, 4):
        for stream in (False, True):
            cfg = with_policy(
                load("qwengyre_nl2repo", "steps=3"), staleness=eta, async_train_cells=4, async_stream=stream
            )
            r = simulate(cfg, "async")
            m = r.metrics
            print(
                f"  {eta:3d} {str(stream):>6} {m['wall_h']:8.2f} {m['staleness_mean']:10.2f} "
                f"{m['staleness_max']:9.0f} {100 * m['idle_train']:9.1f}%"
            )
        r = simulate(with_policy(load("qwengyre_nl2repo", "steps=3"), staleness=eta), "elastic-async")
        m = r.metrics
        print(
            f"  {eta:3d} {'e-async':>6} {m['wall_h']:8.2f} {m['staleness_mean']:10.2f} "
            f"{m['staleness_max']:9.0f} {100 * m['idle_train']:9.1f}%"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="main tables only")
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("# Simulated schedules vs QwenGyre's claims (arXiv 2609.33848)")
    print("# columns: wall h; elastic = this policy's wall time / elastic's; accel-h = accelerator-hours;")
    print("# idle R / idle T = share of rollout / train time with nothing running; util R = rollout throughput")
    print("# used (tps(n)/tps(capacity)); stale = max staleness; abort = aborted turns; switch = role switches")
    summary = {name: main_tables(name) for name in ("qwengyre_nl2repo", "qwengyre_122b")}
    print("\n## Summary: speedup of each elastic variant (wall time of the other schedule / its own)")
    print("  (async stream = the faster of the best streaming split in dispatch and in completion order)")
    print(
        f"  {'workload':>16} {'unit':>9} {'variant':>13} {'vs colocate':>11} {'vs async def':>12} "
        f"{'vs async best':>13} {'vs async stream':>15}"
    )
    for name, res in summary.items():
        for key, x in res.items():
            unit, variant = key.split("/")
            print(
                f"  {name:>16} {unit:>9} {variant:>13} {x['vs_colocate']:10.2f}x {x['vs_async_default']:11.2f}x "
                f"{x['vs_async_best']:12.2f}x {x['vs_async_stream']:14.2f}x"
            )
    print(
        f"  paper: vs colocate {PAPER_VS_COLOCATE[0]}-{PAPER_VS_COLOCATE[1]}x; vs async "
        + ", ".join(f"{k} {lo}-{hi}x" for k, (lo, hi) in PAPER_VS_ASYNC.items())
    )
    if not args.quick:
        sweep_switch_cost()
        sweep_tail()
        sweep_granularity()
        sweep_gate()
        sweep_train_share()
        sweep_decode_scaling()
        sweep_staleness()
    print(f"\n(simulated in {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
