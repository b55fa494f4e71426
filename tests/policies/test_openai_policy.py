"""The OpenAI-compatible policy against a real HTTP server on loopback."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evoharness.envs.alfworld import make_env
from evoharness.harness.react import ReActHarness
from evoharness.policies.base import PolicyRequest
from evoharness.policies.openai_policy import OpenAIPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes


class Handler(BaseHTTPRequestHandler):
    calls = []
    mode = "ok"

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.calls.append((self.path, self.headers.get("Authorization"), body))
        if Handler.mode == "500":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "boom"}}')
            return
        user = body["messages"][-1]["content"]
        line = next(ln for ln in user.splitlines() if ln.startswith("ADMISSIBLE COMMANDS:"))
        first = line.split(":", 1)[1].split(",")[0].strip()
        payload = {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"<think>try</think><action>{first}</action>"}}],
            "usage": {"prompt_tokens": 123, "completion_tokens": 9, "total_tokens": 132},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    Handler.calls, Handler.mode = [], "ok"
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_episode_through_endpoint(server, one_per_type, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test")
    policy = OpenAIPolicy(base_url=server, model="my-model", api_key_env="MY_KEY", max_tokens=64, concurrency=4)
    trajs = run_episodes([EpisodeSpec(one_per_type[0], "e#0"), EpisodeSpec(one_per_type[1], "e#1")], make_env,
                         ReActHarness, policy, max_steps=3)
    for t in trajs:
        assert t.steps == 3 and t.invalid_actions == 0 and t.env_steps == 3
        assert t.prompt_tokens == 3 * 123 and t.completion_tokens == 3 * 9
    path, auth, body = Handler.calls[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["model"] == "my-model" and body["max_tokens"] == 64 and body["messages"][0]["role"] == "system"
    assert len(Handler.calls) == 6


def test_server_errors_are_recorded_not_raised(server):
    Handler.mode = "500"
    policy = OpenAIPolicy(base_url=server, model="m", max_retries=1, timeout_s=5)
    req = PolicyRequest(messages=[{"role": "user", "content": "ADMISSIBLE COMMANDS: look"}], episode_id="e", turn=0,
                        admissible_commands=["look"])
    (c,) = policy.act([req])
    assert c.error and "500" in c.error and c.text == ""
    assert len(Handler.calls) == 2  # one try + one bounded retry


def test_unreachable_endpoint():
    policy = OpenAIPolicy(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, timeout_s=2)
    req = PolicyRequest(messages=[{"role": "user", "content": "hi"}], episode_id="e", turn=0, admissible_commands=[])
    (c,) = policy.act([req])
    assert c.error and c.finish_reason == "error"
