"""`RecordStore` on disk: what a restarted gateway finds."""

from __future__ import annotations

from evoharness.rollout.records import CallAttempt, CallRecord
from evoharness.runtime.record_store import RecordStore


def rec(eid: str, k: int) -> CallRecord:
    return CallRecord(
        execution_id=eid,
        call_id=f"c{k}",
        role="main",
        model="m",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        policy_version=0,
        finish_reason="stop",
        t_start=0.0,
        t_end=1.0,
        attempts=[CallAttempt("b", 0.0, 1.0, None)],
        constraint={"commands": ["look"], "meta_verbs": [], "max_new_tokens": 8},
    )


def test_reopened_store_lists_every_execution_and_skips_a_torn_line(tmp_path):
    long_id, short_id = "sweep/" + "x" * 300, "game#3 ü"
    store = RecordStore(tmp_path)
    for k in range(3):
        store.append(rec(long_id, k))
    store.append(rec(short_id, 0))
    (f,) = [p for p in tmp_path.iterdir() if "~" not in p.name and p.name.startswith("game")]
    with f.open("a") as fh:
        fh.write('{"execution_id": "game#3 ü", "call_id": "c1", "pro')  # a crash mid-append
    again = RecordStore(tmp_path)
    assert again.executions() == {long_id: 3, short_id: 1}  # the long id was missing after a restart
    assert [r.call_id for r in again.read(long_id, 1)] == ["c1", "c2"]
    assert again.read(short_id)[0].constraint == {"commands": ["look"], "meta_verbs": [], "max_new_tokens": 8}
    again.append(rec(short_id, 2))  # appended after the torn line, not glued to it
    assert [r.call_id for r in RecordStore(tmp_path).read(short_id)] == ["c0", "c2"]
    assert again.executions() == RecordStore(tmp_path).executions() == {long_id: 3, short_id: 2}
