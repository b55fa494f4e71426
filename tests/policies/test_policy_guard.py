"""An evaluation cannot silently lie: a dead or wrong endpoint fails before the first episode, a
policy that keeps failing stops the run, and episodes that never reached the model are not counted."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evoharness.config.eval import EvalConfig
from evoharness.eval.evaluate import evaluate
from evoharness.eval.report import summarize
from evoharness.harness.react import ReActHarness
from evoharness.policies.base import Completion
from evoharness.policies.guard import ErrorGuard, PolicyFailure, probe_policy
from evoharness.policies.openai_policy import OpenAIPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def failing_server():
    """A real HTTP server that lists model "tiny" and answers every chat completion with HTTP 503."""
    chats = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "me"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            chats.append(time.monotonic())
            self._send(503, {"error": {"message": "overloaded"}})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", chats
    srv.shutdown()


def test_probe_names_a_dead_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(PolicyFailure, match=f"no OpenAI-compatible endpoint answers at {url}"):
        probe_policy(OpenAIPolicy(base_url=url, model="m"), timeout_s=5)


def test_probe_checks_the_served_model(failing_server):
    url, _ = failing_server
    probe_policy(OpenAIPolicy(base_url=url, model="tiny"))
    with pytest.raises(PolicyFailure, match="does not serve model 'tiyn'.*'tiny'"):
        probe_policy(OpenAIPolicy(base_url=url, model="tiyn"))


def test_dead_server_stops_the_evaluation_before_any_episode(tmp_path):
    cfg = EvalConfig.model_validate(
        {
            "limit": 2,
            "out_dir": str(tmp_path / "ev"),
            "policy": {"kind": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "m"},
        }
    )
    with pytest.raises(PolicyFailure, match="no OpenAI-compatible endpoint"):
        evaluate(cfg, progress=False)
    assert not (tmp_path / "ev" / "episodes.jsonl").exists()


def test_consecutive_errors_stop_the_run(failing_server, tmp_path):
    url, chats = failing_server
    cfg = EvalConfig.model_validate(
        {
            "limit": 2,
            "batch_size": 2,
            "harness": {"kind": "react"},
            "out_dir": str(tmp_path / "ev"),
            "policy": {
                "kind": "openai",
                "base_url": url,
                "model": "tiny",
                "max_retries": 0,
                "max_consecutive_errors": 6,
            },
        }
    )
    with pytest.raises(PolicyFailure, match=r"6 policy calls in a row failed .*503.*0 finished episodes kept"):
        evaluate(cfg, progress=False)
    assert len(chats) == 6  # 3 lock-step turns of 2 episodes: the run stopped at the limit, not at the step cap


def test_episodes_that_never_reached_the_model_are_not_failures(one_per_type):
    class Down:
        name = "down"

        def act(self, requests):
            return [Completion(text="", finish_reason="error", error="APIConnectionError") for _ in requests]

        def close(self):
            pass

    class Expertish:
        """Answers with the first admissible command (a model that was reached)."""

        name = "first"

        def act(self, requests):
            return [Completion(text=f"<action>{r.admissible_commands[0]}</action>") for r in requests]

    guard = ErrorGuard(Down(), limit=0)  # 0: never stops; the report must still not count these episodes
    spec = [EpisodeSpec(one_per_type[0], "down#0")]
    down = run_episodes(spec, make_env, ReActHarness, guard, max_steps=3)
    up = run_episodes([EpisodeSpec(one_per_type[1], "up#0")], make_env, ReActHarness, Expertish(), max_steps=3)
    assert guard.errors == 3
    s = summarize(down + up)
    assert s["overall"]["n"] == 1 and s["overall"]["unreached"] == 1
    assert s["overall"]["policy_errors"] == 0  # of the counted episodes
    assert s["unreached_episodes"] == ["down#0"] and s["failed_episodes"] == ["up#0"]


def make_env(task):
    from evoharness.envs.alfworld import make_env as mk

    return mk(task, engine="fast")
