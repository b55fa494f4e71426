"""Teacher traces that skip some notes (issue 50): the SFT student learns that a ``note`` may be left
out, so cost-aware GRPO can drop notes without leaving the distribution it imitated.

Usage: python -m experiments.note_skip.note_skip --run runs/seeds_go_back/seed0 [--rate 0.5]
           [--out runs/note_skip] [--results benchmarks/results/student/note_skip/seed0] [--note TEXT]
       (writes <results>/sft_rate<percent>.md / .json)

Why: from the Go back SFT models, ``cost_won_soup2_8`` cut steps (p = 5e-28) by skipping the teacher's
``note`` (a meta-action that writes the experience store for later episodes; at evaluation the store is
frozen, so a note costs a step and buys nothing), and half of its lost games begin at a skipped note
(benchmarks/results/student/first_divergence_cost_won_soup2.md): with ``note`` withheld the SFT models win
919 of 1,600 games against 1,555 (note_skip_probe.md). Every teacher trace notes, so a skip puts the
student in states it never saw.

`teacher.NoteSkipTeacher` leaves out a fraction `rate` of its notes: where the teacher would note, a hash
of the prompt's OBJECTIVE and PREVIOUS ACTIONS (so still a function of the prompt, design.md) picks the
notes left out, and the teacher's next move comes at once (the subgoal switch after a find, ``use
desklamp`` for the lamp). The experience store the collect stage builds then holds the notes of the
episodes that made them. (The main job's ``teacher.note_skip`` ran it twice: rate 0.5 in sessions 37-38,
commits 42e5cfd-e8b2847, and rate 0.25 in sessions 39-40, commits f4d1840-decc172; it left `src/` each
time its confirmatory study failed its rule, JOURNAL.md.)

The arm is the main job `--run` from its ``collect`` stage on with the note-skipping teacher: its
initial model and tokenizer are the run's (``model_init``), its teacher traces, experience store and SFT
examples are new, then `pipeline.run_pipeline` runs it with ``skip_rl`` (SFT and its evaluations). Same
seed, initial weights and SFT steps. Its SFT model is paired per game against the run's on valid_seen,
the development games and the unseen-room panel, with the cost (`eval.cost`) on the games both won. Its
cost-aware RL: ``python -m experiments.rl_levers.rl_levers --run <out>/rate<rate> --arms cost_won_soup2_8
--valid-seen --unseen``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from experiments.unseen_rooms.sft_levers import PANELS, copy_run_stages

# what the arm reuses of the run besides the evaluations no student plays: its initial model and tokenizer
_COPIED = ("model_init", ".model.done")


def prepare_arm(run: Path, arm_dir: Path) -> dict:
    """`arm_dir` holding what the arm reuses of `run` (`_COPIED`, the random and teacher evaluations:
    `experiments.unseen_rooms.sft_levers.copy_run_stages`);
    returns its run config (the run's, with ``out_dir`` and ``skip_rl`` set) as a dict."""
    copy_run_stages(run, arm_dir, _COPIED)
    for f in ("dev_games.json", "unseen_games.json"):  # the run's own draws
        if (run / f).is_file():
            shutil.copy2(run / f, arm_dir / f)
    cfg = json.loads((run / "run_config.json").read_text())
    cfg.update(out_dir=str(arm_dir), skip_rl=True)
    (arm_dir / "run_config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def use_note_skip_teacher(rate: float) -> None:
    """Make `policies.factory.make_policy` build `teacher.NoteSkipTeacher` for the teacher config, so the
    pipeline's collect stage (in this process; it looks the factory up when it runs) plays it."""
    import evoharness.policies.factory as factory
    from experiments.note_skip.teacher import NoteSkipTeacher

    make = factory.make_policy
    factory.make_policy = lambda cfg: NoteSkipTeacher(cfg.seed, rate) if cfg.kind == "teacher" else make(cfg)


def arm_row(run: Path, arm_dir: Path, rate: float) -> dict:
    """The arm's SFT model against the run's, paired per game on each panel, and their cost on the games
    both won (`eval.cost.paired_cost`)."""
    from evoharness.eval.cost import paired_cost
    from evoharness.eval.run_report import paired
    from evoharness.files import read_jsonl

    def notes(path: Path) -> int:
        return sum("<action>note " in e["completion"] for e in read_jsonl(path))

    row = {"rate": rate, "notes": {k: notes(d / "sft_examples.jsonl") for k, d in (("run", run), ("arm", arm_dir))}}
    for panel, system in PANELS:
        base = read_jsonl(run / "eval" / system / "episodes.jsonl")
        arm = read_jsonl(arm_dir / "eval" / system / "episodes.jsonl")
        won = {"base": sum(e["won"] for e in base), "won": sum(e["won"] for e in arm), "n": len(arm)}
        row[panel] = {**won, **paired(base, arm), "cost": paired_cost(base, arm)}
    return row


def _cost_cells(c: dict) -> list[str]:
    s = c["steps"]
    return [str(c["both_won"]), f"{s['a']:.2f} -> {s['b']:.2f}", f"{s['fewer']} / {s['more']}", f"{s['p']:.3g}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/main", help="a finished main job with an unseen-room panel")
    ap.add_argument("--rate", type=float, default=0.5, help="the fraction of the teacher's notes left out")
    ap.add_argument("--out", default="runs/note_skip")
    ap.add_argument("--results", default="benchmarks/results/student/note_skip/seed0")
    ap.add_argument("--note", default="", help="a line for the report (the machine, how the arm ran)")
    args = ap.parse_args()

    from benchmarks.results_file import write_results
    from evoharness.config.run import RunConfig
    from evoharness.files import read_jsonl
    from evoharness.pipeline import run_pipeline

    run, load = Path(args.run), " ".join(f"{x:.2f}" for x in os.getloadavg())
    if not (run / "eval" / "unseen_sft" / "episodes.jsonl").is_file():
        sys.exit(f"{run}: no finished main job with an unseen-room panel (eval/unseen_sft)")
    arm_dir = Path(args.out) / f"rate{args.rate:g}"
    use_note_skip_teacher(args.rate)
    run_pipeline(RunConfig.model_validate(prepare_arm(run, arm_dir)))
    r = arm_row(run, arm_dir, args.rate)
    lines = [
        "# Teacher traces that skip notes: the SFT model (issue 50)",
        "",
        f"`python -m experiments.note_skip.note_skip {' '.join(sys.argv[1:])}`. The main job `{run}` from its "
        f"collect stage on with the scripted teacher leaving out {args.rate:.0%} of its notes "
        "(experiments/note_skip/note_skip.py): same seed, initial weights, tokenizer and SFT steps. Its SFT "
        "model paired per game against the run's (greedy, cap 50). +/-: games only the arm / only the run "
        "won; p: exact two-sided sign test. Steps on the games both won: mean run -> arm, games the arm took "
        "fewer / more, p: exact sign-flip test (`eval.cost`).",
        "",
        f"Note examples in the SFT data: run {r['notes']['run']}, arm {r['notes']['arm']}.",
        "",
        "| panel | run -> arm | +/- | p | both won | steps | fewer / more | p | notes/ep run -> arm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for panel, system in PANELS:
        c = r[panel]
        per_ep = [
            sum(e["meta_calls"].get("note", 0) for e in eps) / max(1, len(eps))
            for eps in (read_jsonl(d / "eval" / system / "episodes.jsonl") for d in (run, arm_dir))
        ]
        c["notes_per_episode"] = per_ep
        lines.append(
            f"| {panel} | {c['base']}/{c['n']} -> {c['won']}/{c['n']} | +{c['b_only']} / -{c['a_only']} | "
            f"{c['p']:.3g} | " + " | ".join(_cost_cells(c["cost"])) + f" | {per_ep[0]:.2f} -> {per_ep[1]:.2f} |"
        )
    lines += ["", f"2 CPUs; load average (1/5/15 min) at start {load}.", args.note]
    write_results(Path(args.results) / f"sft_rate{round(args.rate * 100)}", lines, r)  # no dot: a suffix


if __name__ == "__main__":
    main()
