"""Stock-engine load/step times per task type and evaluator throughput (episodes/minute).

Usage: python benchmarks/bench_evaluator.py [--games-per-type 2] [--engine textworld] [--workers 1,2]

Plays the privileged expert through the ReAct harness on the first N valid_seen
games of each type, timing load+reset and each step; then runs the evaluator on
the same games with each worker count and reports episodes per minute.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from evoharness.config.eval import EvalConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.expert import PlannerExpert
from evoharness.envs.alfworld.games import TASK_SHORT, TASK_TYPES, discover_games
from evoharness.envs.alfworld.task_info import load_task_info
from evoharness.eval.evaluate import evaluate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--games-per-type", type=int, default=2)
    ap.add_argument("--engine", default="textworld")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    games = discover_games("valid_seen")
    picked = [g for tt in TASK_TYPES for g in [x for x in games if x.task_type == tt][: args.games_per_type]]
    print(f"engine={args.engine}, {len(picked)} valid_seen games ({args.games_per_type} per type), expert actions\n")
    print("| type | load+reset s (mean) | step ms (mean) | steps/s |")
    print("|---|---|---|---|")
    for tt in TASK_TYPES:
        resets, steps = [], []
        for task in [g for g in picked if g.task_type == tt]:
            t = time.perf_counter()
            env = make_env(task, engine=args.engine)
            r = env.reset()
            resets.append(time.perf_counter() - t)
            expert = PlannerExpert(load_task_info(task.path))
            n = 0
            while not r.done and n < 50:
                cmd, _ = expert.next_action(env.facts(), r.admissible_commands)
                t = time.perf_counter()
                r = env.step(cmd)
                steps.append(time.perf_counter() - t)
                n += 1
            env.close()
        ms = 1000 * statistics.mean(steps)
        print(f"| {TASK_SHORT[tt]} | {statistics.mean(resets):.3f} | {ms:.1f} | {1000 / ms:.1f} |")
    print("\n| evaluator workers | episodes | wall s | episodes/min |")
    print("|---|---|---|---|")
    for w in [int(x) for x in args.workers.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = EvalConfig(
                split="valid_seen",
                limit=len(picked) * 2,
                workers=w,
                batch_size=1,
                out_dir=tmp,
                resume=False,
                harness={"kind": "react"},
                policy={"kind": "expert"},
                env={"engine": args.engine},
            )
            t = time.perf_counter()
            s = evaluate(cfg, progress=False)
            wall = time.perf_counter() - t
        n = s["overall"]["n"]
        print(f"| {w} | {n} | {wall:.1f} | {60 * n / wall:.1f} |")


if __name__ == "__main__":
    main()
