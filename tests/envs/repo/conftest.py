"""Fixtures for the repository environment: real bwrap sandboxes, real pack tasks, a
loopback chat-completions server that answers with scripted tool calls."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evoharness.envs.repo.sandbox import Limits, Sandbox
from evoharness.envs.repo.task import load_tasks
from evoharness.envs.repo.tools import ToolBox


@pytest.fixture(scope="session")
def pack():
    return {t.task_id: t for t in load_tasks("pack")}


@pytest.fixture()
def sandbox(tmp_path):
    sb = Sandbox(
        tmp_path / "ws",
        limits=Limits(wall_s=20, cpu_s=20, memory_mb=1024, processes=32),
        hidden=[str(tmp_path / "secret")],
    )
    yield sb
    sb.close()


@pytest.fixture()
def toolbox(sandbox):
    return ToolBox(sandbox, output_chars=2000)


@pytest.fixture()
def tool_server():
    """A real OpenAI-compatible server on 127.0.0.1. Call it with ``reply(body, headers)``
    returning an assistant message dict (``content``/``tool_calls``), or an
    ``(status, message)`` tuple for an HTTP error. Returns ``(base_url, calls)`` where
    ``calls`` collects ``(headers, body)``. Answers carry vLLM's ``prompt_token_ids`` /
    ``token_ids`` / log-probs, so it also serves as a backend of the project's gateway."""
    servers = []

    def start(reply):
        calls = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # /v1/models, as a vLLM server answers it
                data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                calls.append((headers, body))
                out = reply(body, headers)
                if isinstance(out, tuple):
                    data = json.dumps({"error": {"message": out[1], "type": "invalid_request_error"}}).encode()
                    self.send_response(out[0])
                else:
                    msg = {"role": "assistant", "content": out.get("content")}
                    if out.get("tool_calls"):
                        msg["tool_calls"] = [
                            {
                                "id": f"call_{len(calls)}_{i}",
                                "type": "function",
                                "function": {"name": n, "arguments": a},
                            }
                            for i, (n, a) in enumerate(out["tool_calls"])
                        ]
                    n_prompt = sum(len(json.dumps(m)) for m in body["messages"]) // 4
                    data = json.dumps(
                        {  # vLLM's token-in/token-out fields too, so the gateway can record
                            "id": "x",
                            "object": "chat.completion",
                            "created": 0,
                            "model": body["model"],
                            "prompt_token_ids": [1] * n_prompt,
                            "choices": [
                                {
                                    "index": 0,
                                    "message": msg,
                                    "token_ids": [7] * 20,
                                    "logprobs": {
                                        "content": [{"token": "a", "logprob": -0.5, "bytes": [], "top_logprobs": []}]
                                        * 20
                                    },
                                    "finish_reason": "tool_calls" if out.get("tool_calls") else "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": n_prompt,
                                "completion_tokens": 20,
                                "total_tokens": n_prompt + 20,
                            },
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
