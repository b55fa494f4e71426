"""benchmarks/prompt_prefix_share.py on the teacher's real SFT rows: what a cross-turn prefix cache reuses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from prompt_prefix_share import prefix_shares  # noqa: E402


def test_prefix_shares_count_each_turns_common_prefix_and_unchanged_sections(teacher_examples):
    r = prefix_shares(teacher_examples)
    episodes = {ex["episode_id"] for ex in teacher_examples}
    assert r["turns"] == len(teacher_examples) - len(episodes)
    # the system message and the objective never change within an episode: both are in every common prefix
    assert 0 < r["common_prefix"] <= r["chars"] and r["unchanged"] <= r["chars"]
    assert r["sections"]["OBJECTIVE"]["unchanged"] == r["sections"]["OBJECTIVE"]["chars"] > 0
    assert r["sections"]["PREVIOUS ACTIONS"]["unchanged"] < r["sections"]["PREVIOUS ACTIONS"]["chars"]
    # one episode recomputed by hand: the common prefix of consecutive turns' prompts
    first = sorted((ex for ex in teacher_examples if ex["episode_id"] == min(episodes)), key=lambda e: e["turn"])
    texts = ["\n".join(m["content"] for m in ex["messages"]) for ex in first]
    one = prefix_shares(first)
    assert one["common_prefix"] == sum(len(os.path.commonprefix([a, b])) for a, b in zip(texts, texts[1:]))
    assert one["chars"] == sum(len(t) for t in texts[1:])
