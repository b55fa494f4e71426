"""Repository environment costs: sandboxed command latency, hidden-suite scoring per task,
and a whole reference evaluation of the pack.

Usage: python benchmarks/bench_repo_env.py [--repeats 20] [--workers 1,2]

Prints Markdown tables (results: benchmarks/results/bench_repo_env.txt).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from evoharness.config.eval import RepoEvalConfig
from evoharness.envs.repo.sandbox import Sandbox
from evoharness.envs.repo.scorer import score_workspace
from evoharness.envs.repo.task import load_tasks
from evoharness.eval.repo_eval import evaluate_repo


def ms(xs: list[float]) -> str:
    return f"{1000 * statistics.median(xs):.0f} / {1000 * max(xs):.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    sb = Sandbox(tmp / "ws")
    print("| sandboxed command | median / max ms |\n|---|---|")
    for cmd in ("true", "python -c pass", "python -c 'import pytest'"):
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            sb.run(cmd)
            times.append(time.perf_counter() - t)
        print(f"| `{cmd}` | {ms(times)} |")
    sb.close()

    tasks = load_tasks("pack")
    print("\n| task | difficulty | n_tests | reference score | scoring s |\n|---|---|---|---|---|")
    for task in tasks:
        ws = tmp / task.task_id
        for rel, text in task.reference_files().items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
        t = time.perf_counter()
        o = score_workspace(task, ws)
        print(f"| {task.task_id} | {task.difficulty} | {task.n_tests} | {o.reward} | {time.perf_counter() - t:.2f} |")

    print("\n| reference eval of the pack | workers | wall s | tasks/min |\n|---|---|---|---|")
    for w in [int(x) for x in args.workers.split(",")]:
        cfg = RepoEvalConfig(out_dir=str(tmp / f"eval{w}"), workers=w, resume=False)
        t = time.perf_counter()
        s = evaluate_repo(cfg, progress=False)
        wall = time.perf_counter() - t
        print(
            f"| mean score {s['overall']['mean_score']:.3f} over {s['overall']['n']} | {w} | {wall:.1f} | "
            f"{60 * s['overall']['n'] / wall:.1f} |"
        )


if __name__ == "__main__":
    main()
