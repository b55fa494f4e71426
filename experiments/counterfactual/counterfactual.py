"""Counterfactual observations: minimal pairs that make the student read what it sees (lost; JOURNAL.md).

The SFT student learns where a goal object usually is (the recalled hints and
the search order predict it) faster than it learns to read the receptacle's
contents: it says "There is a <goal> here" at receptacles that lack the goal
object, and the action grammar then takes whatever admissible object shares
the name's prefix. In the teacher's traces the two are confounded: the teacher
goes where the object probably is.

This module breaks the confound with minimal pairs. At a search step of a
teacher trace it edits only what the agent sees at its receptacle:

* where the goal object is visible (the teacher takes it), every instance of
  it leaves the observation, the same text in PREVIOUS ACTIONS and the
  admissible ``take`` commands;
* where it is not (the teacher moves on), one instance (``<goal> k``, k unused
  in the prompt) joins the list at a random position, with its admissible
  ``take <goal> k from <receptacle>``.

The harness's TRACK RESULT is live (`harness.bpe.harness`): when it tracks the goal
object it answers from the belief of this turn, so an edit must change it too.
An insertion can (a goal object not seen yet becomes ``<goal> k: in/on
<receptacle>, in view`` above the same unsearched list); a removal cannot (the "not seen yet" line lists the
unsearched receptacles, which the prompt does not show), nor can any edit
under a live ``track world``: those states get no twin.

The scripted teacher decides from the rendered message alone
(`policies.teacher.teacher_completion`), so it labels the edited prompt; an
edit is kept only if the label flips as it must (no take of the goal type
after a removal; ``take <goal> k`` after an insertion). Everything else in the
prompt (objective, history, plan, hints, system prompt) is the original's, so
the pair differs in the observation alone. Like DAgger's relabelling (Ross et
al. 2011) it needs a teacher that can label any state; unlike DAgger it needs
no student rollouts. It is data augmentation in the sense of counterfactual
data augmentation for NLP (Kaushik et al. 2020, "Learning the Difference that
Makes a Difference with Counterfactually-Augmented Data").

Once in the product as ``RunConfig.counterfactual_rate`` (default 0). Measured once, seed 0,
rate 1: SFT 59/140 valid_seen against the reference's 81/140, dev 20/60
against 22/60 (benchmarks/results/student/full_scale.md, arm
``counterfactual``): not a win at this model size. That run found search steps
by the teacher's reason text (+1,717 twins on 7,108 examples); this rule reads
the teacher's action instead (+1,677 on the same traces).
"""

from __future__ import annotations

import random
import re

from evoharness.harness.bpe.belief import type_of
from evoharness.policies.teacher import current_subgoal, location, parse_prompt, teacher_completion

_OBS_RE = re.compile(r"OBSERVATION: (.*?)\n\n", re.S)
_LIST_RE = re.compile(r"you see (.*)\.$")
_ADM_RE = re.compile(r"ADMISSIBLE COMMANDS: (.*?)(?:\n\n|$)", re.S)
_ACTION_RE = re.compile(r"<action>(.*)</action>$")
_LIVE_TRACK_RE = re.compile(r"TRACK RESULT:\n\(track (.*), live\)\n(.*?)(?=\n\n|$)", re.S)


def split_items(listing: str) -> list[str] | None:
    """``"a cd 2, a pen 1, and a mug 1"`` -> ``["cd 2", "pen 1", "mug 1"]``;
    ``"nothing"`` -> ``[]``; None if the text is not such a list."""
    if listing == "nothing":
        return []
    parts = listing.split(", ")
    if len(parts) > 1:
        if not parts[-1].startswith("and "):
            return None
        parts[-1] = parts[-1][len("and ") :]
    items = [p[2:] for p in parts if p.startswith("a ")]
    return items if len(items) == len(parts) and all(re.fullmatch(r"[a-z]+ \d+", i) for i in items) else None


def join_items(items: list[str]) -> str:
    """Inverse of `split_items` (ALFWorld's wording)."""
    if not items:
        return "nothing"
    named = [f"a {i}" for i in items]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + ", and " + named[-1]


def _edit(text: str, obs: str, new_obs: str, drop: set[str], add: str | None) -> str | None:
    """The prompt with the observation replaced (everywhere it appears, i.e. also
    as the last action's feedback) and the admissible commands edited."""
    m = _ADM_RE.search(text)
    if m is None:
        return None
    adm = m.group(1).split(", ")
    if adm != sorted(adm):  # the engines list them sorted; an insertion must keep that
        return None
    kept = [c for c in adm if not any(re.search(rf"\b{re.escape(o)}\b", c) for o in drop)]
    if add:
        kept = sorted(kept + [add])
    text = text[: m.start(1)] + ", ".join(kept) + text[m.end(1) :]
    return text.replace(obs, new_obs)


def counterfactual(example: dict, rng: random.Random) -> dict | None:
    """The minimal-pair twin of one SFT example, or None if it is not a search
    step for the goal object at a receptacle whose contents are listed.

    Args:
        example: an SFT example (``messages`` = [system, user], ``completion``
            the teacher's ``<think>…</think><action>…</action>``).
        rng: draws the inserted instance's number and list position.

    Returns:
        A copy with the edited user message, the teacher's completion for it and
        ``counterfactual`` = ``"removed"`` or ``"inserted"``.
    """
    msgs = example.get("messages") or []
    if len(msgs) < 2 or msgs[-1].get("role") != "user":
        return None
    text = msgs[-1]["content"]
    action = _ACTION_RE.search(example.get("completion", ""))
    m = _OBS_RE.search(text)
    if action is None or m is None:
        return None
    view = parse_prompt(text)
    goal = view.goal.obj
    if not goal or not current_subgoal(view).startswith("find "):
        return None
    obs = m.group(1)
    lm = _LIST_RE.search(obs)
    items = split_items(lm.group(1)) if lm else None
    here = location(view)
    if items is None or here is None:
        return None
    live = _LIVE_TRACK_RE.search(text)
    if live and not (live.group(1) == goal and live.group(2).startswith(f"{goal}: not seen yet")):
        return None  # a live view this edit would have to change and cannot (module docstring)
    mine = [i for i in items if type_of(i) == goal]
    took = re.fullmatch(rf"take ({goal} \d+) from {re.escape(here)}", action.group(1))
    if took and mine:
        kept = [i for i in items if i not in mine]
        new_text = _edit(text, obs, obs[: lm.start(1)] + join_items(kept) + ".", set(mine), None)
        # another instance mentioned elsewhere (history, track result) would make the pair inconsistent
        if new_text is None or live or re.search(rf"\b{goal} \d+\b", new_text):
            return None
        kind = "removed"
    elif action.group(1).startswith("go to ") and not mine:
        free = [k for k in range(1, 6) if not re.search(rf"\b{goal} {k}\b", text)]
        if not free:
            return None
        new = f"{goal} {rng.choice(free)}"
        pos = rng.randrange(len(items) + 1)
        listed = items[:pos] + [new] + items[pos:]
        new_text = _edit(text, obs, obs[: lm.start(1)] + join_items(listed) + ".", set(), f"take {new} from {here}")
        if new_text is None:
            return None
        if live:  # the tracked goal, not seen yet, is now in view here; the unsearched list stays
            head = live.group(0)[: live.start(2) - live.start(0)]
            unsearched = live.group(2).split(". ", 1)[1]
            new_text = new_text.replace(live.group(0), f"{head}{new}: in/on {here}, in view\n{unsearched}", 1)
        kind = "inserted"
    else:
        return None
    completion = teacher_completion(new_text)
    takes = re.search(rf"<action>take ({goal} \d+) from ", completion)
    if (kind == "removed" and takes) or (kind == "inserted" and not (takes and takes.group(1) == new)):
        return None
    return {
        **example,
        "messages": msgs[:-1] + [{"role": "user", "content": new_text}],
        "completion": completion,
        "counterfactual": kind,
    }


def add_counterfactuals(examples: list[dict], rate: float, seed: int = 0) -> list[dict]:
    """The examples followed by the counterfactual twins of a `rate` fraction of
    the eligible ones (drawn with `seed`).

    Raises:
        ValueError: `rate` outside [0, 1].
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"counterfactual rate must be in [0, 1], got {rate}")
    rng = random.Random(f"counterfactual:{seed}")
    twins = []
    for ex in examples:
        if rate > 0 and rng.random() < rate and (twin := counterfactual(ex, rng)) is not None:
            twins.append(twin)
    return examples + twins
