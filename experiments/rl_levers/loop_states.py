"""How far each model is from leaving the loops a student lost in: the teacher's log-probability
margin at the states where the student started repeating itself (a DAgger-style probe).

Usage: python -m experiments.rl_levers.loop_states --episodes runs/main/eval/rl_screen/episodes.jsonl
       --models NAME=DIR [NAME=DIR ...] [--results benchmarks/results/student/loop_states] [--note TEXT]

Most of the SFT student's lost games end in a loop: in a look game it tracks the desk lamp, sees it
"in view", and tracks it again until the repeat rule ends the episode. In each *lost* episode of ``--episodes``
(training games, e.g. the main job's RL screening; never a reported panel) the loop state is the first
turn that repeats an action with nothing changed in between (`train.rewards.spam_turns`, where
`pipeline.screened_games` starts a branch), kept when the scripted teacher, which decides from the
rendered message alone (`policies.teacher.teacher_completion`), would do something else there. Each
model scores, with the prompt ids the student saw, the log-probability (natural log, summed over the
completion's tokens and EOS, unconstrained) of the teacher's completion and of the student's repeat:

- margin = log P(teacher) - log P(student repeat), mean over states (> 0: the teacher's is likelier);
- flipped = states with margin > 0.

Success moves in whole games; this moves with every update, so it shows whether a lever pushes the
student's own failure the right way and how far it has to go. Writes ``<results>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def loop_states(episodes: list[dict]) -> list[dict]:
    """Per lost episode, the first repeated action the teacher would not repeat (see module doc).

    Returns dicts with ``task_id``, ``task_type``, ``prompt_ids``, ``student`` / ``teacher``
    (completion texts) and ``student_action`` / ``teacher_action``."""
    from evoharness.policies.teacher import teacher_completion
    from evoharness.rollout.records import Trajectory
    from evoharness.train.rewards import spam_turns

    out = []
    for e in episodes:
        if e["won"]:
            continue
        traj = Trajectory.from_dict(e)
        repeats = [i for i in spam_turns(traj) if traj.turns[i].prompt_token_ids]
        if not repeats:
            continue
        t = traj.turns[repeats[0]]
        teacher = teacher_completion(t.messages[-1]["content"])
        action = teacher.split("<action>")[-1].split("</action>")[0].strip()
        if action != t.action:
            out.append(
                {
                    "task_id": e["task_id"],
                    "task_type": e["task_type"],
                    "prompt_ids": t.prompt_token_ids,
                    "student": t.completion,
                    "teacher": teacher,
                    "student_action": t.action,
                    "teacher_action": action,
                }
            )
    return out


def completion_logprob(model, prompt_ids: list[int], completion_ids: list[int]) -> float:
    """Sum of log P(completion token | prefix) under `model` (natural log)."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt_ids) - 1 : -1].float(), -1)
    return float(logp.gather(1, torch.tensor(completion_ids)[:, None]).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", required=True, help="an evaluation's episodes.jsonl (training games)")
    ap.add_argument("--models", nargs="+", required=True, metavar="NAME=DIR")
    ap.add_argument("--results", default="benchmarks/results/student/loop_states")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--note", default="")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evoharness.files import read_jsonl

    torch.set_num_threads(args.threads)
    states = loop_states(read_jsonl(args.episodes))
    if not states:
        sys.exit(f"{args.episodes}: no lost episode with a repeated action the teacher would not repeat")
    models = [m.split("=", 1) for m in args.models]
    tok = AutoTokenizer.from_pretrained(models[0][1])
    enc = {
        s: tok.encode(s, add_special_tokens=False) + [tok.eos_token_id]
        for st in states
        for s in (st["teacher"], st["student"])
    }
    rows = []
    for name, path in models:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        lp = [
            (
                completion_logprob(model, st["prompt_ids"], enc[st["teacher"]]),
                completion_logprob(model, st["prompt_ids"], enc[st["student"]]),
            )
            for st in states
        ]
        margins = [t - s for t, s in lp]
        rows.append(
            {
                "model": name,
                "path": path,
                "margin": sum(margins) / len(margins),
                "teacher_logp": sum(t for t, _ in lp) / len(lp),
                "student_logp": sum(s for _, s in lp) / len(lp),
                "flipped": sum(m > 0 for m in margins),
                "n": len(margins),
            }
        )
    kinds = Counter(f"{st['student_action']} -> {st['teacher_action'].split()[0]} ({st['task_type']})" for st in states)
    lines = (
        [
            "# The teacher's margin where the student's lost episodes start to loop",
            "",
            f"`python -m experiments.rl_levers.loop_states {' '.join(sys.argv[1:])}`",
            "",
            f"{len(states)} loop states (the first repeated action of a lost episode that the teacher would "
            f"not repeat) in `{args.episodes}`. Mean log P (nats, summed over the completion) of the teacher's "
            "completion and of the student's repeat given the student's prompt; margin = their difference; "
            "flipped: states where the teacher's is the likelier.",
            "",
            "| model | log P teacher | log P repeat | margin | flipped |",
            "|---|---|---|---|---|",
        ]
        + [
            f"| {r['model']} | {r['teacher_logp']:.2f} | {r['student_logp']:.2f} | {r['margin']:.2f} | "
            f"{r['flipped']}/{r['n']} |"
            for r in rows
        ]
        + [
            "",
            "States (student's repeat -> teacher's action): "
            + ", ".join(f"{k}: {v}" for k, v in kinds.most_common())
            + ".",
        ]
        + ([args.note] if args.note else [])
    )
    res = Path(args.results)
    res.parent.mkdir(parents=True, exist_ok=True)
    res.with_suffix(".md").write_text("\n".join(lines) + "\n")
    res.with_suffix(".json").write_text(
        json.dumps({"episodes": args.episodes, "kinds": dict(kinds), "rows": rows}, indent=1)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
