"""Weight extrapolation of the GRPO stage: theta_SFT + alpha * (theta_RL - theta_SFT), paired against SFT.

Usage: python -m experiments.rl_levers.rl_extrapolate --run runs/main [runs/seeds/seed1 ...] [--alphas 1.5 2 3]
       [--out runs/extrap] [--results benchmarks/results/student/rl_extrapolate] [--note TEXT]

The seed soup (`recipes.soup`) averages RL runs that moved little from a near-deterministic SFT
policy (8 steps at lr 1e-4); averaging keeps the direction the seeds share. Extrapolating that
direction past the RL endpoint (ExPO, Zheng et al. 2024, "Weak-to-Strong Extrapolation Expedites
Alignment": theta_RL + a (theta_RL - theta_SFT), so alpha here is 1 + their a) asks whether the shared
direction is under-taken: a larger step along it without the noise of a larger learning rate. Each finished main job's
``sft/final`` and ``rl/final`` give the models (written under ``--out/seed<S>/a<alpha>/model``);
each plays the job's development games and its eval split (greedy, cap 50), paired per game
against the job's own SFT evaluations, beside the job's reported RL model (alpha = 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from benchmarks.results_file import write_results


def extrapolate(sft: Path, rl: Path, alpha: float, out: Path) -> Path:
    """Write theta_SFT + alpha * (theta_RL - theta_SFT) for every tensor of `rl`'s ``*.safetensors``
    (fp32 arithmetic, stored in the RL dtype) to `out`, with `rl`'s other files; returns `out`."""
    from safetensors.torch import load_file, save_file

    from evoharness.files import atomic_dir

    def write(tmp: Path) -> None:
        for f in rl.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy2(f, tmp / f.name)
        for f in rl.glob("*.safetensors"):
            base, end = load_file(str(sft / f.name)), load_file(str(f))
            save_file(
                {k: (base[k].float() + alpha * (v.float() - base[k].float())).to(v.dtype) for k, v in end.items()},
                str(tmp / f.name),
                metadata={"format": "pt"},
            )

    return out if (out / "config.json").exists() else atomic_dir(out, write)


def run_alphas(run: Path, alphas: list[float], out: Path) -> dict:
    """Evaluate each alpha's model from main job `run`; returns its seed and one row per alpha."""
    from evoharness.eval.evaluate import evaluate_many
    from evoharness.eval.run_report import paired
    from evoharness.files import read_jsonl
    from evoharness.pipeline import RunConfig, dev_split, eval_config, model_policy

    cfg = RunConfig.model_validate_json((run / "run_config.json").read_text())
    systems = json.loads((run / "systems.json").read_text())
    out = out / f"seed{cfg.seed}"
    dev_ids = [t.task_id for t in dev_split(cfg)[1]]
    panels = {
        "dev": (dev_ids, "dev_sft", f"dev_{systems['sft_grpo']}"),
        cfg.eval_split: (None, "sft", systems["sft_grpo"]),
    }

    def episodes(ev: Path) -> list[dict]:
        return read_jsonl(ev / "episodes.jsonl")

    rows = [{"alpha": 1.0, **{p: episodes(run / "eval" / rl_dir) for p, (_, _, rl_dir) in panels.items()}}]
    for a in alphas:
        d = out / f"a{a:g}"
        model = extrapolate(run / "sft" / "final", run / "rl" / "final", a, d / "model")
        evaluate_many(
            [
                eval_config(cfg, d, f"{p}_final", model_policy(cfg, model), model / "experience.json", games)
                for p, (games, _, _) in panels.items()
                if not (d / "eval" / f"{p}_final" / "summary.json").exists()
            ]
        )
        rows.append({"alpha": a, **{p: episodes(d / "eval" / f"{p}_final") for p in panels}})
    base = {p: episodes(run / "eval" / sft_dir) for p, (_, sft_dir, _) in panels.items()}
    for r in rows:
        for p, b in base.items():
            cmp = paired(b, r[p])
            r[p] = {"won": sum(e["won"] for e in r[p]), "n": cmp["n"], "wins": cmp["b_only"], "losses": cmp["a_only"]}
    return {
        "run": str(run),
        "seed": cfg.seed,
        "eval_split": cfg.eval_split,
        "sft": {p: sum(e["won"] for e in b) for p, b in base.items()},
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", default=["runs/main"], help="finished main jobs (one per seed)")
    ap.add_argument("--alphas", nargs="+", type=float, default=[1.5, 2.0, 3.0])
    ap.add_argument("--out", default="runs/extrap")
    ap.add_argument("--results", default="benchmarks/results/student/rl_extrapolate")
    ap.add_argument("--note", default="")
    args = ap.parse_args()

    from evoharness.eval.run_report import sign_test

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = [run_alphas(Path(r), args.alphas, Path(args.out)) for r in args.run]
    panels = ["dev", runs[0]["eval_split"]]

    def cells(got: list[dict]) -> str:
        w, lo = sum(g["wins"] for g in got), sum(g["losses"] for g in got)
        return (
            f"{sum(g['won'] for g in got)}/{sum(g['n'] for g in got)} | {w} | {lo} | {float(f'{sign_test(w, lo):.3g}')}"
        )

    lines = [
        "# Extrapolating the GRPO stage's weights",
        "",
        f"`python -m experiments.rl_levers.rl_extrapolate {' '.join(sys.argv[1:])}`. Each row: theta_SFT + alpha * "
        "(theta_RL - theta_SFT) from one main job's SFT model and its RL stage's final model (the seed soup; "
        "alpha 1 is that model itself), greedy, cap 50. wins / losses: games only it / only SFT won; p: "
        "exact two-sided sign test. dev chose nothing here; it is the set a choice of alpha would use.",
        "",
        "| SFT seed | SFT | alpha | " + " | ".join(f"{p} | wins | losses | p" for p in panels) + " |",
        "|---" * (3 + 4 * len(panels)) + "|",
    ]
    lines += [
        f"| {run['seed']} | {' / '.join(str(run['sft'][p]) for p in panels)} | {r['alpha']:g} | "
        + " | ".join(cells([r[p]]) for p in panels)
        + " |"
        for run in runs
        for r in run["rows"]
    ]
    if len(runs) > 1:
        lines += [
            "",
            "Pooled over the SFT models:",
            "",
            "| alpha | " + " | ".join(f"{p} | wins | losses | p" for p in panels) + " |",
            "|---" * (1 + 4 * len(panels)) + "|",
        ]
        for a in [1.0] + args.alphas:
            lines.append(
                f"| {a:g} | "
                + " | ".join(cells([r[p] for run in runs for r in run["rows"] if r["alpha"] == a]) for p in panels)
                + " |"
            )
    lines += ["", f"{os.cpu_count()} CPUs; load average (1/5/15 min) at start {load}."] + (
        [args.note] if args.note else []
    )
    write_results(args.results, lines, runs)


if __name__ == "__main__":
    main()
