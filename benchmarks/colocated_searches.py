"""Searches that meet a receptacle at the agent's own location: how many lost games they explain.

Usage: python benchmarks/colocated_searches.py --run runs/main
       [--results benchmarks/results/student/colocated] [--note TEXT]

Some ALFWorld receptacles share a location (cabinet 3 and cabinet 4): standing at one, the other
has no admissible ``go to``; it is opened or examined where the agent stands. The scripted teacher
does so (``<think>... the next receptacle to search is cabinet 4.</think><action>open cabinet
4</action>``), but its traces meet the case rarely. A student whose think names such a receptacle
and then writes ``go to`` is held to the admissible commands by the action grammar, which takes the
likeliest *admissible* ``go to`` target: another receptacle, often one already searched, and the
search loops.

For each of the run's evaluation panels (``<run>/eval/<system>/episodes.jsonl``: the main job's
SFT and SFT + GRPO models, the teacher; a diagnosis of reported games, never used for a choice)
this counts the turns whose think names the next receptacle X while ``go to X`` is not admissible
and ``open X`` or ``examine X`` is, and the lost episodes with such a turn. For the SFT data
(``<run>/sft_examples.jsonl``) it counts the search examples (think "search is X") whose action
opens or examines X there. Writes ``<results>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SYSTEMS = ("scripted_teacher", "sft", "rl_last", "dev_scripted_teacher", "dev_sft", "dev_rl_last")


def search_target(completion: str) -> tuple[str, str] | None:
    """(X, action) of a completion whose think says "the next receptacle to search is X.", else None."""
    if "search is " not in completion or "<action>" not in completion:
        return None
    target = completion.split("search is ", 1)[1].split(".</think>", 1)[0]
    return target, completion.split("<action>", 1)[1].split("</action>", 1)[0]


def colocated_turns(episode: dict) -> int:
    """Turns of `episode` whose named search target X is at the agent's location (no ``go to X``;
    ``open X`` or ``examine X`` admissible)."""
    n = 0
    for turn in episode["turns"]:
        if found := search_target(turn["completion"]):
            x, adm = found[0], set(turn["admissible_commands"])
            n += f"go to {x}" not in adm and bool({f"open {x}", f"examine {x}"} & adm)
    return n


def panel_row(path: Path) -> dict:
    """Counts of one evaluation panel (module docstring)."""
    eps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    hits = [colocated_turns(e) for e in eps]
    lost = [h for e, h in zip(eps, hits) if not e["won"]]
    return {"episodes": len(eps), "won": sum(e["won"] for e in eps), "turns": sum(hits),
            "episodes_with": sum(h > 0 for h in hits), "lost": len(lost), "lost_with": sum(h > 0 for h in lost),
            "lost_games_with": sorted(e["task_id"].split("/")[0] for e, h in zip(eps, hits) if h and not e["won"])}


def sft_row(path: Path) -> dict:
    """Search examples of the SFT data, and those that open or examine the named receptacle."""
    searches = acted_here = 0
    for line in path.read_text().splitlines():
        if line.strip() and (found := search_target(json.loads(line)["completion"])):
            searches += 1
            acted_here += found[1] in (f"open {found[0]}", f"examine {found[0]}")
    return {"search_examples": searches, "open_or_examine_there": acted_here}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a main-job output directory (eval/<system>/episodes.jsonl)")
    ap.add_argument("--results", default="benchmarks/results/student/colocated")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    run = Path(args.run)
    panels = {s: panel_row(run / "eval" / s / "episodes.jsonl") for s in SYSTEMS
              if (run / "eval" / s / "episodes.jsonl").is_file()}
    if not panels:
        sys.exit(f"no evaluation episodes under {run}/eval")
    sft = sft_row(run / "sft_examples.jsonl") if (run / "sft_examples.jsonl").is_file() else None
    lines = ["# Searches meeting a receptacle at the agent's own location", "",
             f"`python benchmarks/colocated_searches.py {' '.join(sys.argv[1:])}`. A co-located search turn: the "
             "think names the next receptacle X, `go to X` is not admissible and `open X` or `examine X` is (the "
             "action grammar then sends a `go to` elsewhere).", "",
             "| panel | won | co-located search turns | episodes with one | lost | lost with one | lost games with one |",
             "|---|---|---|---|---|---|---|"]
    for name, r in panels.items():
        lines.append(f"| {name} | {r['won']}/{r['episodes']} | {r['turns']} | {r['episodes_with']} | {r['lost']} | "
                     f"{r['lost_with']} | {', '.join(r['lost_games_with']) or '-'} |")
    if sft:
        lines += ["", f"SFT data: {sft['search_examples']} search examples (think \"search is X\"), "
                      f"{sft['open_or_examine_there']} of them open or examine X where the agent stands."]
    lines += [args.note] if args.note else []
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"panels": panels, "sft": sft}, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
