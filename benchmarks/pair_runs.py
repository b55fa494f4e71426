"""Two versions of the main job, seed by seed: one system of each, paired per game and pooled.

Usage: python benchmarks/pair_runs.py --pair SEED=BASE_DIR,NEW_DIR [SEED=BASE_DIR,NEW_DIR ...]
       [--system sft] [--results benchmarks/results/student/pair_runs] [--note TEXT]

Each pair is two finished main jobs with the same seed that differ in one lever (``BASE_DIR`` the
previous default, ``NEW_DIR`` the lever). For both panels (valid_seen: ``eval/<system>``; dev:
``eval/dev_<system>``, the seed's own held-out train games) it pairs the two runs' episodes per game
(`seed_pairs.pair_seed`): wins = games only the new run won, losses = games only the base won.
Jobs with different seeds are independent, so under the null that the lever changes nothing each
discordant game of each seed is a fair coin and the pooled row's exact sign test (the summed wins
and losses) holds. ``--system sft`` compares the SFT models (the stage a harness view changes first;
an SFT-only job, ``--set skip_rl=true``, has them); ``sft_grpo`` reads each job's reported SFT + GRPO
directory from ``systems.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from results_file import write_results
from seed_pairs import PANELS, pair_seed, pool, table_row

from evoharness.files import read_jsonl

NAMES = ("base", "new")
PREFIX = {"valid_seen": "", "dev": "dev_"}  # eval/<prefix><system>


def episodes(run: Path, system: str, panel: str) -> list[dict]:
    """One job's episodes of `system` on `panel`; exits with a message when they are missing."""
    name = system
    if system == "sft_grpo":
        systems = run / "systems.json"
        if not systems.is_file() or "sft_grpo" not in json.loads(systems.read_text()):
            sys.exit(f"{run}: no reported SFT + GRPO system (systems.json; an SFT-only job?)")
        name = json.loads(systems.read_text())["sft_grpo"]
    path = run / "eval" / f"{PREFIX[panel]}{name}" / "episodes.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: missing (not a finished main job?)")
    return read_jsonl(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, nargs="+", metavar="SEED=BASE_DIR,NEW_DIR")
    ap.add_argument("--system", default="sft", choices=("sft", "sft_grpo"))
    ap.add_argument("--results", default="benchmarks/results/student/pair_runs")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    pairs = {}
    for item in args.pair:
        seed, _, dirs = item.partition("=")
        base, _, new = dirs.partition(",")
        if not seed.strip().isdigit() or not base or not new:
            sys.exit(f"--pair wants SEED=BASE_DIR,NEW_DIR, got {item!r}")
        pairs[int(seed)] = (Path(base), Path(new))
    rows = [
        {
            "seed": seed,
            "base": str(base),
            "new": str(new),
            **pair_seed(
                {p: episodes(base, args.system, p) for p in PANELS},
                {p: episodes(new, args.system, p) for p in PANELS},
                NAMES,
            ),
        }
        for seed, (base, new) in pairs.items()
    ]
    summary = {"system": args.system, "seeds": rows, "pooled": pool(rows)}
    lines = [
        "# Two versions of the main job, seed by seed",
        "",
        f"`python benchmarks/pair_runs.py {' '.join(sys.argv[1:])}`",
        "",
        f"System: {args.system}. wins / losses: games only the new run / only the base run won, paired per "
        "game; p: exact two-sided sign test; pooled: the seeds' summed wins and losses.",
        "",
        "| seed | base valid_seen | new valid_seen | wins | losses | p | base dev | new dev | wins | losses | p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [table_row(str(r["seed"]), r, NAMES, f"{r['dev']['p']:.3g}") for r in rows]
    tot = {
        p: (sum(r[p]["base"] for r in rows), sum(r[p]["new"] for r in rows), sum(r[p]["games"] for r in rows))
        for p in PANELS
    }
    po = summary["pooled"]
    lines.append(
        f"| **pooled** | {tot['valid_seen'][0]}/{tot['valid_seen'][2]} | {tot['valid_seen'][1]}/"
        f"{tot['valid_seen'][2]} | **{po['valid_seen']['wins']}** | **{po['valid_seen']['losses']}** | "
        f"**{po['valid_seen']['p']:.2g}** | {tot['dev'][0]}/{tot['dev'][2]} | {tot['dev'][1]}/{tot['dev'][2]} | "
        f"{po['dev']['wins']} | {po['dev']['losses']} | {po['dev']['p']:.2g} |"
    )
    lines += ["", args.note] if args.note else []
    write_results(args.results, lines, summary)


if __name__ == "__main__":
    main()
