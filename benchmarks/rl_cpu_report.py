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
from evoharness.eval.run_report import _plot_curves, _smooth, _trend, rl_section, success_table
from evoharness.files import read_jsonl


def _pairs(items: list[str]) -> list[tuple[str, Path]]:
    return [(k, Path(v)) for k, v in (i.split("=", 1) for i in items)]


def paired_section(out: Path, runs: dict[str, list[dict]], control: str) -> list[str]:
    """Training success of each run against the lr-0 control, step by step.

    Same seed, so step u of every run plays the same 4 games with the same
    sampling seeds: the per-step difference removes game difficulty, which
    dominates the raw curves. Reports the mean difference, its standard
    error and the number of steps won / lost / tied."""
    ctrl = {r["step"]: r["success"] for r in runs[control]}
    md = [
        f"## Training success against the lr-0 control ({control})",
        "",
        "Every run uses the same seed, so step u plays the same games with the same sampling seeds in each run; "
        "the control never changes its weights (its experience store still consolidates). The per-step "
        "difference removes the game-to-game difficulty that dominates the raw curves.",
        "",
        "| run | steps paired | mean success | control | mean difference | s.e. | difference trend / step | "
        "steps better / worse / equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    panels = []
    for label, rows in runs.items():
        if label == control:
            continue
        pairs = [(r["step"], r["success"], ctrl[r["step"]]) for r in rows if r["step"] in ctrl]
        if len(pairs) < 2:
            continue
        d = [a - c for _, a, c in pairs]
        n, mean = len(d), sum(d) / len(d)
        se = (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5
        md.append(
            f"| {label} | {n} | {sum(a for _, a, _ in pairs) / n:.3f} | {sum(c for _, _, c in pairs) / n:.3f} | "
            f"**{mean:+.3f}** | {se:.3f} | {_trend(d):+.4f} | {sum(x > 0 for x in d)} / "
            f"{sum(x < 0 for x in d)} / {sum(x == 0 for x in d)} |"
        )
        xs = [u for u, _, _ in pairs]
        running = [sum(d[: i + 1]) / (i + 1) for i in range(n)]
        panels += [
            (
                f"training success: {label} vs control",
                [(label, xs, [a for _, a, _ in pairs]), (control, xs, [c for _, _, c in pairs])],
            ),
            ("success difference (run - control)", [("per step", xs, d), ("running mean", xs, running)]),
        ]
    if panels:
        _plot_curves(out / "paired.png", panels)
        md += ["", "![paired](paired.png)", ""]
    return md


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sft-metrics", default=None)
    ap.add_argument("--run", action="append", default=[], help="LABEL=RL_OUT_DIR")
    ap.add_argument("--eval", action="append", default=[], help="LABEL=EVAL_DIR")
    ap.add_argument("--control", default=None, help="LABEL of a --run trained with lr 0 on the same game order")
    ap.add_argument("--notes", default=None, help="Markdown placed under the title (setup, findings)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evals = _pairs(args.eval)
    md = ["# EvoHarness-RL on a 2-core CPU: GRPO from a longer-trained SFT student", ""]
    if args.notes:
        md += [Path(args.notes).read_text()]
    for split, title in (
        ("valid_seen", "valid_seen panel, greedy, step cap 50"),
        ("train128", "train: 128 games drawn with replacement, sampled at the RL temperature, cap 30"),
    ):
        systems = {
            k: json.loads((d / split / "summary.json").read_text())
            for k, d in evals
            if (d / split / "summary.json").is_file()
        }
        if systems:
            plot_success(systems, out / f"success_{split}.png", title)
            md += [f"## Success: {title}", ""] + success_table(systems) + ["", f"![success](success_{split}.png)", ""]
    sft = [r for r in read_jsonl(Path(args.sft_metrics)) if "loss" in r] if args.sft_metrics else []
    if sft:
        xs = [r["step"] for r in sft]
        _plot_curves(
            out / "sft_loss.png",
            [
                (
                    "SFT loss (assistant tokens)",
                    [("loss", xs, [r["loss"] for r in sft]), ("smoothed", xs, _smooth([r["loss"] for r in sft], 50))],
                )
            ],
        )
        md += [
            "## Stage 1: SFT",
            "",
            f"{len(sft)} steps; final loss {sft[-1]['loss']:.4f}.",
            "",
            "![sft loss](sft_loss.png)",
            "",
        ]
    runs = {label: read_jsonl(run / "metrics.jsonl") for label, run in _pairs(args.run)}
    if args.control:
        md += paired_section(out, runs, args.control)
    for i, (label, run) in enumerate(_pairs(args.run)):
        md += rl_section(
            out, read_jsonl(run / "metrics.jsonl"), name=f"rl_curves_{i}.png", title=f"Stage 2 GRPO: {label}"
        )
        shutil.copy(run / "rl_config.json", out / f"rl_config_{i}.json")
    (out / "report.md").write_text("\n".join(md))
    print(out / "report.md")


if __name__ == "__main__":
    main()
