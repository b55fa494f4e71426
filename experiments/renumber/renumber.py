"""Renumbered receptacles: SFT examples whose receptacle instances carry other numbers (lost; JOURNAL.md).

The student finds the next receptacle to search by copying the first entry of
TRACK RESULT's unsearched list (`harness.bpe.search`). In the teacher's traces
that entry is nearly always a low-numbered instance: of the 7,525 SFT examples
of seed 2's default main job, 1,240 search moves go to an instance 1, 6 to an
instance 9 and 13 to one numbered 10 or more. The student learns the numbers'
prior instead of the copy: over the three seeds' SFT models of
benchmarks/results/student/main_job_seeds.md (valid_seen and dev; an ad hoc
count with `train.dagger.teacher_label`), it named the teacher's receptacle in
76-80% of the search moves to instances 1-3 and in none of the 47 to an
instance 9 or higher, and every seed lost valid_seen's CreditCard-227, which
must search ``shelf 10`` (thirteen shelves).

This module rewrites an example with every instance of a receptacle type moved
up by one offset per type (``shelf 1 .. shelf 13`` -> ``shelf 7 .. shelf 19``),
in the prompt and the completion alike, the admissible commands re-sorted as
the environment sorts them. A monotone shift keeps every order the harness
renders (TRACK RESULT's natural order, the observation's listing), location
numbers (``loc 10``) and counts are not names and stay. The scripted teacher
decides from the rendered message alone (`train.dagger.teacher_label`), so a
rewrite is kept only where the teacher, handed the rewritten prompt, writes the
rewritten completion: the pair is then a state the teacher would label so.

Once in the product as ``RunConfig.renumber_rate`` (the fraction of teacher
examples replaced by their rewrite; default 0). Measured at seed 0 with the
default's 2000 SFT steps, rate 0.5 (results/main_job_renumber/): SFT 97/140
valid_seen and 43/60 dev against the default's 127/140 and 53/60 on the same
box, 5% dev at SFT step 1000 against 45%; CreditCard-227 still lost: at this
budget the harder copy task costs more than it teaches. At rate 0.1
(results/main_job_renumber01/) SFT 128/140 and 55/60, SFT + GRPO 128/140 and
57/60, CreditCard-227 still lost: within one draw's spread (sd 2 games,
benchmarks/results/student/main_job_seeds.md).
"""

from __future__ import annotations

import random
import re

from evoharness.harness.bpe.search import GENERIC_ORDER
from evoharness.train.dagger import teacher_label

# longest first so an alternation never stops at a shorter type's prefix; `\b` keeps
# "desk 1" from matching inside "desklamp 1"
_INSTANCE = re.compile(r"\b(" + "|".join(sorted(GENERIC_ORDER, key=len, reverse=True)) + r") (\d+)\b")
_ADMISSIBLE = "ADMISSIBLE COMMANDS: "


def renumber_text(text: str, shift: dict[str, int]) -> str:
    """`text` with each receptacle instance ``<type> k`` of a type in `shift` as ``<type> k + shift[type]``."""
    return _INSTANCE.sub(lambda m: f"{m.group(1)} {int(m.group(2)) + shift.get(m.group(1), 0)}", text)


def sort_admissible(text: str) -> str:
    """The prompt's ADMISSIBLE COMMANDS line in the environment's (lexicographic) order."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(_ADMISSIBLE):
            lines[i] = _ADMISSIBLE + ", ".join(sorted(line[len(_ADMISSIBLE) :].split(", ")))
    return "\n".join(lines)


def renumber_example(example: dict, rng: random.Random, max_shift: int) -> dict | None:
    """`example` (an SFT row: ``messages``, ``completion``) with each receptacle type it names
    shifted by its own offset drawn from 0..`max_shift` (row key ``renumbered``: the offsets);
    None where no offset is drawn above 0 or the teacher labels the rewritten prompt otherwise."""
    text = "\n".join(m["content"] for m in example["messages"]) + "\n" + example["completion"]
    types = sorted({m.group(1) for m in _INSTANCE.finditer(text)})
    shift = {t: rng.randint(0, max_shift) for t in types}
    if not any(shift.values()):
        return None
    messages = [{**m, "content": sort_admissible(renumber_text(m["content"], shift))} for m in example["messages"]]
    completion = renumber_text(example["completion"], shift)
    try:
        if teacher_label(messages) != completion:
            return None
    except ValueError:  # not a BPE-harness prompt: the teacher cannot check it
        return None
    return {**example, "messages": messages, "completion": completion, "renumbered": shift}


def renumber_examples(examples: list[dict], rate: float, max_shift: int = 10, seed: int = 0) -> tuple[list[dict], int]:
    """Each example replaced, with probability `rate`, by its rewrite (`renumber_example`); the
    list keeps its size and order. Returns (the examples, how many were replaced).

    Raises:
        ValueError: `rate` outside [0, 1] or `max_shift` < 1.
    """
    if not 0.0 <= rate <= 1.0 or max_shift < 1:
        raise ValueError(f"renumber: rate must be in [0, 1] and max_shift >= 1 (got {rate}, {max_shift})")
    rng = random.Random(f"renumber:{seed}")
    out, n = [], 0
    for ex in examples:
        new = renumber_example(ex, rng, max_shift) if rng.random() < rate else None
        out.append(new or ex)
        n += new is not None
    return out, n
