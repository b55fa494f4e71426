"""How much of a BPE-harness prompt a prefix cache could reuse from the trajectory's previous turn.

Usage: python benchmarks/prompt_prefix_share.py [--run runs/main] [--results benchmarks/results/prompt_prefix_share.md]
       [--note TEXT]

Issue 50's "more RL inside the budget" lever: a GRPO step is prefill-bound (``bench_grpo_step.txt``:
689K prompt tokens a step), and a prefix cache (the static engine's or vLLM's) reuses only the part
of a turn's prompt that is identical, from the first character, to the previous turn's. This reads
a main job's teacher SFT examples (``sft_examples.jsonl``: every turn of every training episode,
rendered as the student sees it), groups them by episode and, for each turn after the first, measures
(characters; BPE tokens follow them closely at this vocabulary):

- the common prefix with the previous turn's prompt (system + user message): what a cross-turn
  prefix cache reuses with today's layout;
- the characters of the user message's sections (``HEADER: ...`` blocks) whose text is unchanged
  since the previous turn: the most any reordering of the sections could put into that prefix (an
  upper bound: which sections stay unchanged varies from turn to turn, a fixed order cannot follow it);
- per section, its share of the prompt and how often (by characters) it is unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

from evoharness.files import read_jsonl


def section_name(block: str) -> str:
    """A user-message block's header (``TRACK RESULT`` of ``TRACK RESULT:\\n...``); "other" for a block
    without one (the game's opening text)."""
    head = block.split(":", 1)[0]
    return head if ":" in block and head.isupper() else "other"


def prefix_shares(examples: list[dict]) -> dict:
    """``{"turns", "chars", "common_prefix", "unchanged", "sections": {name: {"chars", "unchanged"}}}``
    over every turn after an episode's first (`examples`: SFT rows with ``episode_id``, ``turn``,
    ``messages``)."""
    episodes: dict[str, list[dict]] = defaultdict(list)
    for ex in examples:
        episodes[ex["episode_id"]].append(ex)
    total, common, unchanged, turns = 0, 0, 0, 0
    sec_chars, sec_same = Counter(), Counter()
    for rows in episodes.values():
        prev = None
        for ex in sorted(rows, key=lambda e: e["turn"]):
            text = "\n".join(m["content"] for m in ex["messages"])
            blocks = ex["messages"][-1]["content"].split("\n\n")
            if prev is not None:
                turns += 1
                total += len(text)
                common += len(os.path.commonprefix([prev[0], text]))
                for b in blocks:
                    sec_chars[section_name(b)] += len(b)
                    if b in prev[1]:
                        unchanged += len(b)
                        sec_same[section_name(b)] += len(b)
            prev = (text, set(blocks))
    return {
        "turns": turns,
        "chars": total,
        "common_prefix": common,
        "unchanged": unchanged,
        "sections": {s: {"chars": c, "unchanged": sec_same[s]} for s, c in sec_chars.most_common()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/main", help="a main job's directory (its sft_examples.jsonl)")
    ap.add_argument("--results", default="benchmarks/results/prompt_prefix_share.md")
    ap.add_argument("--note", default="", help="a line for the report (which run, which commit)")
    args = ap.parse_args()
    path = Path(args.run) / "sft_examples.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: not found (run the main job's collect stage first)")
    r = prefix_shares(read_jsonl(path))
    pct = lambda x: f"{100 * x / r['chars']:.1f}%"  # noqa: E731
    lines = [
        "# Prompt characters a cross-turn prefix cache could reuse",
        "",
        f"`python benchmarks/prompt_prefix_share.py {' '.join(sys.argv[1:])}`: {r['turns']:,} turns after an "
        f"episode's first, {r['chars']:,} prompt characters (system + user message).",
        "",
        f"- common prefix with the previous turn's prompt (today's layout): **{pct(r['common_prefix'])}**",
        f"- sections unchanged since the previous turn (the ceiling of any reordering): **{pct(r['unchanged'])}**",
        "",
        "| section | share of the prompt | unchanged since the previous turn |",
        "|---|---|---|",
    ]
    lines += [
        f"| {s} | {pct(v['chars'])} | {100 * v['unchanged'] / v['chars']:.1f}% |" for s, v in r["sections"].items()
    ]
    lines += ["", args.note] if args.note else []
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
