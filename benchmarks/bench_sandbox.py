"""Issue 49: what the hardening costs, and what it stops.

1. Sandboxed command overhead (``true``, ``python -c pass``) and hidden-suite scoring seconds
   per pack task (reference workspace), before (a checkout of the commit before the
   hardening, default fc1c9b3, in a temporary git worktree) and after (this checkout). The
   two run side by side: each round measures one version then the other, in fresh processes.
2. The attack suite (tests/envs/repo/attacks.py): attack -> verdict after, and whether the
   same attack got through before.

Usage: python benchmarks/bench_sandbox.py [--repeats 3] [--commands 20] [--before-commit fc1c9b3]
       [--no-attacks-before]
Prints Markdown tables (results: benchmarks/results/bench_sandbox.txt). Root and bubblewrap needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTACK_DIR = ROOT / "tests" / "envs" / "repo"


def measure(commands: int) -> dict:
    """In this process (whichever evoharness is first on sys.path): one round of timings."""
    from evoharness.envs.repo.sandbox import Sandbox
    from evoharness.envs.repo.scorer import score_workspace
    from evoharness.envs.repo.task import load_tasks

    tmp = Path(tempfile.mkdtemp(prefix="bench-sbx-"))
    out: dict = {"cmd": {}, "score": {}}
    sb = Sandbox(tmp / "ws")
    for cmd in ("true", "python -c pass"):
        ts = []
        for _ in range(commands):
            t = time.perf_counter()
            sb.run(cmd)
            ts.append(time.perf_counter() - t)
        out["cmd"][cmd] = statistics.median(ts)
    sb.close()
    for task in load_tasks("pack"):
        ws = tmp / task.task_id
        for rel, text in task.reference_files().items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
        t = time.perf_counter()
        o = score_workspace(task, ws, budget=1)
        out["score"][task.task_id] = (time.perf_counter() - t, o.reward)
    return out


def run_attack(name: str) -> tuple[str, str]:
    sys.path.insert(0, str(ATTACK_DIR))
    from attacks import ATTACKS

    from evoharness.envs.repo.task import load_tasks

    pack = {t.task_id: t for t in load_tasks("pack")}
    tmp = Path(tempfile.mkdtemp(prefix="bench-attack-"))
    try:
        return ATTACKS[name](pack, tmp)
    except Exception as e:  # noqa: BLE001 -- the verdict of a defence that did not hold
        first = (str(e).splitlines() or [""])[0]
        return "NOT DEFEATED", f"{type(e).__name__}: {first}"[:110]


def child(src: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commands", type=int, default=20)
    ap.add_argument("--before-commit", default="fc1c9b3")
    ap.add_argument("--no-attacks-before", action="store_true")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--attack", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.commands)))
        return
    if args.attack:
        print(json.dumps(run_attack(args.attack)))
        return
    wt = Path(tempfile.mkdtemp(prefix="bench-sbx-before-")) / "wt"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(wt), args.before_commit], check=True
    )
    try:
        versions = {"before": wt / "src", "after": ROOT / "src"}
        rounds: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for name, src in versions.items():
                rounds[name].append(child(src, "--measure", "--commands", str(args.commands)))
        print(
            f"before = {args.before_commit}, after = this checkout; medians of {args.repeats} alternating rounds, "
            f"{os.cpu_count()} CPUs (shared: expect noise)\n"
        )
        print("| sandboxed command | before ms | after ms | change |\n|---|---|---|---|")
        for cmd in ("true", "python -c pass"):
            b = statistics.median(r["cmd"][cmd] for r in rounds["before"])
            a = statistics.median(r["cmd"][cmd] for r in rounds["after"])
            print(f"| `{cmd}` | {1000 * b:.0f} | {1000 * a:.0f} | {100 * (a / b - 1):+.0f}% |")
        print("\n| task | before s | after s | change | reward before / after |\n|---|---|---|---|---|")
        tb = ta = 0.0
        for task in rounds["after"][0]["score"]:
            b = statistics.median(r["score"][task][0] for r in rounds["before"])
            a = statistics.median(r["score"][task][0] for r in rounds["after"])
            tb, ta = tb + b, ta + a
            rw = f"{rounds['before'][0]['score'][task][1]:g} / {rounds['after'][0]['score'][task][1]:g}"
            print(f"| {task} | {b:.2f} | {a:.2f} | {100 * (a / b - 1):+.0f}% | {rw} |")
        print(
            f"| **all {len(rounds['after'][0]['score'])} tasks** | {tb:.1f} | {ta:.1f} | "
            f"{100 * (ta / tb - 1):+.0f}% | |"
        )

        sys.path.insert(0, str(ATTACK_DIR))
        from attacks import ATTACKS

        print("\n| attack | verdict after | detail | before |\n|---|---|---|---|")
        for name in ATTACKS:
            t = time.perf_counter()
            verdict, note = child(versions["after"], "--attack", name)
            secs = time.perf_counter() - t
            before = "" if args.no_attacks_before else child(versions["before"], "--attack", name)
            was = "" if not before else "got through" if before[0] == "NOT DEFEATED" else before[0]
            print(f"| {name} | {verdict} ({secs:.1f} s) | {note} | {was} |")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], check=False)


if __name__ == "__main__":
    main()
