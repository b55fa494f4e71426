"""Scripted policies on the fixed panels: the figures the README quotes for them.

Usage: python benchmarks/bench_policies.py [--engine fast]
           [--systems expert-bpe,expert-react,teacher,teacher-train,random]

Each system is one `evoharness eval` run (`eval.evaluate`, protocol ``panel``, step cap 50,
seed 0, native wording): the privileged planner expert through the BPE and the ReAct harness
(an upper bound / sanity check of the harnesses), the non-privileged scripted BPE teacher on
valid_seen and on the bundled train games (the SFT data source), and the random policy.
Prints one Markdown row per system: games, wins, success, mean steps, wall seconds.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from evoharness.config.eval import EvalConfig
from evoharness.eval.evaluate import evaluate

SYSTEMS = {
    "expert-bpe": ("valid_seen", "expert", "bpe"),
    "expert-react": ("valid_seen", "expert", "react"),
    "teacher": ("valid_seen", "teacher", "bpe"),
    "teacher-train": ("train", "teacher", "bpe"),
    "random": ("valid_seen", "random", "bpe"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="fast", choices=("fast", "textworld"))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    print(f"engine={args.engine}, protocol panel (step cap 50), seed 0, native wording\n")
    print("| system | split | policy | harness | games | won | success % | mean steps | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.systems.split(","):
        split, policy, harness = SYSTEMS[name]
        with tempfile.TemporaryDirectory() as tmp:
            cfg = EvalConfig(
                split=split,
                out_dir=tmp,
                resume=False,
                workers=args.workers,
                env={"engine": args.engine},
                harness={"kind": harness},
                policy={"kind": policy},
            )
            t = time.perf_counter()
            s = evaluate(cfg, progress=False)["overall"]
            wall = time.perf_counter() - t
        print(
            f"| {name} | {split} | {policy} | {harness} | {s['n']} | {s['won']} | {s['success']} | "
            f"{s['mean_steps']} | {wall:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
