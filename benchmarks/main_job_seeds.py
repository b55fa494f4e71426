"""The main job across seeds: its run-to-run spread, and GRPO against SFT pooled over seeds.

Usage: python benchmarks/main_job_seeds.py --seeds 0 1 2 [--root runs/seeds] [--run SEED=DIR [SEED=DIR ...]]
       [--set KEY=VALUE ...] [--results benchmarks/results/student/main_job_seeds] [--note TEXT]

Each seed is one full main job (``benchmarks/main_job.py --set seed=S``, in its own process) in
``<root>/seed<S>``; a finished job is read, an unfinished one resumes. ``--run S=DIR`` reads a main
job already run with seed S instead (same settings; S counts as one of the seeds). Every job read is
kept, its episodes slimmed, in ``<results>.jobs/seed<S>.json.gz`` (commit it): a later call on any
machine reads a seed from there when ``<root>`` has no finished job for it, so the declared seeds can
be run over several sessions; the report names each seed's CPU. `RunConfig.seed`
draws everything the job draws: the 60 development games, the model's initial weights, the SFT
batch order, the screened RL games and the RL samples; valid_seen is the same 140 games for every
seed, and so is the unseen-room panel (floor plans no training game comes from).

Seeds declared before they run: before reading or running any job the script writes
``<results>.declared.json`` (the seeds, the ``--set`` overrides, the UTC time, the git commit); a
later call with other seeds or overrides exits (delete the file to declare anew). The report's
header quotes the declaration.

One job's paired comparison (SFT + GRPO against SFT, per game) can only reach significance when
SFT loses enough games for GRPO to win: at 132/140 it needs 6 wins and no loss. Pooled over
independent jobs the discordant games add up: under the null that GRPO changes nothing, each
discordant game of each job is a fair coin, so the pooled sign test (`seed_pairs.pool`: the
summed wins and losses) is exact. The tables:

1. Per seed, valid_seen and dev (and the unseen-room panel, ``eval/unseen_<system>``, when every job
   played it: jobs run before it existed give the two-panel table): each system's wins, GRPO's
   paired wins / losses and p; the spread row (mean ± sample sd over seeds), the pooled row, and with
   the unseen-room panel the headroom row (issue 50: valid_seen and unseen wins and losses of every
   seed in one sign test, `seed_pairs.pool_panels`). Dev, and with the unseen-room panel that panel
   too, chose the RL checkpoint: valid_seen alone is the untouched test.
2. The GRPO stage's last checkpoint against SFT before the development games choose (a fair dev test).
3. Seen vs unseen rooms (issue 51; with the unseen-room panel): per seed and system, valid_seen and
   unseen success and the gap with its Newcombe 95% interval (`eval.run_report.gap_interval`), their
   mean ± sd over seeds, and the goal check on the means (unseen >= 90%, gap <= 3 points).
4. Wasted steps per valid_seen episode, also on the games both won.
5. The cost test (issue 50): on the games both SFT and SFT + GRPO won (valid_seen and dev), the
   per-game differences in steps and in harness calls, per seed and pooled over seeds, each with the
   exact sign-flip permutation test (`eval.cost`; pooled: every seed's games in one test, each
   game's sign a fair coin under the null).
6. The valid_seen games lost by either system in some seed.

Writes ``<results>.md``, ``.json`` and ``.png`` (success per seed and panel, both systems).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from seed_pairs import PANELS, UNSEEN, pair_seed, panel_cells, pool, pool_panels, table_row

from evoharness.eval.cost import cost_pairs, summarize_pairs
from evoharness.eval.run_report import gap_interval, wasted_steps
from evoharness.files import read_jsonl

SYSTEMS = ("sft", "sft_grpo")
LAST = ("sft", "rl_last")
HEADROOM = ("valid_seen", UNSEEN)  # issue 50's headroom test; dev, the selection set proper, stays out
GOAL = {"unseen": 90.0, "gap": 3.0}  # issue 51: unseen-room success at least 90%, gap at most 3 points
WITH_P = {"valid_seen": True, "dev": False, UNSEEN: True}  # dev's p is no test: the checkpoint was chosen there
LABELS = {"sft": "SFT", "sft_grpo": "SFT + GRPO"}


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


def job_of(seed: int, given: Path | None, root: Path, sets: list[str], kept: Path) -> dict:
    """Seed `seed`'s job: the one given with --run, else the finished job in ``root/seed<seed>``, else the
    one kept in `kept` by an earlier call (possibly on another machine), else run (or resumed) now. A job
    read from a directory is kept (`keep_job`)."""
    if given is None and not (root / f"seed{seed}" / "report.md").exists() and kept.is_file():
        return load_kept(kept)
    job = read_job(given if given is not None else run_seed(seed, root, sets))
    keep_job(job, kept)
    return job


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout this script is in; None outside git."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    except OSError:
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def declare(path: Path, seeds: list[int], sets: list[str]) -> dict:
    """The declaration ``{"seeds", "sets", "utc", "commit"}`` in `path`: written now when there is none,
    else the one there, kept with its time (a resumed call declares nothing new); exits when it
    declares other seeds or overrides, so the seeds cannot be changed after their results are seen."""
    if path.exists():
        old = json.loads(path.read_text())
        if sorted(old["seeds"]) != sorted(seeds) or sorted(old["sets"]) != sorted(sets):
            raise SystemExit(
                f"{path} declares seeds {old['seeds']} with --set {old['sets']} ({old['utc']}); this call asks for "
                f"seeds {seeds} with --set {sets}. Delete {path} to declare anew."
            )
        return old
    decl = {
        "seeds": seeds,
        "sets": sets,
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(decl, indent=1))
    return decl


def read_job(out: Path) -> dict:
    """A finished main job's SFT, SFT + GRPO and (when it was played) last RL checkpoint episodes on each
    panel it played (`job_panels`), and its stage minutes."""
    systems_file = out / "systems.json"
    if not systems_file.exists():
        raise SystemExit(f"{out}: no systems.json (not a finished main job)")
    systems = json.loads(systems_file.read_text())
    if "sft_grpo" not in systems:
        raise SystemExit(f"{out}: the job reported no SFT + GRPO model (skip_rl?)")
    dirs = {name: systems[name] for name in SYSTEMS}
    if (out / "eval" / "rl_last" / "episodes.jsonl").exists():  # played before the development games choose
        dirs["rl_last"] = "rl_last"
    episodes = {name: job_panels(out / "eval", d) for name, d in dirs.items()}
    seconds = sum(float(m.read_text() or 0) for m in out.glob(".*.done"))
    seed = json.loads((out / "run_config.json").read_text())["seed"]
    return {"dir": str(out), "seed": seed, "episodes": episodes, "minutes": seconds / 60, "cpu": cpu_model()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; `platform.processor()` elsewhere): float results differ across
    CPUs, so each seed's job says where it ran."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _slim(episode: dict) -> dict:
    """An episode as the report reads it: its scalar fields and flat dicts (``meta_calls``), and per turn
    only ``kind``, ``action`` and a digest of ``feedback`` (what `wasted_steps` compares); prompts,
    completions and other lists go."""
    keep = {
        k: v
        for k, v in episode.items()
        if not isinstance(v, list | dict)
        or (isinstance(v, dict) and not any(isinstance(x, list | dict) for x in v.values()))
    }
    keep["turns"] = [
        {
            "kind": t.get("kind"),
            "action": t.get("action"),
            "feedback": hashlib.sha1(str(t.get("feedback")).encode()).hexdigest()[:12],
        }
        for t in episode.get("turns", [])
    ]
    return keep


def keep_job(job: dict, path: Path) -> None:
    """Write a read job (`read_job`), its episodes slimmed (`_slim`), to the gzipped JSON `path`,
    atomically: a later call, on this machine or another, reads the seed from it (`load_kept`) instead of
    running the job again, so a five-seed report can gather its seeds over several sessions."""
    slim = {
        **job,
        "episodes": {s: {p: [_slim(e) for e in eps] for p, eps in ps.items()} for s, ps in job["episodes"].items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    with gzip.open(tmp, "wt") as f:
        json.dump(slim, f)
    os.replace(tmp, path)


def load_kept(path: Path) -> dict:
    """A job `keep_job` wrote."""
    with gzip.open(path, "rt") as f:
        return json.load(f)


def job_panels(eval_dir: Path, d: str) -> dict[str, list[dict]]:
    """One system's episodes by panel: valid_seen (``eval/<d>``), dev (``eval/dev_<d>``) and, in a job
    run since the unseen-room panel existed, that panel (``eval/unseen_<d>``)."""
    eps = {"valid_seen": read_jsonl(eval_dir / d / "episodes.jsonl")}
    eps["dev"] = read_jsonl(eval_dir / f"dev_{d}" / "episodes.jsonl")
    if (unseen := eval_dir / f"unseen_{d}" / "episodes.jsonl").is_file():
        eps[UNSEEN] = read_jsonl(unseen)
    return eps


def panels_of(jobs: dict[int, dict], systems: tuple[str, str]) -> tuple[str, ...]:
    """valid_seen and dev, and the unseen-room panel when every job played it with both `systems`: a
    pool over part of the declared seeds would be another test than the one declared."""
    played = all(UNSEEN in job["episodes"][s] for job in jobs.values() for s in systems)
    return (*PANELS, UNSEEN) if played else PANELS


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarise(jobs: dict[int, dict]) -> dict:
    """Per seed and pooled: each system's wins on each panel (`panels_of`), GRPO against SFT per game
    (the reported SFT + GRPO, and the GRPO stage's last checkpoint where every job played it), with
    the unseen-room panel the headroom test and the seen-vs-unseen gaps (`rooms`), and the games SFT
    lost in any seed (valid_seen) with each seed's outcome."""
    panels = panels_of(jobs, SYSTEMS)
    rows = []
    for seed, job in jobs.items():
        eps = job["episodes"]
        rows.append(
            {
                "seed": seed,
                "dir": job["dir"],
                "minutes": round(job["minutes"], 1),
                "cpu": job.get("cpu", "unknown"),
                **pair_seed(eps["sft"], eps["sft_grpo"], SYSTEMS, panels),
            }
        )
    spread = {p: {s: _mean_sd([r[p][s] for r in rows]) for s in SYSTEMS} for p in panels}
    unseen = {"headroom": pool_panels(rows, HEADROOM), "rooms": rooms(rows)} if UNSEEN in panels else {}
    last = last_checkpoint(jobs)
    return {
        "panels": list(panels),
        "seeds": rows,
        "spread": spread,
        "pooled": pool(rows, panels),
        **unseen,
        "wasted": [
            {"seed": seed, **wasted(job["episodes"]["sft"]["valid_seen"], job["episodes"]["sft_grpo"]["valid_seen"])}
            for seed, job in jobs.items()
        ],
        "cost": cost(jobs),
        **({"rl_last": last} if last else {}),
        "lost_games": lost_games(jobs),
    }


def rooms(rows: list[dict]) -> dict:
    """Seen vs unseen rooms (issue 51): ``{"seeds": [{"seed", system: room_gap}], "mean": {system: {key:
    (mean, sd)}}, "goal": {"unseen", "gap", "met": {system: bool}}}``, the goal checked on the means
    over seeds."""
    seeds = [{"seed": r["seed"], **{s: room_gap(r, s) for s in SYSTEMS}} for r in rows]
    mean = {s: {k: _mean_sd([x[s][k] for x in seeds]) for k in ("valid_seen", UNSEEN, "gap")} for s in SYSTEMS}
    met = {s: mean[s][UNSEEN][0] >= GOAL["unseen"] and mean[s]["gap"][0] <= GOAL["gap"] for s in SYSTEMS}
    return {"seeds": seeds, "mean": mean, "goal": {**GOAL, "met": met}}


def room_gap(row: dict, system: str) -> dict:
    """``{"valid_seen", "unseen", "gap", "low", "high"}``: one seed's success of `system` (%) on both
    panels of a `pair_seed` row and the gap valid_seen minus unseen in points with its 95% interval
    (`gap_interval`: different games, so not paired)."""
    v, u = row["valid_seen"], row[UNSEEN]
    gap, low, high = gap_interval(v[system], v["games"], u[system], u["games"])
    return {
        "valid_seen": 100 * v[system] / v["games"],
        UNSEEN: 100 * u[system] / u["games"],
        "gap": gap,
        "low": low,
        "high": high,
    }


def last_checkpoint(jobs: dict[int, dict]) -> dict | None:
    """The GRPO stage's last checkpoint against SFT per seed and pooled (``{"seeds", "pooled"}``), on
    the panels every job played it on; None unless every job played it."""
    if not all("rl_last" in job["episodes"] for job in jobs.values()):
        return None
    panels = panels_of(jobs, LAST)
    last = [
        {"seed": seed, **pair_seed(job["episodes"]["sft"], job["episodes"]["rl_last"], LAST, panels)}
        for seed, job in jobs.items()
    ]
    return {"seeds": last, "pooled": pool(last, panels)}


def cost(jobs: dict[int, dict]) -> dict:
    """The cost test on the games both systems won, valid_seen and dev (the panels of every job, so the
    test means the same for jobs with and without the unseen-room panel)."""
    keys = ("steps", "harness_calls")
    pairs = {
        seed: {
            k: [pr for p in PANELS for pr in cost_pairs(job["episodes"]["sft"][p], job["episodes"]["sft_grpo"][p], k)]
            for k in keys
        }
        for seed, job in jobs.items()
    }
    return {
        "seeds": [{"seed": seed, **{k: summarize_pairs(v[k]) for k in keys}} for seed, v in pairs.items()],
        "pooled": {k: summarize_pairs([pr for v in pairs.values() for pr in v[k]]) for k in keys},
        "games": {str(seed): len(v["steps"]) for seed, v in pairs.items()},
    }


def lost_games(jobs: dict[int, dict]) -> dict[str, dict[str, list[bool]]]:
    """``{game: {seed: [SFT won, SFT + GRPO won]}}``: the valid_seen games either system lost in some seed."""
    lost = {}
    for seed, job in jobs.items():
        sft = {e["task_id"]: e for e in job["episodes"]["sft"]["valid_seen"]}
        rl = {e["task_id"]: e["won"] for e in job["episodes"]["sft_grpo"]["valid_seen"]}
        for g, e in sft.items():
            if not e["won"] or not rl.get(g, False):
                lost.setdefault(g, {})[seed] = (bool(e["won"]), bool(rl.get(g, False)))
    return {g: {str(s): list(o) for s, o in v.items()} for g, v in sorted(lost.items())}


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


def _row(label: str, cells: list[str]) -> str:
    """``| label | a | | b |``: a markdown row, an empty cell as ``| |``."""
    return "|" + "|".join(f" {c} " if c else " " for c in [label, *cells]) + "|"


def write(summary: dict, results: Path, argv: list[str], note: str) -> None:
    """``<results>.md``, ``.json`` and ``.png``."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    rows = summary["seeds"]
    lines = ["# The main job across seeds", "", f"`python benchmarks/main_job_seeds.py {' '.join(argv)}`", ""]
    if decl := summary.get("declared"):
        lines += [_declaration(decl, summary.get("given", []), results), ""]
    lines += _main_table(summary)
    if last := summary.get("rl_last"):
        lines += _last_table(last)
    if "rooms" in summary:
        lines += _rooms_table(summary["rooms"])
    lines += _waste_table(summary["wasted"]) + _cost_table(summary["cost"]) + _lost_table(summary)
    lines += [
        "",
        "CPU of each seed's job (float results differ across CPUs; each seed's pairs come from one machine): "
        + "; ".join(f"seed {r['seed']} {r.get('cpu', 'unknown')}" for r in rows)
        + ".",
        "",
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) when the table was written: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + ". Minutes: the job's stage wall times.",
    ]
    if note:
        lines += ["", note]
    lines += ["", f"![success per seed]({results.with_suffix('.png').name})", ""]
    results.with_suffix(".md").write_text("\n".join(lines))
    _plot(rows, summary.get("panels", list(PANELS)), results.with_suffix(".png"))


def _declaration(decl: dict, given: list[int], results: Path) -> str:
    """The header's line quoting the declaration (`declare`)."""
    sets = " ".join(f"`{s}`" for s in decl["sets"]) or "none"
    commit = f" at commit `{decl['commit'][:12]}`" if decl.get("commit") else ""
    line = (
        f"Seeds {', '.join(map(str, decl['seeds']))} (--set overrides: {sets}) were declared {decl['utc']}{commit} "
        f"(`{results.with_suffix('.declared.json').name}`), before this script read or ran any of their jobs"
    )
    if given:  # their jobs ran before this script read them: declared when first read, not before they ran
        line += f"; seeds {', '.join(map(str, given))} came with --run (jobs run earlier, declared when read)"
    return line + "."


def _main_table(summary: dict) -> list[str]:
    """Per seed, the spread, the pooled row and (with the unseen-room panel) the headroom row."""
    rows, panels = summary["seeds"], summary.get("panels", list(PANELS))
    n = {p: rows[0][p]["games"] for p in panels}
    lines = [
        "Each row is one full main job (`benchmarks/main_job.py --set seed=S`); valid_seen is the same "
        f"{n['valid_seen']} games for every seed, dev the seed's own {n['dev']} held-out train games (they chose "
        "the RL checkpoint, so their paired test is not one). wins / losses: games only SFT + GRPO / only "
        "SFT won; p: exact two-sided sign test. The pooled row sums the wins and losses of the independent "
        "jobs (a fair coin per discordant game under the null).",
        "",
    ]
    header = "| seed | SFT valid_seen | SFT + GRPO valid_seen | wins | losses | p | SFT dev | SFT + GRPO dev | wins | "
    header += "losses |"
    if UNSEEN in panels:
        h = summary["headroom"]
        lines[0] += (
            f" unseen: the {n[UNSEEN]} games of the unseen-room panel (floor plans no training game comes from). The "
            "job chooses the RL checkpoint on the dev and unseen-room games together, so the unseen row is not a "
            "clean test either: valid_seen alone is the untouched test. The headroom row (issue 50) sums every "
            f"seed's {' and '.join(h['panels'])} wins and losses into one exact sign test (its numbers stand in "
            "the valid_seen columns; it leans on the unseen-room games that helped choose); dev stays out."
        )
        header += " SFT unseen | SFT + GRPO unseen | wins | losses | p |"
    header += " minutes |"
    lines += [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        extra = [panel_cells(r[UNSEEN], SYSTEMS)] if UNSEEN in panels else []
        lines.append(table_row(str(r["seed"]), r, SYSTEMS, " | ".join([*extra, str(r["minutes"])])))
    sp, po = summary["spread"], summary["pooled"]
    spread, pooled = [], []
    for p in panels:
        spread += [f"{sp[p][s][0]:.1f} ± {sp[p][s][1]:.1f}" for s in SYSTEMS] + [""] * (2 + WITH_P[p])
        cells = [str(po[p]["wins"]), str(po[p]["losses"])] + ([f"{po[p]['p']:.3g}"] if WITH_P[p] else [])
        pooled += ["", ""] + ([f"**{c}**" for c in cells] if p == "valid_seen" else cells)
    lines += [_row("mean ± sd", [*spread, ""]), _row("**pooled**", [*pooled, ""])]
    if UNSEEN in panels:
        cells = ["", "", str(h["wins"]), str(h["losses"]), f"{h['p']:.3g}"]
        lines.append(_row("**headroom: valid_seen + unseen**", [*cells, *[""] * (len(spread) - 5 + 1)]))
    return lines


def _last_table(last: dict) -> list[str]:
    """The GRPO stage's last checkpoint against SFT (and a line for the unseen-room panel, when played)."""
    lp = last["pooled"]
    lines = [
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
    if UNSEEN in lp:
        per_seed = "; ".join(f"seed {r['seed']} +{r[UNSEEN]['wins']} / -{r[UNSEEN]['losses']}" for r in last["seeds"])
        lines += [
            "",
            f"On the unseen-room panel (played before the choice too, so a fair test): {per_seed}; pooled "
            f"+{lp[UNSEEN]['wins']} / -{lp[UNSEEN]['losses']}, p {lp[UNSEEN]['p']:.3g}.",
        ]
    return lines


def _rooms_table(rooms_: dict) -> list[str]:
    """Seen vs unseen rooms: per seed, the mean ± sd over seeds, and issue 51's goal check on the means."""
    lines = [
        "",
        "### Seen vs unseen rooms",
        "",
        "Each system's success (%) on valid_seen and on the unseen-room panel, and the gap (valid_seen minus "
        "unseen, points) with its 95% interval (Newcombe's hybrid score method, `eval.run_report.gap_interval`: "
        "different games, so not paired); the last row: the mean over seeds ± the sample sd.",
        "",
        "| seed | "
        + " | ".join(f"{LABELS[s]} valid_seen | {LABELS[s]} unseen | {LABELS[s]} gap" for s in SYSTEMS)
        + " |",
        "|---" * (1 + 3 * len(SYSTEMS)) + "|",
    ]
    for x in rooms_["seeds"]:
        cells = [
            c
            for s in SYSTEMS
            for c in (
                f"{x[s]['valid_seen']:.1f}",
                f"{x[s][UNSEEN]:.1f}",
                f"{x[s]['gap']:+.1f} [{x[s]['low']:+.1f}, {x[s]['high']:+.1f}]",
            )
        ]
        lines.append(_row(str(x["seed"]), cells))
    m = rooms_["mean"]
    cells = [
        f"{m[s][k][0]:{f}} ± {m[s][k][1]:.1f}"
        for s in SYSTEMS
        for k, f in (("valid_seen", ".1f"), (UNSEEN, ".1f"), ("gap", "+.1f"))
    ]
    lines.append(_row("mean ± sd", cells))
    goal = rooms_["goal"]
    checks = "; ".join(
        f"{LABELS[s]} {m[s][UNSEEN][0]:.2f}% and {m[s]['gap'][0]:+.2f} points: {'met' if goal['met'][s] else 'not met'}"
        for s in reversed(SYSTEMS)  # the reported system first
    )
    return lines + [
        "",
        f"Issue 51's goal on the means over seeds (unseen-room success >= {goal['unseen']:g}% and gap <= "
        f"{goal['gap']:g} points): {checks}.",
    ]


def _waste_table(waste: list[dict]) -> list[str]:
    lines = [
        "",
        "Wasted steps per valid_seen episode (invalid actions + repeated (action, feedback) pairs), SFT -> "
        "SFT + GRPO: on every game, and on the games both won (a lost episode's loop left out):",
        "",
        "| seed | all games | games both won |",
        "|---|---|---|",
    ]
    return lines + [
        f"| {w['seed']} | {w['all'][0]:.2f} -> {w['all'][1]:.2f} | {w['both_won'][0]:.2f} -> "
        f"{w['both_won'][1]:.2f} ({w['both_won_games']} games) |"
        for w in waste
    ]


def _cost_table(cost_: dict) -> list[str]:
    lines = [
        "",
        "Cost on the games both SFT and SFT + GRPO won (valid_seen and dev together, paired per game; p: exact "
        "sign-flip permutation test on the per-game differences; fewer / more: games where SFT + GRPO took "
        "fewer / more):",
        "",
        "| seed | games both won | steps SFT -> SFT + GRPO | fewer / more | p | harness calls | fewer / more | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in [*cost_["seeds"], {"seed": "**pooled**", **cost_["pooled"]}]:
        st, hc = r["steps"], r["harness_calls"]
        n = cost_["games"].get(str(r["seed"]), sum(cost_["games"].values()))
        lines.append(
            f"| {r['seed']} | {n} | {st['a']:.2f} -> {st['b']:.2f} | {st['fewer']} / {st['more']} | {st['p']:.3g} | "
            f"{hc['a']:.2f} -> {hc['b']:.2f} | {hc['fewer']} / {hc['more']} | {hc['p']:.3g} |"
        )
    return lines


def _lost_table(summary: dict) -> list[str]:
    seeds = [r["seed"] for r in summary["seeds"]]
    lines = [
        "",
        "valid_seen games lost by either system in some seed (the others: both won in every seed):",
        "",
        "| game | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]
    for g, outcomes in summary["lost_games"].items():
        cells = [_cell(*outcomes[str(s)]) if str(s) in outcomes else "both" for s in seeds]
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return lines


def _plot(rows: list[dict], panels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, p in zip(axes, panels):
        xs = range(len(rows))
        for k, s in enumerate(SYSTEMS):
            ax.bar(
                [x + (k - 0.5) * 0.38 for x in xs], [100 * r[p][s] / r[p]["games"] for r in rows], 0.38, label=LABELS[s]
            )
        ax.set_xticks(list(xs), [f"seed {r['seed']}" for r in rows])
        low = min(100 * r[p][s] / r[p]["games"] for r in rows for s in SYSTEMS)
        ax.set_ylim(max(0, 10 * (low // 10) - 10), 100.5)
        ax.set_title(f"{p} success %")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[])
    ap.add_argument("--root", default="runs/seeds")
    ap.add_argument(
        "--run",
        action="extend",
        nargs="+",
        default=[],
        metavar="SEED=DIR",
        help="a main job already run with this seed (same settings); the seed is one of the declared seeds",
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
    seeds = list(dict.fromkeys([*args.seeds, *given]))
    if not seeds:
        raise SystemExit("no seeds: give --seeds and/or --run")
    results = Path(args.results)
    declared = declare(results.with_suffix(".declared.json"), seeds, args.set)  # before any job runs
    kept = results.with_name(results.name + ".jobs")
    jobs = {s: job_of(s, given.get(s), Path(args.root), args.set, kept / f"seed{s}.json.gz") for s in seeds}
    if wrong := [f"{j['dir']} ran seed {j['seed']}" for s, j in jobs.items() if j["seed"] != s]:
        raise SystemExit("--run: " + "; ".join(wrong))
    summary = {**summarise(jobs), "declared": declared, "given": sorted(given)}
    write(summary, results, sys.argv[1:], args.note)
    print(results.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
