"""Where pick-two games are lost: the student's first move after placing the first object.

Usage: python benchmarks/pick_two_faults.py --run NAME=DIR [NAME=DIR ...]
       [--results benchmarks/results/student/pick_two] [--note TEXT]

For each finished main job (``DIR``) and each of its reported systems (SFT, SFT + GRPO;
`systems.json`), every pick-two episode of the eval split (and of the SFT model's screened training
games, ``eval/rl_screen``, where the job screened): the first world action after the first
successful ``put``, against what the scripted teacher does given the student's own prompt there
(`policies.teacher.teacher_completion`: it reads the rendered message alone). The teacher either
goes to get an instance TRACK RESULT already lists ("I saw another X in R") or searches the first
unsearched receptacle. A diagnosis of reported games, not used for any choice.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from results_file import write_results

from evoharness.files import read_jsonl
from evoharness.harness.base import META_VERBS
from evoharness.policies.teacher import teacher_completion

PICK_TWO = "pick_two_obj_and_place"


def second_search(episode: dict) -> dict | None:
    """The first world turn after the first successful put: the student's action, the teacher's on
    that prompt, and its kind: ``seen`` (the teacher goes to get an instance already seen), ``search``,
    or ``plan`` (the teacher would first mend the plan: the student skipped or garbled a commit);
    None without a put."""
    turns = episode["turns"]
    put = next(
        (
            i
            for i, t in enumerate(turns)
            if (t.get("action") or "").startswith("put ") and "You put" in (t.get("feedback") or "")
        ),
        None,
    )
    if put is None:
        return None
    for t in turns[put + 1 :]:
        action = t.get("action") or ""
        if action and action.split()[0] not in META_VERBS:
            teacher = teacher_completion(t["messages"][-1]["content"])
            want = teacher.split("<action>", 1)[1].split("</action>", 1)[0]
            kind = "plan" if want.split()[0] in META_VERBS else "seen" if "I saw another" in teacher else "search"
            return {"student": action, "teacher": want, "kind": kind}
    return None


def summarise(run: Path) -> list[dict]:
    """One row per reported system of main job `run`."""
    systems = json.loads((run / "systems.json").read_text())
    panels = [("SFT", systems["sft"]), ("SFT + GRPO", systems["sft_grpo"])]
    if (run / "eval" / "rl_screen" / "episodes.jsonl").exists():  # the SFT model on the RL stage's screened games
        panels.append(("SFT, screened train games", "rl_screen"))
    rows = []
    for label, ev in panels:
        eps = [e for e in read_jsonl(run / "eval" / ev / "episodes.jsonl") if e["task_type"] == PICK_TWO]
        row = {
            "system": label,
            "games": len(eps),
            "won": sum(e["won"] for e in eps),
            "lost_no_put": 0,
            "seen": 0,
            "seen_right": 0,
            "search": 0,
            "search_right": 0,
            "plan": 0,
            "plan_right": 0,
            "lost_seen_wrong": 0,
            "lost_search_wrong": 0,
            "lost_plan_wrong": 0,
            "lost_after_right": 0,
            "lost": [],
        }
        for e in eps:
            s = second_search(e)
            if s is None:
                row["lost_no_put"] += not e["won"]
                continue
            kind = s["kind"]
            right = s["student"] == s["teacher"]
            row[kind] += 1
            row[f"{kind}_right"] += right
            if not e["won"]:
                row["lost_after_right" if right else f"lost_{kind}_wrong"] += 1
                row["lost"].append({"game": e["task_id"].split("/")[0], **s})
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", required=True, metavar="NAME=DIR")
    ap.add_argument("--results", default="benchmarks/results/student/pick_two")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    runs = {}
    for spec in args.run:
        name, _, d = spec.partition("=")
        runs[name] = summarise(Path(d))
    lines = [
        "# Pick-two: the move after the first object is placed",
        "",
        f"`python benchmarks/pick_two_faults.py {' '.join(sys.argv[1:])}`. Per main job and reported system, "
        "the eval split's pick-two games (and the SFT model's on the RL stage's screened train games). At the "
        "first world action after the first successful put, the scripted teacher, handed the student's prompt, "
        "either goes to get an instance TRACK RESULT already "
        "lists (seen) or searches (search), unless the student's plan is off (plan: the teacher would first "
        "mend it with a commit, as when the commit after the put was skipped); right: the student's action is "
        "the teacher's. Lost: the lost games by that move (no put: lost before placing one).",
        "",
        "| job | system | won | seen: right | search: right | plan off | lost: seen, wrong | "
        "lost: search, wrong | lost: plan off | lost: right, then other | lost: no put |",
        "|---" * 11 + "|",
    ]
    for name, rows in runs.items():
        for r in rows:
            lines.append(
                f"| {name} | {r['system']} | {r['won']}/{r['games']} | {r['seen_right']}/{r['seen']} | "
                f"{r['search_right']}/{r['search']} | {r['plan']} | {r['lost_seen_wrong']} | "
                f"{r['lost_search_wrong']} | {r['lost_plan_wrong']} | {r['lost_after_right']} | "
                f"{r['lost_no_put']} |"
            )
    lines += ["", "Lost games (student's move / the teacher's):", ""]
    for name, rows in runs.items():
        for r in rows:
            for g in r["lost"]:
                lines.append(f"- {name}, {r['system']}: {g['game']} ({g['kind']}): `{g['student']}` / `{g['teacher']}`")
    lines += ["", f"{os.cpu_count()} CPUs (the counts do not depend on the load)."] + ([args.note] if args.note else [])
    write_results(args.results, lines, runs)


if __name__ == "__main__":
    main()
