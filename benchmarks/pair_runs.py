"""Two versions of the main job, seed by seed: one system of each, paired per game and pooled.

Usage: python benchmarks/pair_runs.py --pair SEED=BASE,NEW [SEED=BASE,NEW ...] [--system sft]
       [--results benchmarks/results/student/pair_runs] [--note TEXT]
       python benchmarks/pair_runs.py --studies BASE_RESULTS NEW_RESULTS [--system sft] ...

Each pair is two finished main jobs with the same seed that differ in one lever (``BASE`` the previous
default, ``NEW`` the lever), each a job directory or a job `main_job_seeds.py` kept
(``<results>.jobs/seed<S>.json.gz``, the form a committed seed study holds its jobs in). ``--studies``
pairs two such studies (their ``--results`` prefixes): every seed both kept. For each panel
(valid_seen: ``eval/<system>``; dev: ``eval/dev_<system>``, the seed's own held-out train games; the
unseen-room panel ``eval/unseen_<system>`` when every job played it) it pairs the two runs' episodes
per game (`seed_pairs.pair_seed`): wins = games only the new run won, losses = games only the base won.
Jobs with different seeds are independent, so under the null that the lever changes nothing each
discordant game of each seed is a fair coin and the pooled row's exact sign test (the summed wins
and losses) holds. ``--system sft`` compares the SFT models (the stage a harness view or an SFT
budget changes first; an SFT-only job, ``--set skip_rl=true``, has them, and no panel chose them);
``sft_grpo`` reads each job's reported SFT + GRPO model (``systems.json``), chosen on dev and the
unseen-room panel, so on those two panels its p is no clean test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from main_job_seeds import job_panels, load_kept, room_gap
from results_file import write_results
from seed_pairs import PANELS, UNSEEN, pair_seed, panel_cells, pool

NAMES = ("base", "new")


def episodes(run: Path, system: str) -> dict[str, list[dict]]:
    """``{panel: episodes}`` of `system` in one job (a directory or a kept ``.json.gz``): valid_seen,
    dev and, where the job played it, the unseen-room panel; exits with a message when the job lacks
    the system or a panel every job plays."""
    if run.name.endswith(".json.gz"):
        if not run.is_file():
            sys.exit(f"{run}: no such kept job")
        eps = load_kept(run)["episodes"]
        if system not in eps:
            sys.exit(f"{run}: the kept job has no {system} episodes")
        return eps[system]
    name = system
    if system == "sft_grpo":
        systems = run / "systems.json"
        if not systems.is_file() or "sft_grpo" not in json.loads(systems.read_text()):
            sys.exit(f"{run}: no reported SFT + GRPO system (systems.json; an SFT-only job?)")
        name = json.loads(systems.read_text())["sft_grpo"]
    for prefix in ("", "dev_"):  # the panels every finished job played
        if not (path := run / "eval" / f"{prefix}{name}" / "episodes.jsonl").is_file():
            sys.exit(f"{path}: missing (not a finished main job?)")
    return job_panels(run / "eval", name)


def study_pairs(base: str, new: str) -> dict[int, tuple[Path, Path]]:
    """``{seed: (base job, new job)}``: the kept jobs of every seed both seed studies (``--results``
    prefixes of `main_job_seeds.py`) hold; exits when they share none."""
    kept = [Path(f"{s}.jobs") for s in (base, new)]
    seeds = [{int(p.name[4:].split(".")[0]) for p in k.glob("seed*.json.gz")} for k in kept]
    both = sorted(seeds[0] & seeds[1])
    if not both:
        sys.exit(f"{kept[0]} and {kept[1]}: no seed kept in both")
    return {s: (kept[0] / f"seed{s}.json.gz", kept[1] / f"seed{s}.json.gz") for s in both}


def parse_pairs(items: list[str]) -> dict[int, tuple[Path, Path]]:
    """``--pair SEED=BASE,NEW`` arguments as ``{seed: (base, new)}``."""
    pairs = {}
    for item in items:
        seed, _, dirs = item.partition("=")
        base, _, new = dirs.partition(",")
        if not seed.strip().isdigit() or not base or not new:
            sys.exit(f"--pair wants SEED=BASE,NEW, got {item!r}")
        pairs[int(seed)] = (Path(base), Path(new))
    return pairs


def rooms(rows: list[dict]) -> dict[str, dict[str, float]]:
    """``{name: {"valid_seen", "unseen", "gap"}}``: each version's success (%) on both panels and the gap
    valid_seen minus unseen rooms (points), each the mean over the seeds of `main_job_seeds.room_gap`."""
    return {
        name: {k: statistics.mean(room_gap(r, name)[k] for r in rows) for k in ("valid_seen", UNSEEN, "gap")}
        for name in NAMES
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--pair", nargs="+", metavar="SEED=BASE,NEW")
    src.add_argument("--studies", nargs=2, metavar=("BASE_RESULTS", "NEW_RESULTS"))
    ap.add_argument("--system", default="sft", choices=("sft", "sft_grpo"))
    ap.add_argument("--results", default="benchmarks/results/student/pair_runs")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    pairs = study_pairs(*args.studies) if args.studies else parse_pairs(args.pair)
    runs = {seed: (episodes(base, args.system), episodes(new, args.system)) for seed, (base, new) in pairs.items()}
    panels = (*PANELS, UNSEEN) if all(UNSEEN in e for ab in runs.values() for e in ab) else PANELS
    rows = [
        {"seed": seed, "base": str(pairs[seed][0]), "new": str(pairs[seed][1]), **pair_seed(a, b, NAMES, panels)}
        for seed, (a, b) in runs.items()
    ]
    summary = {"system": args.system, "panels": list(panels), "seeds": rows, "pooled": pool(rows, panels)}
    if UNSEEN in panels:
        summary["rooms"] = rooms(rows)
    head = " | ".join(f"base {p} | new {p} | wins | losses | p" for p in panels)
    lines = [
        "# Two versions of the main job, seed by seed",
        "",
        f"`python benchmarks/pair_runs.py {' '.join(sys.argv[1:])}`",
        "",
        f"System: {args.system}. wins / losses: games only the new run / only the base run won, paired per "
        "game; p: exact two-sided sign test; pooled: the seeds' summed wins and losses.",
        "",
        f"| seed | {head} |",
        "|---|" + "---|" * 5 * len(panels),
    ]
    lines += [f"| {r['seed']} | " + " | ".join(panel_cells(r[p], NAMES) for p in panels) + " |" for r in rows]
    cells = []
    for p in panels:
        n = sum(r[p]["games"] for r in rows)
        po = summary["pooled"][p]
        cells += [*(f"{sum(r[p][x] for r in rows)}/{n}" for x in NAMES), f"**{po['wins']}**", f"**{po['losses']}**"]
        cells.append(f"**{po['p']:.2g}**")
    lines.append("| **pooled** | " + " | ".join(cells) + " |")
    if "rooms" in summary:
        lines += ["", "Seen vs unseen rooms, mean over the seeds (success %, gap in points):", ""]
        lines += [
            f"- {name}: valid_seen {r['valid_seen']:.2f}%, unseen rooms {r[UNSEEN]:.2f}%, gap {r['gap']:+.2f}"
            for name, r in summary["rooms"].items()
        ]
    lines += ["", args.note] if args.note else []
    write_results(args.results, lines, summary)


if __name__ == "__main__":
    main()
