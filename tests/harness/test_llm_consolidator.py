"""The LLM consolidator through the official client against a real HTTP server on loopback."""

import json
import re

import pytest

from evoharness.harness.bpe import ExperienceStore
from evoharness.harness.bpe.llm_consolidator import LLMConsolidator


def llm_ops(mode: str):
    """A reply function: real ops on the prompt's entry ids, garbage, or HTTP 500."""

    def reply(body):
        if mode == "500":
            return 500
        if mode == "garbage":
            return "I would add it."
        ids = [int(i) for i in re.findall(r"^\[(\d+)\]", body["messages"][-1]["content"], re.M)]
        ops = [
            {
                "op": "UPDATE",
                "entry_id": ids[0],
                "text": "Merged: check the sinkbasin before the countertop.",
                "reason": "repeats",
            },
            {"op": "REMOVE", "entry_id": ids[1], "reason": "wrong"},
            {"op": "ADD", "category": "mistakes", "text": "Never open the fridge twice in a row.", "reason": "new"},
            {"op": "UPDATE", "entry_id": 99999, "reason": "hallucinated id"},
        ]
        return "```json\n" + json.dumps(ops) + "\n```"

    return reply


def _batch(store: ExperienceStore) -> None:
    store.freeze()
    store.note("mistakes: never open the fridge twice in a row")
    store.record_pickup("apple", "fridge")
    store.unfreeze()


def test_llm_ops_are_applied_and_bad_ids_skipped(chat_server):
    server, calls = chat_server(llm_ops("ok"))
    store = ExperienceStore()
    first, second = [e.id for e in store.entries("mistakes")][:2]
    hits = store.find_location("apple", "fridge").hits
    _batch(store)
    ops = store.consolidate(LLMConsolidator(server, "m", max_retries=0))
    assert "never open the fridge twice" in calls[0][2]["messages"][-1]["content"]
    assert store.get(first).text.startswith("Merged:") and store.get(first).uses == 2
    assert store.get(second) is None
    assert any(e.text == "Never open the fridge twice in a row." for e in store.entries("mistakes"))
    assert any(o.op == "SKIP" and "99999" in o.reason for o in ops)
    assert store.find_location("apple", "fridge").hits == hits + 1  # counters still go through the rules


@pytest.mark.parametrize("mode", ["garbage", "500"])
def test_endpoint_failure_falls_back_to_rules(chat_server, mode):
    server, _ = chat_server(llm_ops(mode))
    store, ref = ExperienceStore(), ExperienceStore()
    _batch(store)
    _batch(ref)
    cons = LLMConsolidator(server, "m", max_retries=0)
    ops = store.consolidate(cons)
    ref.consolidate()
    assert cons.last_error
    assert [e.text for e in store.all_entries()] == [e.text for e in ref.all_entries()]
    assert any("llm failed" in o.reason for o in ops)
