"""The main job on the embedded default, with its report copied into benchmarks/results/main_job/.

Usage: python benchmarks/main_job.py [--budget-minutes M] [--out runs/main] [--results benchmarks/results/main_job]
                                    [--set KEY=VALUE ...]

Runs `evoharness run` (`pipeline.run_pipeline`: teacher traces, tokenizer + from-scratch
model, SFT, DAgger, GRPO, evaluations, learning curve, report) on its default step
budgets (``--budget-minutes`` adds an optional wall-clock cap), then copies ``report.md``
and its figures to ``--results``. The committed report's Notes give the budget and
its wall time per stage.
A rerun with the same ``--out`` resumes the job.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from evoharness.config.base import load_config
from evoharness.config.run import RunConfig
from evoharness.pipeline import run_pipeline

FILES = (
    "report.md",
    "success.png",
    "unseen_success.png",
    "learning_curve.png",
    "sft_loss.png",
    "rl_curves.png",
    "curve.json",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-minutes", type=float, default=None, help="optional wall-clock cap on training")
    ap.add_argument("--out", default="runs/main")
    ap.add_argument("--results", default="benchmarks/results/main_job")
    ap.add_argument(
        "--set",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="RunConfig overrides, as `evoharness run --set` (a lever run; the default job has none)",
    )
    args = ap.parse_args()
    overrides = (
        [f'out_dir="{args.out}"']
        + ([f"budget_minutes={args.budget_minutes}"] if args.budget_minutes else [])
        + args.set
    )
    cfg = load_config(RunConfig, None, overrides)
    start = load_average()
    publish(run_pipeline(cfg), Path(args.results), start)


def publish(report: Path, dest: Path, start_load: str, device: str = "") -> None:
    """Copy a finished job's `report` (``report.md``) and its figures (`FILES`) into `dest`, with
    ``machine.txt``: the CPUs, the load average at the job's start (`start_load`, `load_average`) and now (the
    job's own processes count in it), and `device` when given (a GPU's name)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "machine.txt").write_text(
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) at start {start_load}, at end {load_average()}\n"
        + (f"device: {device}\n" if device else "")
    )
    for name in FILES:
        if (report.parent / name).is_file():
            shutil.copy2(report.parent / name, dest / name)
    print(f"report: {dest / 'report.md'}")


def load_average() -> str:
    """The 1/5/15-minute load average, formatted."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
