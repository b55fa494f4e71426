"""Report for a CPU RL experiment: a (longer) SFT student, one or more GRPO runs
from it, and the same evaluations of each model side by side.

Usage:
    python benchmarks/rl_cpu_report.py --out benchmarks/results/rl_cpu \\
        --sft-metrics runs/sft_long/metrics.jsonl \\
        --run "lr 1e-4=runs/rl_a" --run "lr 3e-4=runs/rl_b" \\
        --eval "SFT=runs/eval_sft" --eval "SFT+GRPO lr 1e-4=runs/eval_a" ... [--notes notes.md]

Each ``--eval`` directory holds ``valid_seen/`` (greedy panel) and ``train128/``
(128 train games drawn with replacement, sampled at the RL temperature) written
by ``evoharness eval``; each ``--run`` directory is an ``evoharness rl`` output.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from evoharness.eval.report import plot_success
from evoharness.eval.run_report import _plot_curves, _read_jsonl, _smooth, rl_section, success_table


def _pairs(items: list[str]) -> list[tuple[str, Path]]:
    return [(k, Path(v)) for k, v in (i.split("=", 1) for i in items)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sft-metrics", default=None)
    ap.add_argument("--run", action="append", default=[], help="LABEL=RL_OUT_DIR")
    ap.add_argument("--eval", action="append", default=[], help="LABEL=EVAL_DIR")
    ap.add_argument("--notes", default=None, help="Markdown appended at the end")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evals = _pairs(args.eval)
    md = ["# EvoHarness-RL on a 2-core CPU: GRPO from a longer-trained SFT student", ""]
    for split, title in (("valid_seen", "valid_seen panel, greedy, step cap 50"),
                         ("train128", "train: 128 games drawn with replacement, sampled at the RL temperature, cap 30")):
        systems = {k: json.loads((d / split / "summary.json").read_text()) for k, d in evals
                   if (d / split / "summary.json").is_file()}
        if systems:
            plot_success(systems, out / f"success_{split}.png", title)
            md += [f"## Success: {title}", ""] + success_table(systems) + ["", f"![success](success_{split}.png)", ""]
    sft = [r for r in _read_jsonl(Path(args.sft_metrics)) if "loss" in r] if args.sft_metrics else []
    if sft:
        xs = [r["step"] for r in sft]
        _plot_curves(out / "sft_loss.png", [("SFT loss (assistant tokens)", [
            ("loss", xs, [r["loss"] for r in sft]), ("smoothed", xs, _smooth([r["loss"] for r in sft], 50))])])
        md += ["## Stage 1: SFT", "", f"{len(sft)} steps; final loss {sft[-1]['loss']:.4f}.", "", "![sft loss](sft_loss.png)", ""]
    for i, (label, run) in enumerate(_pairs(args.run)):
        md += rl_section(out, _read_jsonl(run / "metrics.jsonl"), name=f"rl_curves_{i}.png", title=f"Stage 2 GRPO: {label}")
        shutil.copy(run / "rl_config.json", out / f"rl_config_{i}.json")
    if args.notes:
        md += [Path(args.notes).read_text()]
    (out / "report.md").write_text("\n".join(md))
    print(out / "report.md")


if __name__ == "__main__":
    main()
