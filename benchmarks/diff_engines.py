#!/usr/bin/env python
"""Stock TextWorld engine vs the fast engine on every game: count mismatching steps.

Plays one mixed trajectory per game (planner expert, random admissible
commands, invalid commands; a quarter of the games in the ``move`` wording) on
both engines and compares every state (observation, admissible commands, won,
done, facts). Prints the number of mismatching steps, which must be zero.

    python benchmarks/diff_engines.py --data-path /tmp/alf --workers 2 \
        --out benchmarks/results/diff_engines.jsonl | tee benchmarks/results/diff_engines.txt

Per-game results go to ``--out`` (JSON lines); ``--resume`` skips games already
there, so an interrupted run can be continued. ``--memo-stock`` memoises Fast
Downward's PDDL->SAS translation inside the stock engine (it translates the
same problem four times per load+reset) and its grammar-string parsing: the
same text, 2-4x faster; see `memoized_stock_engine`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from multiprocessing import get_context

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

_MIX = None


def _init(steps: int, memo: bool) -> None:
    global _MIX
    from evoharness.envs.alfworld.fast.diff import Mix

    _MIX = Mix(steps=steps, p_invalid=0.15, p_random=0.25, after_win=2)
    if memo:
        from evoharness.envs.alfworld.fast.diff import memoized_stock_engine

        memoized_stock_engine().__enter__()  # for the worker's lifetime


def _one(job):
    from evoharness.envs.alfworld.fast.diff import run_game

    task, wording, seed = job
    t = time.time()
    rep = run_game(task, seed=seed, mix=_MIX, wording=wording)
    return {
        "task_id": rep.task_id,
        "split": task.split,
        "task_type": rep.task_type,
        "wording": wording,
        "steps": rep.steps,
        "mismatching_steps": len(rep.mismatches),
        "won": rep.won,
        "error": rep.error,
        "mismatches": rep.mismatches[:5],
        "seconds": round(time.time() - t, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-path", default="bundled", help="ALFWORLD_DATA root (holding json_2.1.1/) or 'bundled'")
    ap.add_argument("--splits", nargs="+", default=["train", "valid_seen"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="commands per trajectory (after the reset)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="only the first N games (after --offset)")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--stride", type=int, default=1, help="every k-th game (a spread-out sample)")
    ap.add_argument("--out", default="", help="per-game JSON lines")
    ap.add_argument("--resume", action="store_true", help="skip games already in --out")
    ap.add_argument("--memo-stock", action="store_true", help="memoise FD's translation in the stock engine")
    args = ap.parse_args()

    from evoharness.envs.alfworld.games import TASK_TYPES, discover_games

    tasks = [t for split in args.splits for t in discover_games(split, data_path=args.data_path)]
    tasks = tasks[args.offset :: args.stride]
    if args.limit:
        tasks = tasks[: args.limit]
    done: dict[tuple, dict] = {}
    if args.resume and args.out and os.path.exists(args.out):
        for line in open(args.out):
            r = json.loads(line)
            done[(r["split"], r["task_id"])] = r
    jobs = [
        (t, "move" if i % 4 == 3 else "native", args.seed)
        for i, t in enumerate(tasks)
        if (t.split, t.task_id) not in done
    ]
    print("command: " + " ".join(sys.argv), flush=True)
    print(f"{len(tasks)} games ({len(done)} already done), {args.workers} workers, {args.steps} steps each", flush=True)

    from tqdm import tqdm

    results = [done[k] for k in ((t.split, t.task_id) for t in tasks) if k in done]
    out = open(args.out, "a") if args.out else None
    t0 = time.time()
    ctx = get_context("fork")
    # fresh workers every 50 games: the stock engine's memory grows with every game it loads
    with ctx.Pool(args.workers, initializer=_init, initargs=(args.steps, args.memo_stock), maxtasksperchild=50) as pool:
        bar = tqdm(pool.imap_unordered(_one, jobs), total=len(jobs), file=sys.stderr, mininterval=5)
        bad = 0
        for r in bar:
            results.append(r)
            bad += r["mismatching_steps"]
            bar.set_postfix(mismatching_steps=bad)
            if out:
                out.write(json.dumps(r, default=str) + "\n")
                out.flush()
    wall = time.time() - t0

    steps = sum(r["steps"] for r in results)
    mism = sum(r["mismatching_steps"] for r in results)
    by_type = Counter(r["task_type"] for r in results)
    by_split = Counter(r["split"] for r in results)
    by_wording = Counter(r["wording"] for r in results)
    won = sum(r["won"] for r in results)
    errors = [r for r in results if r["error"]]
    print(
        f"games compared: {len(results)} ({', '.join(f'{k} {v}' for k, v in sorted(by_split.items()))}; "
        f"wording {', '.join(f'{k} {v}' for k, v in sorted(by_wording.items()))})"
    )
    print("by task type: " + ", ".join(f"{t} {by_type.get(t, 0)}" for t in TASK_TYPES))
    print(f"states compared (reset + steps): {steps}; trajectories that won: {won}")
    print(f"games with a mismatch: {sum(1 for r in results if r['mismatching_steps'])}; errors: {len(errors)}")
    print(f"mismatching steps: {mism}")
    for r in [r for r in results if r["mismatching_steps"]][:10]:
        print(
            f"  {r['split']}/{r['task_id']} ({r['wording']}): {r['mismatching_steps']} -> "
            f"{json.dumps(r['mismatches'][:1], default=str)[:400]}"
        )
    print(f"wall time this run: {wall / 60:.1f} min for {len(jobs)} games")
    return 1 if mism else 0


if __name__ == "__main__":
    sys.exit(main())
