#!/usr/bin/env python
"""Stock TextWorld engine vs the fast engine, side by side in one run.

Per task type, on the same games and the same command sequences, measured
interleaved (so both see the same machine load):

- load+reset: a fresh environment plus its first ``reset()`` (stock: what every
  episode pays; fast: *cold*, the game file parsed and compiled from scratch —
  only the domain, shared by all games, stays compiled after the first game);
- warm reset: ``reset()`` of a game already loaded (the RL pattern: the fast
  engine compiles each game once);
- steps/s: random admissible commands with invalid ones mixed in.

Memory per live environment (each measured in a fresh process): RSS and
tracemalloc growth over 50 live fast environments on 50 different games
(worst case: nothing shared) and on one game, and RSS growth over a few stock
environments.

    python benchmarks/bench_engine.py --per-type 3 | tee benchmarks/results/bench_engine.txt
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from evoharness.envs.alfworld.fast import FastAlfredEnv  # noqa: E402
from evoharness.envs.alfworld.fast import game as fast_game  # noqa: E402
from evoharness.envs.alfworld.games import TASK_SHORT, TASK_TYPES, discover_games  # noqa: E402
from evoharness.envs.alfworld.textworld_env import TextWorldAlfredEnv  # noqa: E402

INVALID = ("jump", "help", "take nothing", "look", "inventory")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def commands(seed: int, n: int):
    """A command chooser: random admissible, 10% invalid (same sequence for both engines)."""
    rng = random.Random(seed)

    def pick(admissible):
        return rng.choice(INVALID) if rng.random() < 0.1 or not admissible else rng.choice(admissible)

    return pick


def time_steps(env, first, seed: int, n: int) -> tuple[float, float, list[str]]:
    pick = commands(seed, n)
    r = first
    cmds = []
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        cmd = pick(r.admissible_commands)
        cmds.append(cmd)
        r = env.step(cmd)
    return time.perf_counter() - t0, time.process_time() - c0, cmds


def bench_game(task, stock_steps: int, fast_steps: int, seed: int) -> dict:
    out = {}
    # stock
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    env = TextWorldAlfredEnv(task)
    first = env.reset()
    out["stock_reset"], out["stock_reset_cpu"] = time.perf_counter() - t0, time.process_time() - c0
    wall, cpu, cmds = time_steps(env, first, seed, stock_steps)
    out["stock_step"], out["stock_step_cpu"] = wall / stock_steps, cpu / stock_steps
    env.close()
    # fast, cold: the game compiled from scratch
    fast_game._GAMES.clear()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    env = FastAlfredEnv(task)
    first = env.reset()
    out["fast_reset"], out["fast_reset_cpu"] = time.perf_counter() - t0, time.process_time() - c0
    # fast, warm reset
    t0 = time.perf_counter()
    for _ in range(20):
        first = env.reset()
    out["fast_warm_reset"] = (time.perf_counter() - t0) / 20
    wall, cpu, _ = time_steps(env, first, seed, fast_steps)
    out["fast_step"], out["fast_step_cpu"] = wall / fast_steps, cpu / fast_steps
    env.close()
    return out


MEM_STEPS = 50  # random steps each live environment has played (its caches grow with exploration)
MEM_STEPS_STOCK = 5


def walk(env, r, seed: int, n: int = MEM_STEPS) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        r = env.step(rng.choice(r.admissible_commands))


def memory(tasks: list, n: int) -> dict:
    res = {}
    fast_game._GAMES.clear()
    old = fast_game.GAME_CACHE_SIZE
    fast_game.GAME_CACHE_SIZE = max(old, n)
    FastAlfredEnv(tasks[-1]).reset()  # the shared domain, compiled once per process
    fast_game._GAMES.clear()
    gc.collect()
    tracemalloc.start()
    base, rss0 = tracemalloc.get_traced_memory()[0], rss_mb()
    envs = []
    for i, t in enumerate(tasks[:n]):
        e = FastAlfredEnv(t)
        walk(e, e.reset(), i)
        envs.append(e)
    gc.collect()
    res["fast_distinct_trace"] = (tracemalloc.get_traced_memory()[0] - base) / len(envs) / 2**20
    res["fast_distinct_rss"] = (rss_mb() - rss0) / len(envs)
    base = tracemalloc.get_traced_memory()[0]
    same = []
    for i in range(n):
        e = FastAlfredEnv(tasks[0])
        walk(e, e.reset(), i)
        same.append(e)
    gc.collect()
    res["fast_same_trace"] = (tracemalloc.get_traced_memory()[0] - base) / n / 2**20
    tracemalloc.stop()
    fast_game.GAME_CACHE_SIZE = old
    del envs, same
    return res


def stock_memory(tasks: list, n: int) -> float:
    TextWorldAlfredEnv(tasks[-1]).reset()  # imports and one-time set-up
    gc.collect()
    rss0 = rss_mb()
    envs = []
    for i, t in enumerate(tasks[:n]):
        e = TextWorldAlfredEnv(t)
        walk(e, e.reset(), i, MEM_STEPS_STOCK)
        envs.append(e)
    gc.collect()
    return (rss_mb() - rss0) / n


def measure_in_subprocess(kind: str, args) -> dict:
    """Memory is measured in a fresh process each, so freed memory of one
    measurement does not hide the growth of the next."""
    import json
    import subprocess

    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--_memory",
        kind,
        "--data-path",
        args.data_path,
        "--split",
        args.split,
        "--mem-envs",
        str(args.mem_envs),
        "--stock-mem-envs",
        str(args.stock_mem_envs),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-path", default="bundled")
    ap.add_argument("--split", default="valid_seen")
    ap.add_argument("--per-type", type=int, default=3)
    ap.add_argument("--stock-steps", type=int, default=15)
    ap.add_argument("--fast-steps", type=int, default=300)
    ap.add_argument("--mem-envs", type=int, default=50)
    ap.add_argument("--stock-mem-envs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_memory", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    tasks = discover_games(args.split, data_path=args.data_path)
    if args._memory:
        import json

        res = (
            memory(tasks, args.mem_envs)
            if args._memory == "fast"
            else {"stock_rss": stock_memory(tasks, args.stock_mem_envs)}
        )
        print(json.dumps(res))
        return 0
    print(
        f"ALFWorld engines, {args.split} ({args.data_path}), {args.per_type} games per type, "
        f"{args.stock_steps} stock / {args.fast_steps} fast steps per game; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
    )
    # one-time cost of the fast engine: parse + compile the (shared) domain
    fast_game.compile_domain.cache_clear()
    t0 = time.perf_counter()
    FastAlfredEnv(tasks[0]).reset()
    print(
        "fast engine one-time start-up (domain parse + join compilation, first game): "
        f"{1000 * (time.perf_counter() - t0):.0f} ms\n"
    )

    rows = []
    for tt in TASK_TYPES:
        of_type = [t for t in tasks if t.task_type == tt]
        stride = max(1, len(of_type) // args.per_type)
        sel = of_type[::stride][: args.per_type]
        res = [bench_game(t, args.stock_steps, args.fast_steps, args.seed + i) for i, t in enumerate(sel)]
        rows.append((TASK_SHORT[tt], len(sel), {k: statistics.mean(r[k] for r in res) for k in res[0]}))

    def ratio(a, b):
        return a / b if b else float("inf")

    hdr = (
        f"{'type':6} {'n':>2} | {'stock load+reset':>16} {'fast cold':>10} {'x':>6} {'fast warm':>10} {'x':>8} |"
        f" {'stock steps/s':>13} {'fast steps/s':>12} {'x':>6}"
    )
    print("wall clock (mean per game)")
    print(hdr)
    print("-" * len(hdr))
    allr = {}
    for name, n, m in rows:
        print(
            f"{name:6} {n:>2} | {m['stock_reset']:>15.2f}s {1000 * m['fast_reset']:>8.1f}ms "
            f"{ratio(m['stock_reset'], m['fast_reset']):>5.0f}x"
            f" {1000 * m['fast_warm_reset']:>8.3f}ms {ratio(m['stock_reset'], m['fast_warm_reset']):>7.0f}x |"
            f" {1 / m['stock_step']:>13.1f} {1 / m['fast_step']:>12.0f} {ratio(m['stock_step'], m['fast_step']):>5.0f}x"
        )
        for k, v in m.items():
            allr.setdefault(k, []).append(v)
    tot = {k: statistics.mean(v) for k, v in allr.items()}
    print("-" * len(hdr))
    print(
        f"{'all':6} {'':>2} | {tot['stock_reset']:>15.2f}s {1000 * tot['fast_reset']:>8.1f}ms "
        f"{ratio(tot['stock_reset'], tot['fast_reset']):>5.0f}x"
        f" {1000 * tot['fast_warm_reset']:>8.3f}ms {ratio(tot['stock_reset'], tot['fast_warm_reset']):>7.0f}x |"
        f" {1 / tot['stock_step']:>13.1f} {1 / tot['fast_step']:>12.0f} "
        f"{ratio(tot['stock_step'], tot['fast_step']):>5.0f}x"
    )
    print("\nCPU time (process_time; less sensitive to other jobs on the machine)")
    for name, _n, m in rows:
        print(
            f"{name:6} load+reset {m['stock_reset_cpu']:.2f}s vs {1000 * m['fast_reset_cpu']:.1f}ms "
            f"({ratio(m['stock_reset_cpu'], m['fast_reset_cpu']):.0f}x);"
            f" step {1000 * m['stock_step_cpu']:.0f}ms vs {1000 * m['fast_step_cpu']:.2f}ms "
            f"({ratio(m['stock_step_cpu'], m['fast_step_cpu']):.0f}x)"
        )

    mem = measure_in_subprocess("fast", args)
    smem = measure_in_subprocess("stock", args)["stock_rss"]
    print(f"\nmemory per live environment (after reset + {MEM_STEPS} random steps; stock: {MEM_STEPS_STOCK}):")
    print(
        f"  fast, {args.mem_envs} envs on {args.mem_envs} different games: {mem['fast_distinct_trace']:.2f} MB "
        f"(tracemalloc), {mem['fast_distinct_rss']:.2f} MB (RSS growth)"
    )
    print(
        f"  fast, {args.mem_envs} envs on one game (compiled game shared): "
        f"{1024 * mem['fast_same_trace']:.0f} KB (tracemalloc)"
    )
    print(f"  stock, {args.stock_mem_envs} envs on different games: {smem:.1f} MB (RSS growth)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
