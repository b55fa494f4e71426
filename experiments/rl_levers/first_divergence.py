"""Where an RL arm loses the games its SFT model won: the first turn its action differs from SFT's.

Usage: python -m experiments.rl_levers.first_divergence --pair SEED=RUN,ARM_DIR [SEED=RUN,ARM_DIR ...]
       [--results benchmarks/results/student/first_divergence] [--note TEXT]

RUN is a finished main job (its SFT evaluations ``eval/sft``, ``eval/dev_sft``, ``eval/unseen_sft``), ARM_DIR
an `experiments.rl_levers.rl_levers` arm directory (``eval/<panel>_final``). Greedy decoding makes both
episodes of a game identical up to the first turn whose action differs; that turn is where the arm's
weights changed the outcome. Each such game is put in one class by the two actions there:

- ``skips <verb>``: SFT took the meta-action <verb> (track, commit, recall, note) and the arm went on to
  SFT's next action (``skips a world move`` likewise), or took any environment action instead;
- ``adds <verb>``: SFT acted in the world, the arm took the meta-action <verb>;
- ``other meta``: both took meta-actions, different ones, the arm's not SFT's next;
- ``world``: both acted in the world, differently (another receptacle, another instance).

Writes ``<results>.md`` (the class counts per seed and pooled, then every game) and ``<results>.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from benchmarks.results_file import write_results
from evoharness.files import read_jsonl
from evoharness.harness.base import META_VERBS

PANELS = (("valid_seen", "sft"), ("dev", "dev_sft"), ("unseen", "unseen_sft"))


def verb(action: str) -> str | None:
    """The meta verb an action starts with, or None for an environment action."""
    head = action.split(" ", 1)[0]
    return head if head in META_VERBS else None


def divergence_class(sft_action: str, arm_action: str, sft_next: str | None = None) -> str:
    """The class (module docstring) of the first differing pair of actions; `sft_next`: SFT's action after
    `sft_action` (the arm's action equal to it means the arm skipped `sft_action`)."""
    a, b = verb(sft_action), verb(arm_action)
    if sft_next is not None and arm_action == sft_next:
        return f"skips {a}" if a else "skips a world move"
    if a and b:
        return "other meta"
    if a:
        return f"skips {a}"
    if b:
        return f"adds {b}"
    return "world"


def lost_games(sft: list[dict], arm: list[dict]) -> list[dict]:
    """The games `sft` won and `arm` lost, each with its first differing turn and its class.

    Args:
        sft / arm: episodes.jsonl rows of one panel (matched by task id).

    Returns:
        ``[{"task_id", "turn", "sft_action", "arm_action", "class", "stop_reason"}]`` sorted by task id.
    """
    won = {e["task_id"]: e for e in sft if e["won"]}
    out = []
    for e in sorted(arm, key=lambda x: x["task_id"]):
        if e["won"] or e["task_id"] not in won:
            continue
        ta = [t["action"] for t in won[e["task_id"]]["turns"]]
        tb = [t["action"] for t in e["turns"]]
        k = next((i for i in range(min(len(ta), len(tb))) if ta[i] != tb[i]), min(len(ta), len(tb)))
        sa, sb = (ta[k] if k < len(ta) else "(end)"), (tb[k] if k < len(tb) else "(end)")
        out.append(
            {
                "task_id": e["task_id"],
                "turn": k,
                "sft_action": sa,
                "arm_action": sb,
                "class": divergence_class(sa, sb, ta[k + 1] if k + 1 < len(ta) else None),
                "stop_reason": e.get("stop_reason"),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs="+", required=True, metavar="SEED=RUN,ARM_DIR")
    ap.add_argument("--results", default="benchmarks/results/student/first_divergence")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows = []
    for spec in args.pair:
        seed, _, dirs = spec.partition("=")
        run, _, arm = dirs.partition(",")
        if not arm:
            sys.exit(f"--pair {spec!r}: expected SEED=RUN,ARM_DIR")
        for panel, base in PANELS:
            sft_file, arm_file = (
                Path(run, "eval", base, "episodes.jsonl"),
                Path(arm, "eval", f"{panel}_final", "episodes.jsonl"),
            )
            if not (sft_file.is_file() and arm_file.is_file()):
                continue
            for g in lost_games(read_jsonl(sft_file), read_jsonl(arm_file)):
                rows.append({"seed": seed, "panel": panel, **g})
    classes = sorted({r["class"] for r in rows})
    seeds = list(dict.fromkeys(r.partition("=")[0] for r in args.pair))
    count = collections.Counter((r["seed"], r["class"]) for r in rows)
    lines = [
        "# Where the arm loses what SFT won: the first differing turn",
        "",
        f"`python -m experiments.rl_levers.first_divergence {' '.join(sys.argv[1:])}`",
        "",
        "Games the SFT model won and the arm lost (valid_seen, dev and unseen rooms), by the class of the first "
        "turn whose greedy action differs (`first_divergence.py`: skips / adds a meta-action, another meta-action, "
        "another world move).",
        "",
        "| seed | " + " | ".join(classes) + " | all |",
        "|---" * (len(classes) + 2) + "|",
    ]
    for s in seeds:
        lines.append(
            f"| {s} | "
            + " | ".join(str(count[(s, c)]) for c in classes)
            + f" | {sum(count[(s, c)] for c in classes)} |"
        )
    lines.append(
        "| **all** | " + " | ".join(str(sum(count[(s, c)] for s in seeds)) for c in classes) + f" | {len(rows)} |"
    )
    lines += [
        "",
        "| seed | panel | game | turn | SFT | arm | class | stop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seed']} | {r['panel']} | {r['task_id']} | {r['turn']} | {r['sft_action']} | {r['arm_action']} | "
        f"{r['class']} | {r['stop_reason']} |"
        for r in rows
    ]
    lines += [args.note] if args.note else []
    write_results(args.results, lines, rows)


if __name__ == "__main__":
    main()
