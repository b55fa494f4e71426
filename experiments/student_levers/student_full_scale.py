"""Full-scale student levers (issue 11): whole main-job runs side by side, paired per game.

Usage: python -m experiments.student_levers.student_full_scale [--arms a,b] [--out runs/full]
           [--results benchmarks/results/student]

Each arm is `evoharness run` (the whole main job: teacher traces, SFT, GRPO, evaluations) with
its overrides, in ``--out/<arm>`` (an existing finished run there is reused, not rerun). The
table gives each arm's SFT and SFT + GRPO on valid_seen and on the arm's development set,
GRPO against SFT paired per game within the arm, and the arm's SFT against the reference
arm's SFT paired on valid_seen and on the arm's development games (the reference model is
evaluated there when the development sets differ, on the games it never trained on).
Budgets are optimizer steps, so the rows compare equal-step training whatever the load.
The ``counterfactual`` arms set ``counterfactual_rate``, a RunConfig field that left the product with
the lever (experiments/counterfactual/JOURNAL.md): they run only at a commit that still has it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from evoharness.eval.run_report import paired, wasted_steps
from evoharness.files import read_jsonl

REF = "main_4000"
PACK200 = "runs/full/_data/pack200"  # games_1200's games: scripts/build_pack.py --train-per-type 200, unpacked
# name -> (lever, setting, `evoharness run` overrides)
ARMS: dict[str, tuple[str, str, list[str]]] = {
    REF: (
        "reference: the previous main job",
        "540 train games, SFT 4000 steps; GRPO 16 steps consolidating the student's notes into the experience store",
        ["rl.consolidate_experience=true"],
    ),
    "main": (
        "experience store fixed during GRPO (the main job's defaults)",
        "540 train games, SFT 4000 steps; GRPO 16 steps, store fixed",
        [],
    ),
    "sft5000": (
        "more SFT steps",
        "540 train games, SFT 5000 steps; GRPO 16 steps, store fixed",
        ["sft.max_steps=5000"],
    ),
    "games_1200": (
        "more bundled-style train games",
        "1,140 train games (200 per type, build_pack.py), SFT 5000 steps; GRPO 24 steps, store fixed",
        [f"env.data_path={PACK200}", "sft.max_steps=5000", "rl.steps=24"],
    ),
    "dagger": (
        "one DAgger round (teacher labels the student's own states, incl. recovery from a wrong object)",
        "540 train games, SFT 4000 steps, then 100 student games labelled + 300 SFT steps; GRPO 16 steps, store fixed",
        ["dagger_rounds=1"],
    ),
    "head_dim64": (
        "attention head width (grounding: matching the goal's name against the objects listed)",
        "'mini' with head_dim 64 instead of 32 (1.35M params instead of 1.15M); 540 games, SFT 4000 "
        "steps, GRPO 16 steps",
        ["model_overrides.head_dim=64"],
    ),
    "seed1": (
        "seed spread (the noise every other row sits in)",
        "the main job's defaults with seed 1 (another initialisation, data order and 60-game development draw)",
        ["seed=1"],
    ),
    "counterfactual": (
        "counterfactual observations (minimal pairs: the goal object removed from / inserted into "
        "what the agent sees, relabelled by the teacher)",
        "the main job's defaults plus a twin for "
        "every eligible goal-search step (+1,717 examples on 7,108 in the run shown, whose rule found search "
        "steps by the teacher's reason text; the committed rule, by its action, gives +1,677)",
        ["counterfactual_rate=1.0"],
    ),
    "counterfactual_seed1": (
        "counterfactual observations, seed 1",
        "as counterfactual, with seed 1 (compare with seed1)",
        ["counterfactual_rate=1.0", "seed=1"],
    ),
    "all_games": (
        "every ALFWorld train game",
        "all 3,493 non-dev train games ($ALFWORLD_DATA), SFT 4000 steps; "
        "GRPO 16 steps, store fixed; 1 thread, 1 eval worker",
        ["env.data_path=env", "threads=1", "eval_workers=1"],
    ),
}

READING = [
    "Experience store during GRPO: consolidating the student's notes into the store (main_4000) left no GRPO "
    "checkpoint above SFT on the 20 curve games (30 / 25 / 20 / 25% vs 35%); with the store fixed (main) the "
    "same 16 steps scored 45 / 30 / 30 / 40%, and the step-4 checkpoint gains on dev (+7 / -2, p=0.18; +5 / -2 "
    "on the 40 that did not choose it) but not on valid_seen (+8 / -9). Kept: store fixed "
    "(`rl.consolidate_experience=false` in the main job).",
    "More SFT steps: 5000 instead of 4000 lost 12 valid_seen games (+15 / -27, p=0.09) and tied on dev. Kept: 4000.",
    "Every ALFWorld train game (3,493 instead of 540; <1 epoch instead of ~5 at 4000 steps): worse on both panels "
    "(valid_seen 33.6% vs 57.9%, dev +3 / -14 on the 50 dev games the reference never trained on), but its "
    "harness use is the teacher's (0.73 notes per episode, the teacher 0.58-0.73; the 540-game student 5.58), and "
    "GRPO from it gains on both panels (valid_seen +13 / -6, p=0.17; dev +9 / -1, p=0.02). Kept: the 540 "
    "bundled games.",
    "More train games (games_1200: 1,140 instead of 540, SFT 5000 steps (~3 epochs instead of ~5), GRPO 24 steps; "
    "run as the main job with the 200-per-type pack bundled, its recorded data_path then pointed at the same games "
    "unpacked): SFT 48.6% vs 57.9% valid_seen (+15 / -28, p=0.07); its notes per episode fall from 5.58 to 1.67 and "
    "GRPO again leaves valid_seen flat (+10 / -9). Kept: the 540 bundled games.",
    "DAgger (one round: the student plays 100 train games, the teacher labels its 3,046 states, 300 SFT steps on "
    "teacher + DAgger data; the arm resumed from the main arm's SFT stage, bit-identical): the teacher now labels "
    "recovery (`policies/teacher.py` rule 0: put a wrong object down, reopen a find subgoal marked done too early; "
    "before, it assumed it held the goal object): 1,000 of the 3,046 labels put a wrong object down or carry it "
    "away, 412 reopen a find subgoal. SFT + DAgger falls to 23.6% (+3 / -51 "
    "vs the SFT it started from); 300 steps at lr 2e-4 instead of the stage's 2e-3, or without the prompt loss, "
    "still 60/140 (scratch probes, same labels): the labelled states are mostly the student's own loops. GRPO "
    "from the damaged model gains +34 / -10 on valid_seen and +18 / -2 on dev in 16 steps (back to 40.7% / 36.7%), "
    "the clearest GRPO effect measured; notes per episode 0.60 -> 1.03 (the teacher 0.73). Kept: no DAgger.",
    "Attention head width (head_dim64: 64 instead of 32, 1.35M params; the student's commonest failure is "
    "saying the goal object is here when it is not, at 124 of the 290 receptacles without it where it decided): "
    "SFT valid_seen 49.3% vs 57.9% (+10 / -22, p=0.05), dev 26 vs 22 of 60 (+9 / -5, p=0.42); no GRPO "
    "checkpoint beat it on the curve games; its SFT stage took 1,581 s against 1,189 s (+33%; job 39.9 min). "
    "Kept: head_dim 32.",
    "A grounded think (scratch run, not kept in the code: the teacher's find think first copied the takeable "
    "objects, 'Here: pen 1, plate 3. No bowl here; ...', so the decision compares each copied name with the goal): "
    "the student stopped claiming absent objects (61 of 1,342 such receptacles) but missed present ones "
    "(22 of 154) and miscopied lists; SFT 17.9% valid_seen (+7 / -63 vs the reference), dev 9/60. GRPO from it "
    "gained +24 / -3 on valid_seen and +14 / -1 on dev (to 32.9% / 36.7%). Kept: the plain think.",
    "Seed spread (seed1: the defaults with seed 1, which also draws another 60 development games): SFT 42.9% "
    "valid_seen against seed 0's 57.9% (+12 / -33, p=0.003), dev 19/60; no GRPO checkpoint beat it on the "
    "curve games. The seed alone moves valid_seen by 15 points, more than any lever above: seed 0's 57.9% is "
    "a favourable draw, and a lever needs several seeds (or a paired p well below 0.05) before it counts.",
    "Counterfactual observations (counterfactual: `experiments/counterfactual/`; every goal-search step of the "
    "teacher's traces gets a twin whose observation gains or loses the goal object, relabelled by the teacher): "
    "SFT 59/140 valid_seen and 20/60 dev, below the reference (row above); within the seed spread, so not a "
    "win. Not adopted (`counterfactual_rate` stayed 0; the lever now lives in experiments/counterfactual/). Its "
    "seed-1 arm (counterfactual_seed1) was not run.",
    "The same command gives the same model: main_4000 and main share their SFT stage bit for bit (identical "
    "per-step losses and evaluations), run hours apart.",
]


def run_arm(name: str, d: Path) -> None:
    if (d / "report.md").is_file():
        return
    d.mkdir(parents=True, exist_ok=True)
    if any(o.startswith(f"env.data_path={PACK200}") for o in ARMS[name][2]):
        build_pack200(Path(PACK200))
    sets = [x for o in ARMS[name][2] for x in ("--set", o)]
    with open(d / "run.log", "a") as log:
        subprocess.run(
            [sys.executable, "-m", "evoharness.cli", "run", "--out", str(d), *sets],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )


def build_pack200(root: Path) -> None:
    """The bundled pack's layout with 200 train games per type (a superset of the bundled 100)."""
    if (root / "json_2.1.1").is_dir():
        return
    import tarfile

    root.mkdir(parents=True, exist_ok=True)
    pack = root.parent / "pack200.tar.xz"
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[2] / "scripts" / "build_pack.py"),
            "--train-per-type",
            "200",
            "--out",
            str(pack),
        ],
        check=True,
    )
    with tarfile.open(pack) as tf:
        tf.extractall(root, filter="data")


def episodes(d: Path, system: str, panel: str) -> list[dict]:
    """A run's episodes: `system` 'sft' or 'sft_grpo' (the evaluation the job's ``systems.json``
    names: the SFT one when the job kept the SFT model), `panel` 'vs' or 'dev'."""
    systems = d / "systems.json"
    if systems.is_file():
        system = json.loads(systems.read_text()).get(system, "sft")
    elif not (d / "eval" / system / "episodes.jsonl").is_file():  # a job from before systems.json
        system = "sft"
    name = ("dev_" if panel == "dev" else "") + system
    return read_jsonl(d / "eval" / name / "episodes.jsonl")


def ref_on_dev(ref: Path, d: Path) -> list[dict]:
    """The reference SFT model on arm `d`'s development games it did not train on (evaluated
    once into ``d/eval/dev_ref_sft``; the reference's own episodes when the dev sets agree)."""
    dev = json.loads((d / "dev_games.json").read_text())
    if dev == json.loads((ref / "dev_games.json").read_text()):
        return episodes(ref, "sft", "dev")
    from evoharness.eval.evaluate import evaluate
    from evoharness.pipeline import RunConfig, eval_config, model_policy

    seen = {e["task_id"] for e in read_jsonl(ref / "teacher_traces.jsonl")}
    games = [g for g in dev if g not in seen]
    cfg = RunConfig.model_validate(json.loads((d / "run_config.json").read_text()))
    out = d / "eval" / "dev_ref_sft"
    if not (out / "summary.json").is_file():
        evaluate(
            eval_config(cfg, d, "dev_ref_sft", model_policy(cfg, ref / "sft" / "final"), ref / "experience.json", games)
        )
    return read_jsonl(out / "episodes.jsonl")


def rate(eps: list[dict]) -> str:
    return f"{100 * sum(e['won'] for e in eps) / len(eps):.1f}% ({sum(e['won'] for e in eps)}/{len(eps)})"


def vs(p: dict) -> str:
    return f"+{p['b_only']} / -{p['a_only']} (p={p['p']:.2g})"


def per_episode(eps: list[dict]) -> tuple[float, float]:
    """(note calls, wasted steps) per episode."""
    notes = sum(e.get("meta_calls", {}).get("note", 0) for e in eps) / len(eps)
    return notes, sum(sum(wasted_steps(e).values()) for e in eps) / len(eps)


def row(name: str, d: Path, ref: Path) -> str:
    sft_vs, rl_vs = episodes(d, "sft", "vs"), episodes(d, "sft_grpo", "vs")
    sft_dev, rl_dev = episodes(d, "sft", "dev"), episodes(d, "sft_grpo", "dev")
    total = sum(float(m.read_text() or 0) for m in d.glob(".*.done")) / 60
    sel = json.loads((d / "curve.json").read_text()).get("rl_selected", {})
    picked = f"GRPO step {sel['step']}" if sel.get("stage") == "rl" else "SFT"
    cells = [
        name,
        ARMS[name][0],
        ARMS[name][1],
        rate(sft_vs),
        rate(sft_dev),
        picked,
        rate(rl_vs),
        rate(rl_dev),
        vs(paired(sft_vs, rl_vs)),
        vs(paired(sft_dev, rl_dev)),
    ]
    if d.resolve() == ref.resolve():
        cells += ["-", "-"]
    else:
        ref_dev = ref_on_dev(ref, d)
        games = {e["task_id"] for e in ref_dev}
        cells += [
            vs(paired(episodes(ref, "sft", "vs"), sft_vs)),
            f"{vs(paired(ref_dev, [e for e in sft_dev if e['task_id'] in games]))} on {len(games)}",
        ]
    n_sft, w_sft = per_episode(sft_vs)
    n_rl, w_rl = per_episode(rl_vs)
    cells += [f"{n_sft:.2f} / {n_rl:.2f}", f"{w_sft:.1f} / {w_rl:.1f}", f"{total:.1f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default="runs/full")
    ap.add_argument("--results", default="benchmarks/results/student")
    args = ap.parse_args()
    out, names = Path(args.out), [a for a in args.arms.split(",") if a]
    if unknown := [a for a in names if a not in ARMS]:
        sys.exit(f"unknown arms {unknown}; known: {list(ARMS)}")
    for name in [REF] + [n for n in names if n != REF]:
        run_arm(name, out / name)
    md = [
        "# Student levers at full scale (issue 11)",
        "",
        "Each arm is a whole main job (`evoharness run` with the overrides below; seed 0, step budgets). "
        "valid_seen: the 140-game panel; dev: the arm's 60 held-out train games (choices are made there). "
        "Paired: games only the second system won (+) / only the first won (-), exact two-sided sign test. "
        "GRPO vs SFT is within the arm (SFT + GRPO is the GRPO checkpoint best on the 20 curve dev games, "
        "or the SFT model); vs the reference compares the arms' SFT models (dev: on the arm's dev games the "
        f"reference never trained on). Minutes: the whole job on this 2-core machine (load average "
        f"{os.getloadavg()[0]:.1f} when written; arms ran at different loads: see the main job's machine.txt).",
        "",
        "| arm | lever | setting | SFT valid_seen | SFT dev | SFT+GRPO is | SFT+GRPO valid_seen | SFT+GRPO dev "
        "| GRPO vs SFT (valid_seen) | GRPO vs SFT (dev) | SFT vs reference (valid_seen) | SFT vs reference (dev) | "
        "notes/ep SFT / SFT+GRPO | wasted/ep SFT / SFT+GRPO | job min |",
        "|" + "---|" * 15,
    ]
    md += [row(n, out / n, out / REF) for n in names]
    md += (
        [
            "",
            "Overrides per arm: " + "; ".join(f"{n}: `{' '.join(ARMS[n][2]) or '(defaults)'}`" for n in names),
            "",
            f"Command: `python -m experiments.student_levers.student_full_scale --arms {','.join(names)}` "
            "(all_games needs `$ALFWORLD_DATA`, the ALFWorld json_2.1.1 release; games_1200 builds its games from that "
            "release's tarballs with `scripts/build_pack.py`).",
            "",
            "## Reading",
            "",
        ]
        + [f"- {x}" for x in READING]
        + [""]
    )
    Path(args.results).mkdir(parents=True, exist_ok=True)
    (Path(args.results) / "full_scale.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
