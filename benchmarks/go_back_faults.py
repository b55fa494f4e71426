"""Games lost by walking past a seen object: world moves away from an instance TRACK RESULT shows.

Usage: python benchmarks/go_back_faults.py --run NAME=DIR [NAME=DIR ...]
       [--results benchmarks/results/student/go_back_faults] [--note TEXT]

For each finished main job (``DIR``), each reported system (SFT, SFT + GRPO; `systems.json`) and each
panel it played (valid_seen, the development games, the unseen-room panel), every turn's rendered
TRACK RESULT is read: a *go-back state* is one where it lists an instance of the tracked type in/on a
receptacle R while none is held or in view and R is not of a type where the agent placed one (the
rule of `Belief.go_back`, re-derived from the text so that jobs run before the "Go back to" line are
read alike; where the line is rendered, the count of states whose line names another receptacle is
reported, and is 0). A *go-back fault* is a world move in such a state that is not ``go to`` /
``open`` / ``examine`` one of those receptacles: the scripted teacher always goes there (pick-two's
second object after the first is placed; the desklamp while the look object is carried). Per panel
and task type: games, lost games, lost games with a go-back fault, and the go-back states' world
moves (right / all). A diagnosis of reported games, not used for any choice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from results_file import write_results

from evoharness.envs.alfworld.games import TASK_SHORT
from evoharness.files import read_jsonl
from evoharness.harness.bpe.belief import GO_BACK_HEADER, type_of

_LINE_RE = re.compile(r"^([a-z]+ \d+): (held by you|in/on ([a-z]+ \d+))(.*)$")
PANELS = (("valid_seen", ""), ("dev", "dev_"), ("unseen rooms", "unseen_"))


def go_back_receptacles(track: str) -> list[str]:
    """Receptacles holding a seen instance the agent should go back to (`Belief.go_back`'s rule on the
    rendered ``track`` text): empty when one is held, one of them is in view, or none lies elsewhere
    (an instance in a receptacle of a type one was placed in does not count)."""
    lines = [m for ln in track.split("\n") if (m := _LINE_RE.match(ln.strip()))]
    if any(m.group(2) == "held by you" for m in lines):
        return []
    placed = {type_of(m.group(3)) for m in lines if m.group(3) and "placed by you" in m.group(4)}
    seen = [m for m in lines if m.group(3) and type_of(m.group(3)) not in placed]
    return [] if any(", in view" in m.group(4) for m in seen) else [m.group(3) for m in seen]


def episode_faults(episode: dict) -> tuple[int, int, int, bool]:
    """(go-back states with a world move, of them right, rendered lines naming another receptacle,
    whether any move was a fault)."""
    states = right = mismatched = 0
    for t in episode["turns"]:
        track = (t.get("views") or {}).get("TRACK RESULT", "")
        recs = go_back_receptacles(track)
        if line := next((ln for ln in track.split("\n") if ln.startswith(GO_BACK_HEADER)), None):
            mismatched += not recs or f" {recs[0]} (" not in line
        if not recs or t.get("kind") != "env":
            continue
        states += 1
        right += any(t["action"] in (f"go to {r}", f"open {r}", f"examine {r}") for r in recs)
    return states, right, mismatched, right < states


def summarise(run: Path) -> list[dict]:
    """One row per (system, panel, task type) of main job `run`, and an ``all`` row per panel."""
    systems = json.loads((run / "systems.json").read_text())
    rows = []
    for label, ev in (("SFT", systems["sft"]), ("SFT + GRPO", systems["sft_grpo"])):
        for panel, prefix in PANELS:
            path = run / "eval" / f"{prefix}{ev}" / "episodes.jsonl"
            if not path.exists():
                continue
            by_type: dict[str, dict] = {}
            for e in read_jsonl(path):
                states, right, mismatched, fault = episode_faults(e)
                for key in (TASK_SHORT[e["task_type"]], "all"):
                    r = by_type.setdefault(
                        key,
                        {"system": label, "panel": panel, "type": key, "games": 0, "lost": 0, "lost_fault": 0}
                        | {"states": 0, "right": 0, "mismatched": 0},
                    )
                    r["games"] += 1
                    r["lost"] += not e["won"]
                    r["lost_fault"] += (not e["won"]) and fault
                    r["states"] += states
                    r["right"] += right
                    r["mismatched"] += mismatched
            rows += [by_type[k] for k in sorted(by_type, key=lambda k: k == "all")]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", required=True, metavar="NAME=DIR")
    ap.add_argument("--results", default="benchmarks/results/student/go_back_faults")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    runs = {name: summarise(Path(d)) for name, _, d in (s.partition("=") for s in args.run)}
    lines = [
        "# Games lost walking past a seen object (go-back faults)",
        "",
        f"`python benchmarks/go_back_faults.py {' '.join(sys.argv[1:])}`. A go-back state: TRACK RESULT lists "
        "an instance of the tracked type in/on R, none held or in view, R not of a type one was placed in; "
        "a fault: a world move there that does not go to (open, examine) such an R. Lost with a fault: lost "
        "games with at least one. Moves right: the go-back states' world moves that went there. Line off: "
        "rendered `Go back to` lines naming another receptacle than the rule (0 when the job has the line; "
        "jobs before it have none).",
        "",
        "| job | system | panel | lost / games | lost with a go-back fault | moves right / go-back states | line off |",
        "|---" * 7 + "|",
    ]
    for name, rows in runs.items():
        for r in rows:
            if r["type"] != "all":
                continue
            lines.append(
                f"| {name} | {r['system']} | {r['panel']} | {r['lost']}/{r['games']} | {r['lost_fault']} | "
                f"{r['right']}/{r['states']} | {r['mismatched']} |"
            )
    lines += ["", "Lost games with a go-back fault / lost games, by task type (all jobs summed):", ""]
    types = list(dict.fromkeys(r["type"] for rows in runs.values() for r in rows if r["type"] != "all"))
    lines += ["| system | panel | " + " | ".join(types) + " |", "|---" * (len(types) + 2) + "|"]
    for system in ("SFT", "SFT + GRPO"):
        for panel, _ in PANELS:
            cells = []
            for tt in types:
                key = (system, panel, tt)
                rs = [r for rows in runs.values() for r in rows if (r["system"], r["panel"], r["type"]) == key]
                if rs:
                    cells.append(f"{sum(r['lost_fault'] for r in rs)} / {sum(r['lost'] for r in rs)}")
            if cells:
                lines.append(f"| {system} | {panel} | " + " | ".join(cells) + " |")
    lines += ["", f"{os.cpu_count()} CPUs (the counts do not depend on the load)."] + ([args.note] if args.note else [])
    write_results(args.results, lines, runs)


if __name__ == "__main__":
    main()
