"""The main job across seeds: its run-to-run spread, and GRPO against SFT pooled over seeds.

Usage: python benchmarks/main_job_seeds.py --seeds 0 1 2 [--root runs/seeds] [--run SEED=DIR [SEED=DIR ...]]
       [--set KEY=VALUE ...] [--results benchmarks/results/student/main_job_seeds] [--note TEXT]

Each seed is one full main job (``benchmarks/main_job.py --set seed=S``, in its own process) in
``<root>/seed<S>``; a finished job is read, an unfinished one resumes. ``--run S=DIR`` reads a main
job already run with seed S instead (same settings). `RunConfig.seed` draws everything the job
draws: the 60 development games, the model's initial weights, the SFT batch order, the screened
RL games and the RL samples; valid_seen is the same 140 games for every seed.

One job's paired comparison (SFT + GRPO against SFT, per game) can only reach significance when
SFT loses enough games for GRPO to win: at 132/140 it needs 6 wins and no loss. Pooled over
independent jobs the discordant games add up: under the null that GRPO changes nothing, each
discordant game of each job is a fair coin, so the pooled sign test (`seed_pairs.pool`: the
summed wins and losses) is exact. The pooled row is that test; the spread row is the
sample standard deviation of each system's success over the seeds. A second table pairs the GRPO
stage's last checkpoint with SFT before the development games choose between them (its dev test is a
fair one), a third gives each seed's wasted steps per episode, also on the games both won, and a
fourth the cost test (issue 50): on the games both SFT and SFT + GRPO won (valid_seen and dev), the
per-game differences in steps and in harness calls, per seed and pooled over seeds, each with the
exact sign-flip permutation test (`eval.cost`; pooled: every seed's games in one test, each game's
sign a fair coin under the null).

Writes ``<results>.md``, ``.json`` and ``.png`` (success per seed, both systems).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from seed_pairs import PANELS, pair_seed, pool, table_row

from evoharness.eval.cost import cost_pairs, summarize_pairs
from evoharness.eval.run_report import wasted_steps
from evoharness.files import read_jsonl

SYSTEMS = ("sft", "sft_grpo")
LAST = ("sft", "rl_last")


def run_seed(seed: int, root: Path, sets: list[str]) -> Path:
    """Run (or resume) the main job of `seed` in ``root/seed<seed>``; returns its directory."""
    out = root / f"seed{seed}"
    if not (out / "report.md").exists():
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("main_job.py")),
            "--out",
            str(out),
            "--results",
            str(out / "report"),
            "--set",
            f"seed={seed}",
            *sets,
        ]
        subprocess.run(cmd, check=True)
    return out


def read_job(out: Path) -> dict:
    """A finished main job's SFT, SFT + GRPO and (when it was played) last RL checkpoint episodes on both
    panels, and its stage minutes."""
    systems_file = out / "systems.json"
    if not systems_file.exists():
        raise SystemExit(f"{out}: no systems.json (not a finished main job)")
    systems = json.loads(systems_file.read_text())
    if "sft_grpo" not in systems:
        raise SystemExit(f"{out}: the job reported no SFT + GRPO model (skip_rl?)")
    dirs = {name: systems[name] for name in SYSTEMS}
    if (out / "eval" / "rl_last" / "episodes.jsonl").exists():  # played before the development games choose
        dirs["rl_last"] = "rl_last"
    episodes = {
        name: {
            "valid_seen": read_jsonl(out / "eval" / d / "episodes.jsonl"),
            "dev": read_jsonl(out / "eval" / f"dev_{d}" / "episodes.jsonl"),
        }
        for name, d in dirs.items()
    }
    seconds = sum(float(m.read_text() or 0) for m in out.glob(".*.done"))
    seed = json.loads((out / "run_config.json").read_text())["seed"]
    return {"dir": str(out), "seed": seed, "episodes": episodes, "minutes": seconds / 60}


def summarise(jobs: dict[int, dict]) -> dict:
    """Per seed and pooled: each system's wins on each panel, GRPO against SFT per game (the reported
    SFT + GRPO, and the GRPO stage's last checkpoint where every job played it), and the games SFT
    lost in any seed (valid_seen) with each seed's outcome."""
    rows = []
    for seed, job in jobs.items():
        eps = job["episodes"]
        rows.append(
            {
                "seed": seed,
                "dir": job["dir"],
                "minutes": round(job["minutes"], 1),
                **pair_seed(eps["sft"], eps["sft_grpo"], SYSTEMS),
            }
        )
    spread = {
        p: {
            s: (
                statistics.mean(r[p][s] for r in rows),
                statistics.stdev(r[p][s] for r in rows) if len(rows) > 1 else 0.0,
            )
            for s in SYSTEMS
        }
        for p in PANELS
    }
    lost = {}
    for seed, job in jobs.items():
        sft = {e["task_id"]: e for e in job["episodes"]["sft"]["valid_seen"]}
        rl = {e["task_id"]: e["won"] for e in job["episodes"]["sft_grpo"]["valid_seen"]}
        for g, e in sft.items():
            if not e["won"] or not rl.get(g, False):
                lost.setdefault(g, {})[seed] = (bool(e["won"]), bool(rl.get(g, False)))
    waste = [
        {"seed": seed, **wasted(job["episodes"]["sft"]["valid_seen"], job["episodes"]["sft_grpo"]["valid_seen"])}
        for seed, job in jobs.items()
    ]
    cost_keys = ("steps", "harness_calls")
    pairs = {
        seed: {
            k: [pr for p in PANELS for pr in cost_pairs(job["episodes"]["sft"][p], job["episodes"]["sft_grpo"][p], k)]
            for k in cost_keys
        }
        for seed, job in jobs.items()
    }
    cost = {
        "seeds": [{"seed": seed, **{k: summarize_pairs(v[k]) for k in cost_keys}} for seed, v in pairs.items()],
        "pooled": {k: summarize_pairs([pr for v in pairs.values() for pr in v[k]]) for k in cost_keys},
        "games": {str(seed): len(v["steps"]) for seed, v in pairs.items()},
    }
    last = [
        {"seed": seed, **pair_seed(job["episodes"]["sft"], job["episodes"]["rl_last"], LAST)}
        for seed, job in jobs.items()
        if "rl_last" in job["episodes"]
    ]
    return {
        "seeds": rows,
        "spread": spread,
        "pooled": pool(rows),
        "wasted": waste,
        "cost": cost,
        **({"rl_last": {"seeds": last, "pooled": pool(last)}} if last and len(last) == len(rows) else {}),
        "lost_games": {g: {str(s): list(o) for s, o in v.items()} for g, v in sorted(lost.items())},
    }


def wasted(sft: list[dict], rl: list[dict]) -> dict:
    """Wasted steps per valid_seen episode (`eval.run_report.wasted_steps`: invalid + repeated
    (action, feedback) turns) of SFT and SFT + GRPO: ``{"all": (sft, rl), "both_won": (sft, rl),
    "both_won_games"}``; on the games both won a lost episode's loop does not count."""

    def per_ep(eps: list[dict]) -> float:
        return sum(sum(wasted_steps(e).values()) for e in eps) / max(1, len(eps))

    won = {e["task_id"] for e in sft if e["won"]} & {e["task_id"] for e in rl if e["won"]}
    return {
        "all": (per_ep(sft), per_ep(rl)),
        "both_won_games": len(won),
        "both_won": (per_ep([e for e in sft if e["task_id"] in won]), per_ep([e for e in rl if e["task_id"] in won])),
    }


def _cell(won_sft: bool, won_rl: bool) -> str:
    return {(True, True): "both", (False, True): "GRPO only", (True, False): "SFT only", (False, False): "neither"}[
        (won_sft, won_rl)
    ]


def write(summary: dict, results: Path, argv: list[str], note: str) -> None:
    """``<results>.md``, ``.json`` and ``.png``."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    rows = summary["seeds"]
    n = {p: rows[0][p]["games"] for p in PANELS}
    lines = [
        "# The main job across seeds",
        "",
        f"`python benchmarks/main_job_seeds.py {' '.join(argv)}`",
        "",
        "Each row is one full main job (`benchmarks/main_job.py --set seed=S`); valid_seen is the same "
        f"{n['valid_seen']} games for every seed, dev the seed's own {n['dev']} held-out train games (they chose "
        "the RL checkpoint, so their paired test is not one). wins / losses: games only SFT + GRPO / only "
        "SFT won; p: exact two-sided sign test. The pooled row sums the wins and losses of the independent "
        "jobs (a fair coin per discordant game under the null).",
        "",
        "| seed | SFT valid_seen | SFT + GRPO valid_seen | wins | losses | p | SFT dev | SFT + GRPO dev | wins | "
        "losses | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [table_row(str(r["seed"]), r, SYSTEMS, str(r["minutes"])) for r in rows]
    sp, po = summary["spread"], summary["pooled"]
    lines.append(
        f"| mean ± sd | {sp['valid_seen']['sft'][0]:.1f} ± {sp['valid_seen']['sft'][1]:.1f} | "
        f"{sp['valid_seen']['sft_grpo'][0]:.1f} ± {sp['valid_seen']['sft_grpo'][1]:.1f} | | | | "
        f"{sp['dev']['sft'][0]:.1f} ± {sp['dev']['sft'][1]:.1f} | "
        f"{sp['dev']['sft_grpo'][0]:.1f} ± {sp['dev']['sft_grpo'][1]:.1f} | | | |"
    )
    lines.append(
        f"| **pooled** | | | **{po['valid_seen']['wins']}** | **{po['valid_seen']['losses']}** | "
        f"**{po['valid_seen']['p']:.3g}** | | | {po['dev']['wins']} | {po['dev']['losses']} | |"
    )
    if last := summary.get("rl_last"):
        lp = last["pooled"]
        lines += [
            "",
            "The GRPO stage's last checkpoint against the same SFT model, before the development games "
            "choose between them (here dev is a fair paired test too):",
            "",
            "| seed | SFT valid_seen | last RL valid_seen | wins | losses | p | SFT dev | last RL dev | wins | "
            "losses | dev p |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [table_row(str(r["seed"]), r, LAST, f"{r['dev']['p']:.3g}") for r in last["seeds"]]
        lines.append(
            f"| **pooled** | | | **{lp['valid_seen']['wins']}** | **{lp['valid_seen']['losses']}** | "
            f"**{lp['valid_seen']['p']:.3g}** | | | {lp['dev']['wins']} | {lp['dev']['losses']} | "
            f"{lp['dev']['p']:.3g} |"
        )
    lines += [
        "",
        "Wasted steps per valid_seen episode (invalid actions + repeated (action, feedback) pairs), SFT -> "
        "SFT + GRPO: on every game, and on the games both won (a lost episode's loop left out):",
        "",
        "| seed | all games | games both won |",
        "|---|---|---|",
    ]
    lines += [
        f"| {w['seed']} | {w['all'][0]:.2f} -> {w['all'][1]:.2f} | {w['both_won'][0]:.2f} -> "
        f"{w['both_won'][1]:.2f} ({w['both_won_games']} games) |"
        for w in summary["wasted"]
    ]
    cost = summary["cost"]
    lines += [
        "",
        "Cost on the games both SFT and SFT + GRPO won (valid_seen and dev together, paired per game; p: exact "
        "sign-flip permutation test on the per-game differences; fewer / more: games where SFT + GRPO took "
        "fewer / more):",
        "",
        "| seed | games both won | steps SFT -> SFT + GRPO | fewer / more | p | harness calls | fewer / more | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in [*cost["seeds"], {"seed": "**pooled**", **cost["pooled"]}]:
        st, hc = r["steps"], r["harness_calls"]
        n = cost["games"].get(str(r["seed"]), sum(cost["games"].values()))
        lines.append(
            f"| {r['seed']} | {n} | {st['a']:.2f} -> {st['b']:.2f} | {st['fewer']} / {st['more']} | {st['p']:.3g} | "
            f"{hc['a']:.2f} -> {hc['b']:.2f} | {hc['fewer']} / {hc['more']} | {hc['p']:.3g} |"
        )
    seeds = [r["seed"] for r in rows]
    lines += [
        "",
        "valid_seen games lost by either system in some seed (the others: both won in every seed):",
        "",
        "| game | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]
    for g, outcomes in summary["lost_games"].items():
        cells = [_cell(*outcomes[str(s)]) if str(s) in outcomes else "both" for s in seeds]
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) when the table was written: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + ". Minutes: the job's stage wall times.",
    ]
    if note:
        lines += ["", note]
    lines += ["", f"![success per seed]({results.with_suffix('.png').name})", ""]
    results.with_suffix(".md").write_text("\n".join(lines))
    _plot(rows, results.with_suffix(".png"))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, p in zip(axes, PANELS):
        xs = range(len(rows))
        for k, (s, label) in enumerate((("sft", "SFT"), ("sft_grpo", "SFT + GRPO"))):
            ax.bar([x + (k - 0.5) * 0.38 for x in xs], [100 * r[p][s] / r[p]["games"] for r in rows], 0.38, label=label)
        ax.set_xticks(list(xs), [f"seed {r['seed']}" for r in rows])
        low = min(100 * r[p][s] / r[p]["games"] for r in rows for s in ("sft", "sft_grpo"))
        ax.set_ylim(max(0, 10 * (low // 10) - 10), 100.5)
        ax.set_title(f"{p} success %")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--root", default="runs/seeds")
    ap.add_argument(
        "--run",
        action="extend",
        nargs="+",
        default=[],
        metavar="SEED=DIR",
        help="a main job already run with this seed (same settings)",
    )
    ap.add_argument(
        "--set",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="RunConfig overrides for every seed's job (a lever; the default job has none)",
    )
    ap.add_argument("--results", default="benchmarks/results/student/main_job_seeds")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    given = {}
    for item in args.run:
        seed, sep, d = item.partition("=")
        if not sep or not seed.strip().lstrip("-").isdigit():
            raise SystemExit(f"--run wants SEED=DIR, got {item!r}")
        given[int(seed)] = Path(d)
    jobs = {s: read_job(given[s] if s in given else run_seed(s, Path(args.root), args.set)) for s in args.seeds}
    if wrong := [f"{j['dir']} ran seed {j['seed']}" for s, j in jobs.items() if j["seed"] != s]:
        raise SystemExit("--run: " + "; ".join(wrong))
    write(summarise(jobs), Path(args.results), sys.argv[1:], args.note)
    print(Path(args.results).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
