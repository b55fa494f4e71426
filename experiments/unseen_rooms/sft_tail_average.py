"""SFT tail averaging (issue 51): the uniform average of the SFT weights over the last part of the
cosine schedule, paired per game against the main job's own SFT model (its last weights).

Usage: python -m experiments.unseen_rooms.sft_tail_average --run runs/main --out runs/tail_average
           [--windows 0.2 0.1 0.33] [--every 50] [--results benchmarks/results/student/sft_tail_average/seed0]
       python -m experiments.unseen_rooms.sft_tail_average --pool R1/tail_average.json R2/... --results DIR

Why: the SFT models of five main-job seeds win 126-138 of 140 valid_seen and 103-118 of 120
unseen-room games (benchmarks/results/student/main_job_seeds_sft3000.md); the default seed is the
weakest. The cosine ends at lr x min_lr_ratio (2e-4), so the last weights still carry the noise
of their last small batches (4,096 tokens). Averaging iterates along the tail of one run (SWA,
Izmailov et al. 2018; LAWA, Kaddour 2022) keeps the direction the steps agree on, at no training
cost and none at inference.

How: the run's SFT stage again, bit for bit (same examples, initial weights, seed and steps; the
script checks every step's loss against the run's metrics), with a checkpoint every `--every`
steps; for a window w the checkpoints of the steps after (1 - w) x steps, the last included, are
averaged (`recipes.soup.average_weights`) and evaluated on the run's three panels
(`pipeline.evaluate_system`: valid_seen, dev, unseen rooms). The run's own SFT evaluations are the
base: the last weights of the same trajectory.

Outcome (session 35, five declared seeds): lost. The 20% window won valid_seen +11 / -8 and lost
unseen rooms +7 / -12 (benchmarks/results/student/sft_tail_average/pooled.md; JOURNAL.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from evoharness.eval.run_report import paired
from evoharness.files import read_jsonl
from experiments.unseen_rooms.sft_levers import panel_cells, write_pooled

_COPIED = (
    "teacher_traces.jsonl",
    "experience.json",
    "model_init",
    "sft_examples.jsonl",
    ".collect.done",
    ".model.done",
)
_PANELS = (("valid_seen", ""), ("dev", "dev_"), ("unseen rooms", "unseen_"))


def tail_checkpoints(ckpt_dir: Path, total: int, window: float) -> list[Path]:
    """The step checkpoints in `ckpt_dir` (``step_<N>``) with (1 - `window`) x `total` < N <= `total`,
    in step order.

    Raises:
        ValueError: `window` outside (0, 1].
    """
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1] (got {window})")
    start = (1 - window) * total
    steps = sorted((int(p.name.split("_")[1]), p) for p in ckpt_dir.glob("step_*") if p.name.split("_")[1].isdigit())
    return [p for n, p in steps if start < n <= total]


def same_trajectory(base: Path, arm: Path) -> int:
    """Steps whose loss differs between the two SFT runs' ``metrics.jsonl`` (0: the same trajectory)."""

    def losses(p: Path) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_jsonl(p) if "loss" in r}

    a, b = losses(base), losses(arm)
    return sum(a.get(s) != b.get(s) for s in a.keys() | b.keys())


def window_row(run: Path, out: Path, name: str) -> dict:
    """The averaged model `name`'s evaluations against the run's SFT model, paired per game."""
    row: dict = {"arm": name}
    for panel, prefix in _PANELS:
        base = read_jsonl(run / "eval" / f"{prefix}sft" / "episodes.jsonl")
        arm = read_jsonl(out / "eval" / f"{prefix}{name}" / "episodes.jsonl")
        row[panel] = {"base": sum(e["won"] for e in base), "won": sum(e["won"] for e in arm), "n": len(arm)}
        row[panel].update(paired(base, arm))
    return row


def table(rows: list[dict], first: str) -> list[str]:
    """Markdown rows: per panel base -> arm, +/-, p; the seen-minus-unseen gaps."""
    lines = [
        f"| {first} | "
        + " | ".join(f"{p}: SFT -> averaged | +/- | p" for p, _ in _PANELS)
        + " | gap SFT | gap averaged |",
        "|---" * (1 + 3 * len(_PANELS) + 2) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([r["arm"], *panel_cells(r)]) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/main", help="a finished main job with an unseen-room panel")
    ap.add_argument("--out", default="runs/tail_average")
    ap.add_argument("--windows", nargs="+", type=float, default=[0.2], help="fractions of the SFT steps averaged")
    ap.add_argument("--every", type=int, default=50, help="SFT steps between the averaged checkpoints")
    ap.add_argument("--results", default="benchmarks/results/student/sft_tail_average")
    ap.add_argument("--note", default="", help="a line for the report (the machine, how it ran)")
    ap.add_argument("--pool", nargs="+", type=Path, help="only pool these tail_average.json files into --results")
    args = ap.parse_args()
    if args.pool:
        print(write_pooled(args.pool, Path(args.results), title="SFT tail averaging"))
        return

    from evoharness.config.recipe import write_recipe
    from evoharness.config.run import RunConfig
    from evoharness.pipeline import evaluate_system, model_policy, model_recipe, sft, start_job
    from evoharness.recipes.soup import average_weights

    run, out, load = Path(args.run), Path(args.out), " ".join(f"{x:.2f}" for x in os.getloadavg())
    if not (run / "eval" / "unseen_sft" / "episodes.jsonl").is_file():
        sys.exit(f"{run}: no finished main job with an unseen-room panel (eval/unseen_sft)")
    out.mkdir(parents=True, exist_ok=True)
    for f in _COPIED:
        if not (out / f).exists():
            (shutil.copytree if (run / f).is_dir() else shutil.copy2)(run / f, out / f)
    cfg = json.loads((run / "run_config.json").read_text())
    cfg.update(out_dir=str(out), skip_rl=True, curve_games=0)
    cfg["sft"].update(ckpt_every=args.every, keep_checkpoints=10**6)
    job = start_job(RunConfig.model_validate(cfg), print)
    job.stage("sft", lambda: sft(job, 0))
    differ = same_trajectory(run / "sft" / "metrics.jsonl", out / "sft" / "metrics.jsonl")
    if differ:  # another CPU or code: the run's evaluations are not this trajectory's last weights
        sys.exit(f"{differ} SFT steps' losses differ from {run}'s: not the same trajectory, no paired base")
    total = job.cfg.sft.max_steps
    rows = []
    for w in args.windows:
        name = f"tail{round(100 * w):02d}"
        dirs = tail_checkpoints(out / "sft" / "checkpoints", total, w)
        if not (out / name / "model.safetensors").exists():
            average_weights(dirs, out / name)
            write_recipe(out / name, model_recipe(job.cfg), job.experience)  # as the main job's SFT model
        evaluate_system(job, name, model_policy(job.cfg, out / name))
        rows.append({**window_row(run, out, name), "window": w, "checkpoints": len(dirs)})
    lines = [
        "# SFT tail averaging (issue 51)",
        "",
        f"`python -m experiments.unseen_rooms.sft_tail_average {' '.join(sys.argv[1:])}`. The SFT stage of "
        f"`{run}` rerun bit for bit ({total} steps; every step's loss equal to the run's), checkpointed every "
        f"{args.every} steps; window w: the uniform weight average of the checkpoints after step (1 - w) x "
        f"{total} up to the last, paired per game against the run's SFT model (the same trajectory's last "
        "weights; greedy, cap 50). +/-: games only the averaged / only the last weights won; p: exact "
        "two-sided sign test; gap: valid_seen minus unseen rooms in points (Newcombe 95% interval).",
        "",
        *table([{**r, "arm": f"{r['arm']} ({r['checkpoints']} weights)"} for r in rows], "window"),
        "",
        f"2 CPUs; load average (1/5/15 min) at start {load}.",
        args.note,
    ]
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / "tail_average.md").write_text("\n".join(lines).rstrip() + "\n")
    (res / "tail_average.json").write_text(json.dumps({"run": str(run), "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
