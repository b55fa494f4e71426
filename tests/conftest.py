"""Shared fixtures: real ALFWorld games from the bundled pack, the micro model, the in-process RL run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

# Tests must not depend on or write to the user's cache.
os.environ.setdefault("EVOHARNESS_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "test"))

from evoharness.envs.alfworld.games import TASK_TYPES, discover_games  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A micro model whose tokenizer is trained on real BPE-harness prompts (tests/micro_model.py)."""
    from micro_model import build_micro_model_dir

    return build_micro_model_dir(tmp_path_factory.mktemp("micro"))


@dataclass(frozen=True)
class RLReference:
    """The in-process RL loop's run: its out dir, per-step records and final weights."""

    out: Path
    metrics: list[dict]
    weights: dict


@pytest.fixture(scope="session")
def rl_reference(model_dir, tmp_path_factory) -> RLReference:
    """`evoharness rl` in process on `rl_cells.rl_config` (~17 s, once a session): what every
    runtime schedule and backend must reproduce (tests/train/test_rl_runtime.py, tests/runtime/)."""
    from rl_cells import metrics, rl_config
    from safetensors.torch import load_file

    from evoharness.recipes.rl import train_rl

    out = tmp_path_factory.mktemp("rl_inprocess")
    final = train_rl(rl_config(model_dir, out), progress=False)
    return RLReference(out, metrics(out), load_file(str(final / "model.safetensors")))


@pytest.fixture(scope="session")
def valid_seen():
    return discover_games("valid_seen")


@pytest.fixture(scope="session")
def one_per_type(valid_seen):
    """The first valid_seen game of each task type (sorted by task id)."""
    return [next(t for t in valid_seen if t.task_type == tt) for tt in TASK_TYPES]


@pytest.fixture(scope="session")
def teacher_examples(valid_seen, tmp_path_factory):
    """SFT rows (`rollout.collect.traces_to_sft`) of the scripted teacher on the BPE harness, on the
    first three valid_seen games of each task type."""
    from engines import pick_engine

    from evoharness.envs.alfworld import make_env
    from evoharness.policies.teacher import TeacherPolicy
    from evoharness.rollout.collect import bpe_harness_factory, collect_traces, traces_to_sft

    tasks = [t for tt in TASK_TYPES for t in [t for t in valid_seen if t.task_type == tt][:3]]
    engine = pick_engine(tasks[0])
    out = tmp_path_factory.mktemp("teacher_examples") / "traces.jsonl"
    collect_traces(
        tasks,
        TeacherPolicy(),
        bpe_harness_factory(),
        lambda t: make_env(t, engine=engine),
        out,
        batch_size=6,
        progress=False,
    )
    return traces_to_sft(out)


@pytest.fixture()
def chat_server():
    """Start a real OpenAI-compatible chat-completions server on loopback.

    Call it with ``reply(body) -> str | int``: the assistant content to send,
    or an HTTP error status. Returns ``(base_url, calls)``, where ``calls``
    collects ``(path, Authorization header, request body)`` per request.
    """
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    servers = []

    def start(reply):
        calls = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append((self.path, self.headers.get("Authorization"), body))
                out = reply(body)
                if isinstance(out, int):
                    self.send_response(out)
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "boom"}}')
                    return
                data = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": out}}
                        ],
                        "usage": {"prompt_tokens": 123, "completion_tokens": 9, "total_tokens": 132},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1", calls

    yield start
    for srv in servers:
        srv.shutdown()
