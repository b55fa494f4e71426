"""Renumbered receptacles on real teacher traces: consistent rewrites the teacher labels the same."""

from __future__ import annotations

import random
import re

import pytest

from evoharness.train.dagger import teacher_label
from experiments.renumber.renumber import renumber_example, renumber_examples, renumber_text, sort_admissible

SEARCH_RE = re.compile(r"search is (\w+) (\d+)\.")


def test_a_rewrite_shifts_every_receptacle_and_nothing_else_and_undoes_exactly(teacher_examples):
    rng = random.Random(0)
    rewrites = [(ex, r) for ex in teacher_examples if (r := renumber_example(ex, rng, 10)) is not None]
    # every teacher state is labelled the same way after a consistent shift: none is rejected
    # except those whose offsets all came out 0
    assert len(rewrites) > 0.9 * len(teacher_examples)
    targets = [int(m.group(2)) for _, r in rewrites if (m := SEARCH_RE.search(r["completion"]))]
    assert max(targets) >= 10 and sum(t >= 5 for t in targets) > len(targets) / 3
    for ex, r in rewrites:
        # the teacher, handed the rewritten prompt, writes the rewritten completion
        assert teacher_label(r["messages"]) == r["completion"]
        back = {t: -k for t, k in r["renumbered"].items()}
        # undone and sorted as the environment sorts its admissible list, every message is the original
        assert [sort_admissible(renumber_text(m["content"], back)) for m in r["messages"]] == [
            m["content"] for m in ex["messages"]
        ]
        assert renumber_text(r["completion"], back) == ex["completion"]
        admissible = next(
            line for line in r["messages"][-1]["content"].split("\n") if line.startswith("ADMISSIBLE COMMANDS: ")
        )[len("ADMISSIBLE COMMANDS: ") :].split(", ")
        assert admissible == sorted(admissible)
        if m := SEARCH_RE.search(ex["completion"]):
            assert SEARCH_RE.search(r["completion"]).group(2) == str(int(m.group(2)) + r["renumbered"][m.group(1)])


def test_names_that_are_not_receptacle_instances_keep_their_numbers():
    text = "You arrive at loc 10. On the desk 1, you see a desklamp 1 and a cd 2. Unsearched (3): shelf 9, drawer 2."
    out = renumber_text(text, {"desk": 4, "shelf": 3, "drawer": 1})
    assert (
        out
        == "You arrive at loc 10. On the desk 5, you see a desklamp 1 and a cd 2. Unsearched (3): shelf 12, drawer 3."
    )


def test_a_rewrite_the_teacher_would_label_otherwise_is_dropped(teacher_examples):
    ex = next(e for e in teacher_examples if SEARCH_RE.search(e["completion"]))
    rtype, k = SEARCH_RE.search(ex["completion"]).groups()
    # a completion that does not follow the teacher's rule: a search 7 instances past the list's first
    wrong = {**ex, "completion": ex["completion"].replace(f"{rtype} {k}", f"{rtype} {int(k) + 7}")}
    assert renumber_example(wrong, random.Random(1), 10) is None
    assert renumber_example(ex, random.Random(1), 10) is not None


def test_the_rate_replaces_that_share_and_keeps_size_and_order(teacher_examples):
    same, n0 = renumber_examples(teacher_examples, 0.0, seed=0)
    assert same == teacher_examples and n0 == 0
    out, n = renumber_examples(teacher_examples, 0.5, seed=0)
    assert len(out) == len(teacher_examples) and 0.3 * len(teacher_examples) < n < 0.7 * len(teacher_examples)
    assert [(o["episode_id"], o["turn"]) for o in out] == [(e["episode_id"], e["turn"]) for e in teacher_examples]
    assert renumber_examples(teacher_examples, 0.5, seed=0) == (out, n)  # seeded
    with pytest.raises(ValueError):
        renumber_examples(teacher_examples, 1.5)
