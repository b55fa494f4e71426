"""Progress P_t: the commit grammar, capacity 8, feedback instead of exceptions."""

from __future__ import annotations

from evoharness.harness.bpe.progress import Progress


def test_add_and_set_status():
    p = Progress()
    assert p.render().startswith("(empty")
    assert p.commit("find apple") == "Added 'find apple' (pending)."
    assert p.commit("find apple").endswith("already in the plan (pending).")
    assert p.commit("find apple: done") == "'find apple' -> done."
    assert p.commit("heat apple = active") == "Added 'heat apple' (active)."
    assert p.commit("[put apple in diningtable] -> todo").startswith("Added")
    assert p.to_list() == [("find apple", "done"), ("heat apple", "active"), ("put apple in diningtable", "pending")]
    assert p.active == ["heat apple"]
    assert p.render().splitlines() == [
        "1. [x] find apple (done)",
        "2. [>] heat apple (active)",
        "3. [ ] put apple in diningtable (pending)",
    ]


def test_index_trailing_status_multi_and_drop():
    p = Progress()
    p.commit("plan: find apple; heat apple; put apple in fridge")
    assert [s for s, _ in p.to_list()] == ["find apple", "heat apple", "put apple in fridge"]
    assert p.commit("2: in progress") == "'heat apple' -> active."
    assert p.commit("find apple done") == "'find apple' -> done."  # trailing status word on a known subgoal
    assert p.commit("heat apple: done; put apple in fridge: active").count("->") == 2
    assert p.commit("1: drop") == "Dropped 'find apple'."
    assert p.to_list() == [("heat apple", "done"), ("put apple in fridge", "active")]
    assert p.status_of("Put Apple in Fridge") == "active"


def test_bad_arguments_give_feedback_and_change_nothing():
    p = Progress()
    p.commit("find apple")
    before = p.to_list()
    for arg in ("", "   ", "[]", "find apple: sideways", "7: done", "ghost: drop", ": done", "x" * 81):
        msg = p.commit(arg)
        assert msg.startswith("Error"), (arg, msg)
    assert p.to_list() == before
    # valid updates before a bad one in a ';' list are kept, and reported
    msg = p.commit("find apple: done; find pear: wobbly")
    assert msg.startswith("'find apple' -> done.") and "Error" in msg
    assert p.status_of("find apple") == "done"
    assert p.commit("plan: " + "; ".join(f"s{i}" for i in range(9))).startswith("Error")


def test_capacity_8_evicts_oldest_done_or_refuses():
    p = Progress()
    for i in range(8):
        assert p.commit(f"step {i}").startswith("Added")
    assert p.commit("step 8").startswith("Error: the plan is full (8)")
    assert len(p.items) == 8
    p.commit("step 3: done")
    p.commit("step 5: done")
    assert p.commit("step 8: active") == "Added 'step 8' (active)."
    assert len(p.items) == 8 and p.status_of("step 3") is None and p.status_of("step 5") == "done"


def test_only_commit_changes_the_plan():
    p = Progress()
    p.commit("find apple: active")
    rendered = p.render()
    _ = p.status_of("find apple"), p.active, p.to_list(), p.render()
    assert p.render() == rendered
