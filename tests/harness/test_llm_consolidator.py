"""The LLM consolidator through the official client against a real HTTP server on loopback."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evoharness.harness.bpe import ExperienceStore
from evoharness.harness.bpe.llm_consolidator import LLMConsolidator


class Handler(BaseHTTPRequestHandler):
    mode = "ok"
    prompts: list[str] = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        Handler.prompts.append(user)
        if Handler.mode == "500":
            self.send_response(500)
            self.end_headers()
            return
        ids = [int(i) for i in re.findall(r"^\[(\d+)\]", user, re.M)]
        ops = [{"op": "UPDATE", "entry_id": ids[0], "text": "Merged: check the sinkbasin before the countertop.",
                "reason": "repeats"},
               {"op": "REMOVE", "entry_id": ids[1], "reason": "wrong"},
               {"op": "ADD", "category": "mistakes", "text": "Never open the fridge twice in a row.", "reason": "new"},
               {"op": "UPDATE", "entry_id": 99999, "reason": "hallucinated id"}]
        content = "```json\n" + json.dumps(ops) + "\n```" if Handler.mode == "ok" else "I would add it."
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    Handler.mode, Handler.prompts = "ok", []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def _batch(store: ExperienceStore) -> None:
    store.freeze()
    store.note("mistakes: never open the fridge twice in a row")
    store.record_pickup("apple", "fridge")
    store.unfreeze()


def test_llm_ops_are_applied_and_bad_ids_skipped(server):
    store = ExperienceStore()
    first, second = [e.id for e in store.entries("mistakes")][:2]
    hits = store.find_location("apple", "fridge").hits
    _batch(store)
    ops = store.consolidate(LLMConsolidator(server, "m", max_retries=0))
    assert "never open the fridge twice" in Handler.prompts[0]
    assert store.get(first).text.startswith("Merged:") and store.get(first).uses == 2
    assert store.get(second) is None
    assert any(e.text == "Never open the fridge twice in a row." for e in store.entries("mistakes"))
    assert any(o.op == "SKIP" and "99999" in o.reason for o in ops)
    assert store.find_location("apple", "fridge").hits == hits + 1  # counters still go through the rules


@pytest.mark.parametrize("mode", ["garbage", "500"])
def test_endpoint_failure_falls_back_to_rules(server, mode):
    Handler.mode = mode
    store, ref = ExperienceStore(), ExperienceStore()
    _batch(store)
    _batch(ref)
    cons = LLMConsolidator(server, "m", max_retries=0)
    ops = store.consolidate(cons)
    ref.consolidate()
    assert cons.last_error
    assert [e.text for e in store.all_entries()] == [e.text for e in ref.all_entries()]
    assert any("llm failed" in o.reason for o in ops)
