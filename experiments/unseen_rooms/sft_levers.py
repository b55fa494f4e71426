"""SFT-data levers for rooms the student never trained in (issue 51), each paired per game against
the main job's own SFT model on valid_seen, the development games and the unseen-room panel.

Usage: python -m experiments.unseen_rooms.sft_levers --run runs/main [--out runs/unseen_levers]
           [--arms colocated_x10 renumber01] [--results benchmarks/results/student/unseen_levers] [--note TEXT]
       python -m experiments.unseen_rooms.sft_levers --pool RUN1/sft_levers.json RUN2/sft_levers.json
           [--results DIR]   (each arm's pairs summed over runs of other seeds: pooled.md / .json)

An arm is the main job `--run` from its SFT stage on, with its SFT examples rewritten: the arm's
directory starts with copies of the run's teacher traces, experience store, tokenizer and initial
model (its ``collect`` and ``model`` stages) and of its random and teacher evaluations, then
`pipeline.run_pipeline` resumes it with ``skip_rl`` (SFT and its evaluations only). Same seed, same
initial weights, same SFT steps of the same batch tokens: equal wall time, one thing changed.

- ``colocated_x10``: every search example whose move opens or examines the receptacle where the
  agent stands repeated 10 times (the committed job's data: 33 of 1,824 search examples; on unseen
  rooms the student's first fault in 5 of 17 lost games is ``go to`` that receptacle instead:
  benchmarks/results/student/search_faults_unseen.md).
- ``renumber01`` / ``renumber025``: 10% / 25% of the examples with receptacle instances renumbered
  (experiments/renumber/renumber.py; 10% was even on valid_seen in session 22, never read on unseen
  rooms, where most of the student's search slips name another instance number of the teacher's
  receptacle type: ``shelf 9`` searched already for ``shelf 8``; `benchmarks/search_faults.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.search_faults import search_move
from evoharness.eval.run_report import gap_interval, paired, sign_test
from evoharness.files import read_jsonl

_OPEN_THERE = ("open", "examine")


def colocated_upsample(examples: list[dict], factor: int) -> tuple[list[dict], int]:
    """`examples` with each search example whose move opens or examines the receptacle where the
    agent stands (`benchmarks.search_faults.search_move`: "the next receptacle to search is R"
    with ``open R`` / ``examine R``) followed by `factor` - 1 copies. Returns (examples, copies added).

    Raises:
        ValueError: `factor` < 1.
    """
    if factor < 1:
        raise ValueError(f"colocated_upsample: factor must be >= 1 (got {factor})")
    out, added = [], 0
    for ex in examples:
        out.append(ex)
        move = search_move(ex["completion"])
        if move and move[1].split(" ", 1)[0] in _OPEN_THERE:
            out.extend([ex] * (factor - 1))
            added += factor - 1
    return out, added


def _renumber(rate: float) -> Callable[[list[dict]], tuple[list[dict], int]]:
    from experiments.renumber.renumber import renumber_examples

    return lambda examples: renumber_examples(examples, rate=rate, seed=0)


# name -> (what it changes, the SFT-example rewrite: (examples) -> (examples, examples changed or added))
ARMS: dict[str, tuple[str, Callable[[list[dict]], tuple[list[dict], int]]]] = {
    "colocated_x10": (
        "search examples opening / examining where the agent stands x10",
        lambda e: colocated_upsample(e, 10),
    ),
    "renumber01": ("10% of examples with receptacle instances renumbered", _renumber(0.1)),
    "renumber025": ("25% of examples with receptacle instances renumbered", _renumber(0.25)),
}
# what an arm reuses from the run: the stages before SFT and the evaluations SFT does not change
_COPIED = ("teacher_traces.jsonl", "experience.json", "model_init", ".collect.done", ".model.done")
_COPIED_EVALS = ("random", "scripted_teacher")
PANELS = (("valid_seen", "sft"), ("dev", "dev_sft"), ("unseen rooms", "unseen_sft"))


def copy_run_stages(run: Path, arm_dir: Path, files: tuple[str, ...]) -> None:
    """Copy `files` (stage outputs and ``.<stage>.done`` markers) of main job `run` into `arm_dir`, and its
    random and scripted-teacher evaluations (every panel), so a `pipeline.run_pipeline` of the arm skips
    those stages. What `arm_dir` already holds is kept (a rerun resumes)."""
    arm_dir.mkdir(parents=True, exist_ok=True)
    for f in files:
        src, dst = run / f, arm_dir / f
        if not dst.exists():
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    for system in _COPIED_EVALS:
        for prefix in ("", "dev_", "unseen_"):
            src, dst = run / "eval" / f"{prefix}{system}", arm_dir / "eval" / f"{prefix}{system}"
            if src.is_dir() and not dst.exists():
                shutil.copytree(src, dst)
        shutil.copy2(run / f".eval_{system}.done", arm_dir / f".eval_{system}.done")


def prepare_arm(run: Path, arm_dir: Path, name: str) -> dict:
    """`arm_dir` holding what arm `name` reuses of `run` and its rewritten ``sft_examples.jsonl``;
    returns its run config (the run's, with ``out_dir`` and ``skip_rl`` set) as a dict."""
    from evoharness.rollout.collect import write_jsonl_atomic

    copy_run_stages(run, arm_dir, _COPIED)
    if not (arm_dir / "lever.json").exists():  # written last: a rewrite cut short is redone (it is seeded)
        examples, changed = ARMS[name][1](read_jsonl(run / "sft_examples.jsonl"))
        write_jsonl_atomic(arm_dir / "sft_examples.jsonl", examples)
        (arm_dir / "lever.json").write_text(json.dumps({"arm": name, "examples": len(examples), "changed": changed}))
    cfg = json.loads((run / "run_config.json").read_text())
    cfg.update(out_dir=str(arm_dir), skip_rl=True)
    (arm_dir / "run_config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def arm_row(run: Path, arm_dir: Path, name: str) -> dict:
    """The arm's SFT model against the run's, paired per game on each panel."""
    row = {"arm": name, "lever": ARMS[name][0], **json.loads((arm_dir / "lever.json").read_text())}
    for panel, system in PANELS:
        base = read_jsonl(run / "eval" / system / "episodes.jsonl")
        arm = read_jsonl(arm_dir / "eval" / system / "episodes.jsonl")
        won = {"base": sum(e["won"] for e in base), "won": sum(e["won"] for e in arm), "n": len(arm)}
        row[panel] = {**won, **paired(base, arm)}
    return row


def panel_cells(r: dict) -> list[str]:
    """Markdown cells of a paired row: per panel (`PANELS`) run -> arm, +/-, p; then the gaps
    valid_seen minus unseen rooms of the run and of the arm (Newcombe 95% interval)."""
    cells = []
    for p, _ in PANELS:
        c = r[p]
        cells += [f"{c['base']}/{c['n']} -> {c['won']}/{c['n']}", f"+{c['b_only']} / -{c['a_only']}", f"{c['p']:.3g}"]
    vs, un = r["valid_seen"], r["unseen rooms"]
    for key in ("base", "won"):
        g, lo, hi = gap_interval(vs[key], vs["n"], un[key], un["n"])
        cells.append(f"{g:+.1f} [{lo:+.1f}, {hi:+.1f}]")
    return cells


def pool_rows(reports: list[dict]) -> list[dict]:
    """Each arm's pairs summed over `reports` (``sft_levers.json`` of independent runs, e.g. main jobs of
    other seeds, each arm paired against its own run): per panel the summed wins, games, wins only the arm
    (``b_only``) / only the run (``a_only``) had, and the exact sign test on the sums (each discordant
    game a fair coin under the null). Arms missing from a report are pooled over the reports that have them
    (``runs`` counts them)."""
    pooled: dict[str, dict] = {}
    for report in reports:
        for r in report["rows"]:
            row = pooled.setdefault(r["arm"], {"arm": r["arm"], "lever": r.get("lever", ""), "runs": []})
            row["runs"].append(report["run"])
            for panel, _ in PANELS:
                cell = row.setdefault(panel, dict.fromkeys(("base", "won", "n", "b_only", "a_only"), 0))
                for k in cell:
                    cell[k] += r[panel][k]
    for row in pooled.values():
        for panel, _ in PANELS:
            row[panel]["p"] = sign_test(row[panel]["b_only"], row[panel]["a_only"])
    return list(pooled.values())


def write_pooled(reports: list[Path], results: Path, title: str = "SFT-data levers on unseen rooms") -> str:
    """``pooled.md`` / ``.json`` in `results`: `pool_rows` over the `reports` (the ``sft_levers.json``
    or ``tail_average.json`` of each run), under the heading `title`."""
    rows = pool_rows([json.loads(r.read_text()) for r in reports])
    lines = [
        f"# {title}, pooled over runs (issue 51)",
        "",
        "Each arm paired per game against its own run's SFT model (the report of each run: "
        + ", ".join(f"`{r}`" for r in reports)
        + "), the wins and losses summed over the runs; p: exact two-sided sign test on the sums; gap: "
        "valid_seen minus unseen rooms in points (Newcombe 95% interval, on the summed games).",
        "",
        "| arm | runs | " + " | ".join(f"{p}: runs -> arm | +/- | p" for p, _ in PANELS) + " | gap runs | gap arm |",
        "|---" * (2 + 3 * len(PANELS) + 2) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([r["arm"], str(len(r["runs"])), *panel_cells(r)]) + " |")
    results.mkdir(parents=True, exist_ok=True)
    (results / "pooled.md").write_text("\n".join(lines) + "\n")
    (results / "pooled.json").write_text(json.dumps({"reports": [str(r) for r in reports], "rows": rows}, indent=1))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/main", help="a finished main job with an unseen-room panel")
    ap.add_argument("--out", default="runs/unseen_levers")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--results", default="benchmarks/results/student/unseen_levers")
    ap.add_argument("--note", default="", help="a line for the report (the machine, how the arms ran)")
    ap.add_argument("--pool", nargs="+", type=Path, help="only pool these sft_levers.json files into --results")
    args = ap.parse_args()
    if args.pool:
        print(write_pooled(args.pool, Path(args.results)))
        return

    from evoharness.config.run import RunConfig
    from evoharness.pipeline import run_pipeline

    run, load = Path(args.run), " ".join(f"{x:.2f}" for x in os.getloadavg())
    if not (run / "eval" / "unseen_sft" / "episodes.jsonl").is_file():
        sys.exit(f"{run}: no finished main job with an unseen-room panel (eval/unseen_sft)")
    rows = []
    for name in args.arms:
        arm_dir = Path(args.out) / name
        run_pipeline(RunConfig.model_validate(prepare_arm(run, arm_dir, name)))
        rows.append(arm_row(run, arm_dir, name))
    lines = [
        "# SFT-data levers on unseen rooms (issue 51)",
        "",
        f"`python -m experiments.unseen_rooms.sft_levers {' '.join(sys.argv[1:])}`. Each arm: the main job "
        f"`{run}` from its SFT stage on (same seed, initial weights and SFT steps) with its SFT examples "
        "rewritten, its SFT model paired per game against the run's (greedy, cap 50). +/-: games only the arm / "
        "only the run's SFT won; p: exact two-sided sign test; gap: valid_seen minus unseen rooms in points "
        "(Newcombe 95% interval).",
        "",
        "| arm | lever | examples (changed) | "
        + " | ".join(f"{p}: run -> arm | +/- | p" for p, _ in PANELS)
        + " | gap run | gap arm |",
        "|---" * (3 + 3 * len(PANELS) + 2) + "|",
    ]
    for r in rows:
        lines.append(
            "| " + " | ".join([r["arm"], r["lever"], f"{r['examples']} ({r['changed']})", *panel_cells(r)]) + " |"
        )
    lines += ["", f"2 CPUs; load average (1/5/15 min) at start {load}.", args.note]
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / "sft_levers.md").write_text("\n".join(lines).rstrip() + "\n")
    (res / "sft_levers.json").write_text(json.dumps({"run": str(run), "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
