"""Experience E_t: capacity 80 + LFU, top-3 per category, use counts, frozen
buffer, consolidation (ADD / UPDATE / REMOVE / SKIP), persistence, seeds."""

from __future__ import annotations

import json

from evoharness.harness.bpe.experience import (
    CATEGORIES,
    ExperienceStore,
    Op,
    Pending,
    RuleConsolidator,
    infer_mode,
    infer_note_category,
    keywords,
)


def _tag(i: int) -> str:
    """A distinct letters-only word per integer (keywords drop digits)."""
    return "q" + "".join("abcdefghij"[int(c)] for c in f"{i:02d}")


def _skill(store, text):
    return store.apply([Op("ADD", "general", text=text)])[0].entry_id


def test_seeds_make_recall_useful_from_the_start():
    store = ExperienceStore()
    stats = store.stats()
    assert all(0 < stats[c] <= 80 for c in CATEGORIES)
    r = store.recall("where: apple")
    assert r.mode == "where-to-find"
    assert [e.recep for e in r.hits["locations"]] == ["countertop", "fridge"]
    how = store.recall("how to heat an egg")
    assert how.mode == "how-to-do" and any("microwave" in e.text for e in how.hits["general"])
    assert set(how.hits) == {"general", "task"}
    assert store.recall("mistakes with the microwave").hits["mistakes"]
    assert "nothing recalled" in store.recall("where: unicorn").text


def test_keywords_and_mode_inference():
    assert keywords("Heating the Apples in a microwave 1") == {"heat", "apple", "microwave"}
    assert keywords("cold") == {"cool"}
    assert infer_mode("where: apple") == ("where-to-find", "apple")
    assert infer_mode("how-to-do: heat") == ("how-to-do", "heat")
    assert infer_mode("mistakes: fridge")[0] == "mistakes"
    assert infer_mode("where can I find a mug")[0] == "where-to-find"
    assert infer_mode("how do I cool a tomato")[0] == "how-to-do"
    assert infer_mode("what should I avoid")[0] == "mistakes"
    assert infer_mode("apple")[0] == "all"
    assert infer_note_category("don't open the safe twice")[0] == "mistakes"
    assert infer_note_category("mugs are often in the coffeemachine")[0] == "locations"
    assert infer_note_category("skill: go to the target right after heating") == (
        "general",
        "go to the target right after heating",
    )
    assert infer_note_category("heat the egg before placing it")[0] == "task"


def test_top3_per_category_and_use_counts():
    store = ExperienceStore(seed=False)
    ids = [_skill(store, f"tip {i} about the microwave and the egg number{i}") for i in range(5)]
    _skill(store, "unrelated advice on pillows")
    store.apply([Op("ADD", "mistakes", text="do not leave the egg in the microwave")])
    hits = store.retrieve("microwave egg")
    assert len(hits["general"]) == 3 and len(hits["mistakes"]) == 1 and hits["task"] == [] and hits["locations"] == []
    assert [e.id for e in hits["general"]] == ids[:3]  # equal overlap -> equal uses -> oldest first
    assert all(store.get(i).uses == 2 for i in ids[:3]) and store.get(ids[3]).uses == 1  # new = 1, +1 per retrieval
    again = store.retrieve("microwave egg")["general"]
    assert [e.id for e in again] == ids[:3] and store.get(ids[0]).uses == 3
    store.retrieve("microwave egg", count_use=False)
    assert store.get(ids[0]).uses == 3


def test_capacity_80_lfu_eviction():
    store = ExperienceStore(seed=False)
    ids = [_skill(store, f"skill number {_tag(i)}") for i in range(80)]
    store.retrieve(f"{_tag(0)} {_tag(1)}")  # uses: entries 0 and 1 -> 2
    store.retrieve(_tag(0))  # entry 0 -> 3
    applied = store.apply([Op("ADD", "general", text="brand new skill gamma delta")])
    assert len(store.entries("general")) == 80
    evicted = [o for o in applied if o.op == "REMOVE"]
    assert len(evicted) == 1 and evicted[0].reason == "lfu-evicted"
    assert evicted[0].entry_id == ids[2]  # fewest uses (1), oldest among those
    assert store.get(ids[0]) is not None and store.get(ids[1]) is not None
    assert store.entries("general")[-1].uses == 1  # new entries start at 1
    assert len(store.entries("mistakes")) == 0  # capacity is per category


def test_frozen_store_buffers_writes_until_consolidation():
    store = ExperienceStore()
    prior = store.find_location("apple", "countertop")
    hits0, uses0 = prior.hits, prior.uses
    store.freeze()
    assert store.note("mugs are often in the sinkbasin").startswith("Noted")
    store.note("mistake: opening the safe wastes a step")
    store.record_pickup("apple", "countertop")
    store.record_pickup("apple", "garbagecan")
    store.where_to_find("apple")
    # reads see the frozen state only
    assert prior.hits == hits0 and prior.uses == uses0
    assert store.find_location("apple", "garbagecan") is None
    assert store.recall("where: mug sinkbasin").hits["locations"][0].recep != "sinkbasin"
    assert not any("safe" in e.text for e in store.entries("mistakes"))
    kinds = [p.kind for p in store.pending]
    assert kinds.count("note") == 2 and kinds.count("pickup") == 2 and kinds.count("use") >= 2
    ops = store.consolidate()
    kinds = {o.op for o in ops}
    assert {"ADD", "UPDATE"} <= kinds
    assert store.pending == [] and store.epoch == 1 and store.frozen  # still frozen; the loop unfreezes
    assert prior.hits == hits0 + 1 and prior.uses > uses0
    assert store.find_location("apple", "garbagecan").hits == 1
    assert store.find_location("mug", "sinkbasin") is not None
    assert any("safe" in e.text for e in store.entries("mistakes"))


def test_unfrozen_pickups_update_priors_online_but_notes_wait():
    store = ExperienceStore()
    store.record_pickup("kettle", "stoveburner")
    assert store.find_location("kettle", "stoveburner").hits == 1
    store.record_pickup("kettle", "stoveburner")
    assert store.find_location("kettle", "stoveburner").hits == 2
    store.note("always close the fridge after looking inside it")
    assert not any("close the fridge" in e.text for e in store.all_entries())
    assert len(store.pending) == 1


def test_rule_consolidation_add_update_remove_skip():
    store = ExperienceStore(seed=False)
    old_id = _skill(store, "go to the sinkbasin to clean things quickly")
    stale_id = _skill(store, "a stale skill nobody retrieves ever")
    store.apply([Op("ADD", "locations", obj="apple", recep="safe", hits=1)])
    safe = store.find_location("apple", "safe")
    store.epoch = 3  # the stale skill was added 3 epochs ago and never used
    store.freeze()
    store.note("Go to the sinkbasin to clean things quickly!")  # duplicate of an entry -> UPDATE
    store.note("look under the bed for the pillow")  # new -> ADD
    store.note("look under the bed for a pillow")  # duplicate within the batch -> SKIP
    store.note("ok")  # too short -> SKIP
    for _ in range(3):
        store.record_miss("apple", "safe")  # contradicted prior -> REMOVE
    store.record_miss("apple", "toaster")  # no prior -> SKIP
    ops = store.consolidate()
    by = {k: [o for o in ops if o.op == k] for k in ("ADD", "UPDATE", "REMOVE", "SKIP")}
    assert any(o.entry_id == old_id for o in by["UPDATE"]) and store.get(old_id).uses == 2
    assert [o.text for o in by["ADD"]] == ["look under the bed for a pillow"] or [o.text for o in by["ADD"]] == [
        "look under the bed for the pillow"
    ]
    assert {o.reason for o in by["SKIP"]} == {"duplicate within batch", "too few keywords", "miss without prior"}
    removed = {o.entry_id: o.reason for o in by["REMOVE"]}
    assert removed[safe.id].startswith("contradicted") and removed[stale_id].startswith("unused")
    assert store.get(safe.id) is None and store.get(stale_id) is None and store.get(old_id) is not None


def test_consolidation_is_order_independent_and_hookable():
    def run(order):
        s = ExperienceStore(seed=False)
        s.freeze()
        for text in order:
            s.note(text)
        return [(o.op, o.text) for o in s.consolidate()]

    notes = [
        "use the desklamp while holding it",
        "open the drawer before taking from it",
        "use the desklamp while holding it",
    ]
    assert run(notes) == run(list(reversed(notes)))

    seen = {}

    def llm_like(store, pending: list[Pending]) -> list[Op]:
        seen["n"] = len(pending)
        return [Op("ADD", "task", text="summarised: " + " / ".join(p.text for p in pending if p.kind == "note"))]

    s = ExperienceStore(seed=False)
    s.note("heat the egg first")
    ops = s.consolidate(llm_like, epoch=7)
    assert seen["n"] == 1 and ops[0].op == "ADD" and s.epoch == 7
    assert s.entries("task")[0].text == "summarised: heat the egg first"
    assert isinstance(RuleConsolidator()(s, []), list)


def test_save_load_roundtrip_atomic(tmp_path):
    store = ExperienceStore()
    store.retrieve("where apple")
    store.freeze()
    store.note("the kettle is usually on the stoveburner")
    path = tmp_path / "exp" / "store.json"
    store.save(path)
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["store.json"]  # no temp file left
    loaded = ExperienceStore.load(path)
    assert loaded.to_dict() == store.to_dict()
    assert loaded.frozen and len(loaded.pending) == 1
    new_id = loaded.apply([Op("ADD", "general", text="fresh entry after load")])[0].entry_id
    assert new_id > max(e.id for e in store.all_entries())
