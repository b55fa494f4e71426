"""Generalisation check (issue 11): a run's student on ALFWorld train games that are not in this repository.

Usage:
    python benchmarks/student_unseen.py --run runs/main --data-path $ALFWORLD_DATA [--per-type 20]
                                        [MODEL_DIR ...] [--results benchmarks/results/student]

Draws ``--per-type`` games of each task type (seeded) from the ALFWorld release at
``--data-path`` (the json_2.1.1 layout: ``<root>/train/<task>/<trial>``) among those the
bundled pack (`src/evoharness/data/alfworld/`, the games the main job trains and
develops on) does not hold, and plays them with the run's evaluation settings (BPE
harness, the run's experience store, greedy, constrained, step cap, early stop): the
scripted teacher, then each model (default: the run's ``sft/final``); with several models,
each later one is also paired per game against the first (exact sign test). Writes
``unseen.md`` and ``unseen.json`` (per system its results and ``won``, per game in ``games``
order) to ``--results``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a main-job run directory (run_config.json, experience.json)")
    ap.add_argument("models", nargs="*", help="model directories (default: the run's sft/final)")
    ap.add_argument("--data-path", default=os.environ.get("ALFWORLD_DATA"), help="ALFWorld json_2.1.1 root")
    ap.add_argument("--per-type", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default="benchmarks/results/student")
    args = ap.parse_args()
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.eval.evaluate import evaluate
    from evoharness.eval.run_report import sign_test
    from evoharness.files import read_jsonl
    from evoharness.pipeline import RunConfig, eval_config, model_policy

    run = Path(args.run)
    if not (run / "run_config.json").is_file() or not (run / "experience.json").is_file():
        ap.error(f"--run {run}: no run_config.json / experience.json (a main-job run past its collect stage)")
    if not args.data_path or not (Path(args.data_path) / "train").is_dir():
        ap.error(f"--data-path {args.data_path!r}: not an ALFWorld json_2.1.1 root with a train/ directory")
    models = [Path(m) for m in args.models] or [run / "sft" / "final"]
    if missing := [str(m) for m in models if not (m / "config.json").is_file()]:
        ap.error(f"not model directories: {', '.join(missing)}")
    cfg = RunConfig.model_validate_json((run / "run_config.json").read_text())
    bundled = {t.task_id for split in ("train", "valid_seen") for t in discover_games(split, None)}
    release = discover_games("train", args.data_path)
    rng = random.Random(f"unseen:{args.seed}")
    games: list[str] = []
    for tt in sorted({t.task_type for t in release}):
        pool = sorted(t.task_id for t in release if t.task_type == tt and t.task_id not in bundled)
        games += rng.sample(pool, min(args.per_type, len(pool)))
    cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"data_path": args.data_path})})
    systems = [("scripted teacher", cfg.teacher)] + [(str(m), model_policy(cfg, m)) for m in models]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, policy) in enumerate(systems):
            s = evaluate(eval_config(cfg, Path(tmp), f"s{i}", policy, run / "experience.json", games), progress=False)
            won = {e["task_id"]: e["won"] for e in read_jsonl(Path(tmp) / "eval" / f"s{i}" / "episodes.jsonl")}
            rows.append(
                {
                    "system": name,
                    "overall": s["overall"],
                    "won": [won[g] for g in games],
                    "by_type": {tt: {"won": v["won"], "n": v["n"]} for tt, v in s["by_type"].items()},
                }
            )
            print(name, f"{s['overall']['won']}/{s['overall']['n']}", flush=True)
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / "unseen.json").write_text(json.dumps({"run": str(run), "games": games, "systems": rows}, indent=1))
    types = sorted(rows[0]["by_type"])
    lines = [
        f"# Student on ALFWorld train games outside the bundled pack (run `{run}`)",
        "",
        f"{len(games)} games, {args.per_type} per task type, drawn (seed {args.seed}) from the ALFWorld "
        f"json_2.1.1 train release among the {sum(t.task_id not in bundled for t in release)} the "
        "repository does not bundle; never trained or developed on. The run's evaluation settings: BPE harness, "
        f"its experience store, greedy, constrained decoding, step cap {cfg.max_steps}, early stop after "
        f"{cfg.stop_repeats} repeats.",
        "",
        "| system | " + " | ".join(types) + " | all | steps/ep | stopped early |",
        "|---|" + "---|" * (len(types) + 3),
    ]
    for r in rows:
        o = r["overall"]
        lines.append(
            f"| `{r['system']}` | "
            + " | ".join(f"{r['by_type'][t]['won']}/{r['by_type'][t]['n']}" for t in types)
            + f" | **{o['success']}%** ({o['won']}/{o['n']}) | {o['mean_steps']} | {o['stopped_early']} |"
        )
    if len(rows) > 2:  # each later model paired per game against the first (e.g. SFT + GRPO against SFT)
        base = rows[1]
        lines += [
            "",
            f"Paired per game against `{base['system']}`: wins = games only the model won, losses = games "
            "only the first won; p = exact two-sided sign test.",
            "",
            "| model | wins | losses | p |",
            "|---|---|---|---|",
        ]
        for r in rows[2:]:
            w = sum(a and not b for a, b in zip(r["won"], base["won"]))
            lost = sum(b and not a for a, b in zip(r["won"], base["won"]))
            lines.append(f"| `{r['system']}` | {w} | {lost} | {sign_test(w, lost):.3g} |")
    lines += ["", f"Command: `python benchmarks/student_unseen.py {' '.join(sys.argv[1:])}`"]
    (res / "unseen.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
