"""Search faults: where the student's search moves part from the scripted teacher's, per panel.

Usage: python benchmarks/search_faults.py --run [LABEL=]runs/main [[LABEL=]DIR ...]
       [--results benchmarks/results/student/search_faults] [--note TEXT]

A search move is a turn whose think reads "the next receptacle to search is R." (rule 6 and 9 of
`policies.teacher`): R is the first entry of TRACK RESULT's unsearched list, and the action goes
to R, or opens or examines it when R shares the agent's location (no ``go to R`` is admissible).
For each turn of the run's evaluation
panels (``<run>/eval/<system>/episodes.jsonl``: the main job's SFT and SFT + GRPO models, the
teacher, on valid_seen, the development games and the unseen-room panel; a diagnosis of reported
games, never used for a choice) where the teacher, handed the
student's own prompt (`train.dagger.teacher_label`), makes a search move, the student's completion
is one of:

- ``think``: its think names another receptacle than the teacher's (a copy error from the list),
  filed by where the named receptacle stands (`think_slip`): ``later`` in the unsearched list,
  ``same type`` as R but not listed (another instance number: searched already, or none such), or
  ``unlisted`` (another type, or searched already); and counted against the search turns whose R is
  instance 1-3 or 4 and higher (``by_instance``: the bundled training rooms' search targets are
  nearly all instances 1-3);
- ``co-located``: the same R, which shares the agent's location, but not the teacher's ``open`` /
  ``examine`` (the action grammar sends the ``go to`` to another receptacle);
- ``action``: the same R, reachable by ``go to``, but another command (a copy error from the think);
- ``other``: no search move (a track, a look, ...).

Each lost episode is filed under its first such fault (or ``none``), also counted per task type
and panel (the unseen-room panel's against valid_seen's: where rooms the student never trained in
cost it games). For the SFT data
(``<run>/sft_examples.jsonl``) it counts the search examples and those that open or examine R where
the agent stands. Several runs (main jobs that differ in one lever) add a table side by side: each
one's success, GRPO against SFT paired per game, and its fault turns. Writes ``<results>.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from evoharness.envs.alfworld.games import TASK_SHORT, TASK_TYPES
from evoharness.eval.run_report import paired
from evoharness.files import read_jsonl
from evoharness.train.dagger import teacher_label

SYSTEMS = tuple(f"{panel}{s}" for panel in ("", "dev_", "unseen_") for s in ("scripted_teacher", "sft", "rl_last"))
KINDS = ("think", "co-located", "action", "other")
SLIPS = ("later", "same type", "unlisted")
_SEARCH = "the next receptacle to search is "
_UNSEARCHED = re.compile(r"Unsearched \(\d+\): (.*)\.$", re.M)  # "<object>: not seen yet. Unsearched (14): ..."


def search_move(completion: str) -> tuple[str, str] | None:
    """(R as the think names it, the action) of a search move, else None."""
    if _SEARCH not in completion or "<action>" not in completion:
        return None
    target = completion.split(_SEARCH, 1)[1].split(".</think>", 1)[0]
    return target, completion.split("<action>", 1)[1].split("</action>", 1)[0]


def fault(turn: dict) -> tuple[str, str] | None:
    """(the kind of the turn's search fault (module docstring), the teacher's R); None where the
    teacher makes no search move; kind "" where the student makes the teacher's move."""
    teacher = search_move(teacher_label(turn["messages"]))
    if teacher is None:
        return None
    student = search_move(turn["completion"])
    if student is None:
        return "other", teacher[0]
    if student[0] != teacher[0]:
        return "think", teacher[0]
    if student[1] == teacher[1]:
        return "", teacher[0]
    return ("action" if teacher[1].startswith("go to ") else "co-located"), teacher[0]


def high_instance(receptacle: str) -> bool:
    """Whether `receptacle` (``shelf 8``) is instance 4 or higher."""
    return int(receptacle.rsplit(" ", 1)[1]) >= 4


def think_slip(turn: dict, named: str, teacher: str) -> str:
    """Where the receptacle `named` by a ``think`` fault stands against the teacher's `teacher` (the
    first of TRACK RESULT's unsearched list in the turn's prompt): one of `SLIPS`."""
    m = _UNSEARCHED.search(turn["messages"][-1]["content"])
    if m and named in m.group(1).split(", "):
        return "later"
    return "same type" if named.rsplit(" ", 1)[0] == teacher.rsplit(" ", 1)[0] else "unlisted"


def panel_row(eps: list[dict]) -> dict:
    """Fault counts of one evaluation panel's episodes and the first fault of each lost episode."""
    turns, slips, lost, searches = Counter(), Counter(), {}, 0
    by_instance = {b: Counter() for b in ("1-3", "4+")}  # search turns and think faults by the teacher's R
    by_type: dict[str, Counter] = {t: Counter() for t in TASK_TYPES}
    for e in eps:
        moves = [(i, *f) for i, t in enumerate(e["turns"]) if (f := fault(t)) is not None]
        searches += len(moves)
        for i, k, r in moves:
            by_instance["4+" if high_instance(r) else "1-3"].update(["turns"] + (["think"] if k == "think" else []))
            if k == "think":
                slips[think_slip(e["turns"][i], search_move(e["turns"][i]["completion"])[0], r)] += 1
        kinds = [(i, k) for i, k, _ in moves if k]
        turns.update(k for _, k in kinds)
        if not e["won"]:
            lost[e["task_id"].split("/")[0]] = f"{kinds[0][1]} (turn {kinds[0][0]})" if kinds else "none"
            by_type[e["task_id"].split("-", 1)[0]][kinds[0][1] if kinds else "none"] += 1
    return {
        "episodes": len(eps),
        "won": sum(e["won"] for e in eps),
        "search_turns": searches,
        "fault_turns": {k: turns[k] for k in KINDS},
        "think_slips": {k: slips[k] for k in SLIPS},
        "by_instance": {b: {"turns": c["turns"], "think": c["think"]} for b, c in by_instance.items()},
        "lost_first_fault": dict(sorted(lost.items())),
        "lost_first_fault_by_type": {t: dict(sorted(c.items())) for t, c in by_type.items()},
    }


def sft_row(path: Path) -> dict:
    """Search examples of the SFT data, and those that open or examine R where the agent stands."""
    searches = here = 0
    for example in read_jsonl(path):
        if move := search_move(example["completion"]):
            searches += 1
            here += move[1].split(" ", 1)[0] in ("open", "examine")
    return {"search_examples": searches, "open_or_examine_there": here}


def run_rows(run: Path) -> tuple[dict, dict, dict | None]:
    """One main-job run's episodes per panel, their fault rows, and its SFT-data row."""
    episodes = {
        s: read_jsonl(run / "eval" / s / "episodes.jsonl")
        for s in SYSTEMS
        if (run / "eval" / s / "episodes.jsonl").is_file()
    }
    if not episodes:
        sys.exit(f"no evaluation episodes under {run}/eval")
    sft = sft_row(run / "sft_examples.jsonl") if (run / "sft_examples.jsonl").is_file() else None
    return episodes, {s: panel_row(eps) for s, eps in episodes.items()}, sft


def summary_row(label: str, episodes: dict, panels: dict) -> str:
    """One run's line of the comparison table: success, GRPO against SFT paired, fault turns."""

    def won(s: str) -> str:
        return f"{panels[s]['won']}/{panels[s]['episodes']}" if s in panels else "-"

    def vs(a: str, b: str) -> str:
        if a not in episodes or b not in episodes:
            return "-"
        c = paired(episodes[a], episodes[b])
        return f"+{c['b_only']} / -{c['a_only']} (p {c['p']:.3g})"

    def faults(s: str) -> str:
        if s not in panels:
            return "-"
        r = panels[s]
        n = r["fault_turns"]["think"] + r["fault_turns"]["co-located"]
        return f"{n} of {r['search_turns']}"

    return (
        f"| {label} | {won('sft')} | {won('dev_sft')} | {won('rl_last')} | {won('dev_rl_last')} | "
        f"{vs('sft', 'rl_last')} | {vs('dev_sft', 'dev_rl_last')} | {faults('sft')} / {faults('rl_last')} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--run",
        required=True,
        nargs="+",
        metavar="[LABEL=]DIR",
        help="main-job output directories (eval/<system>/episodes.jsonl), optionally labelled",
    )
    ap.add_argument("--results", default="benchmarks/results/student/search_faults")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    runs = {(a.split("=", 1)[0] if "=" in a else a): Path(a.split("=", 1)[-1]) for a in args.run}
    rows = {label: run_rows(run) for label, run in runs.items()}
    lines = [
        "# Search faults: where the student's search moves part from the teacher's",
        "",
        f"`python benchmarks/search_faults.py {' '.join(sys.argv[1:])}`. On every turn where the scripted "
        "teacher, handed the student's own prompt, makes a search move (\"the next receptacle to search is "
        "R\"; search turns), the student's move: think = its think names another receptacle; co-located = the same R, "
        "at the agent's location, but not the teacher's open / examine; action = the same R, another "
        "command; other = no search move. Lost games: each one's first such fault (turn index).",
        "",
    ]
    if len(rows) > 1:
        lines += [
            "| run | SFT valid_seen | SFT dev | SFT + GRPO valid_seen | SFT + GRPO dev | GRPO vs SFT valid_seen "
            "| GRPO vs SFT dev | think + co-located fault turns of the teacher's search turns, valid_seen "
            "(SFT / SFT + GRPO) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [summary_row(label, episodes, panels) for label, (episodes, panels, _) in rows.items()]
        lines.append("")
    for label, (_, panels, sft) in rows.items():
        lines += [
            f"## {label}",
            "",
            "| panel | won | search turns | think | co-located | action | other | lost games: first fault |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in panels.items():
            first = ", ".join(f"{g}: {k}" for g, k in r["lost_first_fault"].items()) or "-"
            lines.append(
                f"| {name} | {r['won']}/{r['episodes']} | {r['search_turns']} | "
                + " | ".join(str(r["fault_turns"][k]) for k in KINDS)
                + f" | {first} |"
            )
        models = {n: r for n, r in panels.items() if "teacher" not in n}
        if any(r["won"] < r["episodes"] for r in models.values()):
            lines += [
                "",
                "Lost games by task type: how many, and each one's first fault (none: no search fault).",
                "",
                "| panel | " + " | ".join(TASK_SHORT[t] for t in TASK_TYPES) + " |",
                "|---|" + "---|" * len(TASK_TYPES),
            ]
            for name, r in models.items():
                cells = [
                    f"{sum(c.values())}: " + ", ".join(f"{k} {n}" for k, n in c.items()) if c else "0"
                    for c in (r["lost_first_fault_by_type"][t] for t in TASK_TYPES)
                ]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if any(r["fault_turns"]["think"] for r in models.values()):
            lines += [
                "",
                "Think faults by where the receptacle the student names stands: later in the unsearched list, "
                "the same type as the teacher's but not listed (searched already, or no such instance), or "
                "unlisted (another type); and the think faults among the search turns whose R (the teacher's) is "
                "instance 1-3 or 4 and higher.",
                "",
                "| panel | think | " + " | ".join(SLIPS) + " | think / search turns, teacher's R instance 1-3 | 4+ |",
                "|---|---|" + "---|" * len(SLIPS) + "---|---|",
            ]
            for name, r in models.items():
                cells = [name, str(r["fault_turns"]["think"]), *(str(r["think_slips"][k]) for k in SLIPS)]
                cells += [f"{c['think']} / {c['turns']}" for c in r["by_instance"].values()]
                lines.append("| " + " | ".join(cells) + " |")
        if sft:
            lines += [
                "",
                f"SFT data: {sft['search_examples']} search examples, {sft['open_or_examine_there']} of "
                "them open or examine R where the agent stands.",
            ]
        lines.append("")
    lines += [args.note] if args.note else []
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {label: {"run": str(runs[label]), "panels": p, "sft": sft} for label, (_, p, sft) in rows.items()}, indent=2
        )
        + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
