"""Is the SFT student brittle where a note is skipped? Its SFT model played with one meta verb withheld.

Usage: python -m experiments.rl_levers.note_skip_probe --run RUN [RUN ...] [--verb note]
       [--out runs/note_skip_probe] [--results benchmarks/results/student/note_skip_probe] [--note TEXT]

Issue 50's cost arm (`rl_levers.py`, ``cost_won_8``) cut steps mostly by skipping the teacher's ``note``,
which under the main job's fixed experience store changes nothing within an episode, and lost games it
SFT won right after such a skip (`first_divergence.py`). This probe asks whether the skip alone is enough:
each run's SFT model (``sft/final``) plays its three panels (valid_seen, dev, unseen rooms) exactly as the
main job's evaluation does (greedy, constrained, the run's experience store), except that constrained
decoding never offers ``--verb`` (the BPE harness's ``meta_verbs`` without it), so at every state where
SFT would write a note it takes its next-likeliest admissible action. Paired per game against the run's own
SFT evaluation: games lost (only the run's SFT won), games won, and on the games both won the steps.
Evaluations run in this process (one worker), each panel once; an evaluation that exists under ``--out``
is not redone. ``--verb none`` withholds nothing: the control that the one-worker evaluation replays the
run's own. Writes ``<results>.md`` and ``<results>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.results_file import write_results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", required=True, help="finished main jobs (their SFT models and evaluations)")
    ap.add_argument(
        "--verb", default="note", choices=["track", "commit", "recall", "note", "none"], help="none: the control"
    )
    ap.add_argument("--out", default="runs/note_skip_probe")
    ap.add_argument("--results", default="benchmarks/results/student/note_skip_probe")
    ap.add_argument("--note", default="")
    args = ap.parse_args()

    from evoharness.eval.cost import paired_cost
    from evoharness.eval.evaluate import evaluate
    from evoharness.eval.run_report import paired, sign_test
    from evoharness.files import read_jsonl
    from evoharness.harness.base import META_VERBS
    from evoharness.harness.bpe.harness import BPEHarness
    from evoharness.pipeline import RunConfig, eval_config, model_policy

    BPEHarness.meta_verbs = tuple(v for v in META_VERBS if v != args.verb)  # the grammar never offers it
    rows = []
    for run in map(Path, args.run):
        cfg = RunConfig.model_validate_json((run / "run_config.json").read_text())
        dev = json.loads((run / "dev_games.json").read_text())
        out = Path(args.out) / f"seed{cfg.seed}"
        policy = model_policy(cfg, run / "sft" / "final")
        store = run / "experience.json"
        no = f"no_{args.verb}"
        panels = [
            ("valid_seen", "sft", eval_config(cfg, out, f"sft_{no}", policy, store)),
            ("dev", "dev_sft", eval_config(cfg, out, f"dev_sft_{no}", policy, store, dev)),
            ("unseen", "unseen_sft", eval_config(cfg, out, f"unseen_sft_{no}", policy, store, split=cfg.unseen_split)),
        ]
        for panel, base, ecfg in panels:
            ecfg.workers = 1  # in this process, where the harness's verbs are patched
            probe = Path(ecfg.out_dir) / "episodes.jsonl"
            if not (Path(ecfg.out_dir) / "summary.json").exists():
                evaluate(ecfg)
            a, b = read_jsonl(run / "eval" / base / "episodes.jsonl"), read_jsonl(probe)
            pair = paired(a, b)
            calls = sum((e.get("meta_calls") or {}).get(args.verb, 0) for e in b)
            rows.append(
                {
                    "seed": cfg.seed,
                    "panel": panel,
                    "n": pair["n"],
                    "sft": pair["a_only"] + pair["both"],
                    "probe": pair["b_only"] + pair["both"],
                    "wins": pair["b_only"],
                    "losses": pair["a_only"],
                    "p": float(f"{pair['p']:.3g}"),
                    "verb_calls": calls,
                    "cost": paired_cost(a, b),
                }
            )
    lines = [
        f"# The SFT models without `{args.verb}`: is a skipped {args.verb} enough to lose a game?",
        "",
        f"`python -m experiments.rl_levers.note_skip_probe {' '.join(sys.argv[1:])}`",
        "",
        f"Each run's SFT model on its panels with `{args.verb}` never offered by constrained decoding, paired per "
        "game against the same model's evaluation with it (the run's). wins / losses: games only the probe / only "
        "SFT won; p: exact two-sided sign test; steps: on the games both won (p: exact sign-flip permutation test).",
        "",
        f"| seed | panel | SFT | without {args.verb} | wins | losses | p | steps SFT -> without | fewer / more | p | "
        f"{args.verb} calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        st = r["cost"]["steps"]
        lines.append(
            f"| {r['seed']} | {r['panel']} | {r['sft']}/{r['n']} | {r['probe']}/{r['n']} | {r['wins']} | "
            f"{r['losses']} | {r['p']} | {st['a']:.2f} -> {st['b']:.2f} | {st['fewer']} / {st['more']} | "
            f"{st['p']:.3g} | {r['verb_calls']} |"
        )
    w, lo = sum(r["wins"] for r in rows), sum(r["losses"] for r in rows)
    lines += [
        "",
        f"Pooled over every seed and panel: {sum(r['sft'] for r in rows)} -> {sum(r['probe'] for r in rows)} of "
        f"{sum(r['n'] for r in rows)} games, +{w} / -{lo} (p = {sign_test(w, lo):.3g}).",
    ]
    lines += [args.note] if args.note else []
    write_results(args.results, lines, rows)


if __name__ == "__main__":
    main()
