"""Issue 49, the gateway as a hostile local client would use it: each attack runs for real
against a served gateway on loopback (raw sockets for slowloris, real HTTP for the rest)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from evoharness.runtime.backends import Backend, GenOutput
from evoharness.runtime.gateway import Gateway
from evoharness.runtime.record_store import RecordStore, execution_file_name

MODEL = "micro"


class EchoBackend(Backend):
    """Answers at once with a fixed completion (and a tool call whose id the client chose)."""

    def __init__(self):
        super().__init__("echo")

    async def _generate(self, params):
        return GenOutput(
            prompt_ids=[1, 2],
            completion_ids=[3],
            logprobs=[-0.1],
            content="ok",
            tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            finish_reason="stop",
            policy_version=0,
        )


def body(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


def test_slowloris_connections_are_closed_and_health_keeps_answering(serve):
    """300 connections that send nothing or half a request head: each is closed by the head
    deadline (or at once past the connection cap), and /health answers throughout."""
    srv = serve(Gateway([EchoBackend()], served_model=MODEL, header_timeout_s=1.0, max_connections=200))
    host, port = "127.0.0.1", srv.port
    socks = []
    for i in range(300):
        s = socket.create_connection((host, port))
        if i % 2:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")  # never finished
        socks.append(s)
    assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200
    time.sleep(2.5)
    closed = 0
    for s in socks:
        s.settimeout(2)
        try:
            closed += s.recv(1) == b""
        except (ConnectionResetError, TimeoutError, OSError):
            closed += 1
        s.close()
    assert closed == 300
    assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200


def test_a_trickled_body_times_out_with_408(serve):
    srv = serve(Gateway([EchoBackend()], served_model=MODEL, body_timeout_s=1.0))
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"model"'
    )
    s.settimeout(10)
    t0 = time.monotonic()
    head = s.recv(4096)
    s.close()
    assert head.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5, head[:200]


@pytest.mark.parametrize(
    "raw, what",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100,000 deep"),
        (b'{"model": "micro", "messages": [' * 40 + b"]}" * 40, "nested past the depth limit"),
        (b'{"model": "micro", "user": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "lone surrogate"),
        (b'{"model": "micro", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "encoded surrogate"),
        (b'{"model": "micro", "messages": [{"role": "user", "content": "\xff"}]}', "invalid UTF-8"),
    ],
)
def test_parser_failures_are_4xx(serve, raw, what):
    srv = serve(Gateway([EchoBackend()], served_model=MODEL))
    r = httpx.post(f"{srv.url}/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:300])
    assert httpx.get(f"{srv.url.removesuffix('/v1')}/health").status_code == 200


def test_unhashable_tool_call_ids_and_bad_execution_ids_are_4xx_or_ignored(serve):
    srv = serve(Gateway([EchoBackend()], served_model=MODEL))
    url = f"{srv.url}/chat/completions"
    assert httpx.post(url, json=body(user="x")).status_code == 200  # the execution's tool-call cache is filled
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": ["a", "list"], "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    r = httpx.post(url, json=body(user="x", messages=msgs))
    assert r.status_code < 500, r.text[:300]
    r = httpx.post(f"{srv.url.removesuffix('/v1')}/x/{'e' * 5000}/v1/chat/completions", json=body())
    assert r.status_code == 400, r.text[:300]


def test_an_execution_id_equal_to_anothers_file_name_cannot_append_to_its_records(tmp_path, serve):
    long_id = "L" * 200
    short_name = execution_file_name(long_id).removesuffix(".jsonl")
    assert "~" in short_name
    srv = serve(Gateway([EchoBackend()], served_model=MODEL, records=tmp_path / "rec"))
    url = f"{srv.url}/chat/completions"
    assert httpx.post(url, json=body(user=long_id)).status_code == 200
    assert httpx.post(url, json=body(user=short_name)).status_code == 200  # the attacker's id
    assert execution_file_name(short_name) != execution_file_name(long_id)
    root = srv.url.removesuffix("/v1")
    for eid in (long_id, short_name):
        recs = httpx.get(f"{root}/v1/executions/{eid}/records").json()["data"]
        assert [r["execution_id"] for r in recs] == [eid]
    assert srv.gateway.records.executions() == {long_id: 1, short_name: 1}
    # a file shared anyway (written by hand here, as a hash collision would) reads per execution
    store = RecordStore(tmp_path / "rec")
    with open(tmp_path / "rec" / execution_file_name(long_id), "a") as f:
        f.write(open(tmp_path / "rec" / execution_file_name(short_name)).read())
    assert [r.execution_id for r in store.read(long_id)] == [long_id]


def test_admin_endpoints_need_the_token_json_and_no_browser(serve):
    srv = serve(Gateway([EchoBackend()], served_model=MODEL, admin_token="s3cret"))
    root = srv.url.removesuffix("/v1")
    ok = {"Authorization": "Bearer s3cret"}
    route = {"execution": "x", "backend": "echo"}
    assert httpx.get(f"{root}/admin/backends").status_code == 401
    assert httpx.get(f"{root}/admin/backends", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{root}/admin/routes", json=route).status_code == 401
    # a page's simple (preflight-free) POST: text/plain body, the browser's Origin header
    assert (
        httpx.post(
            f"{root}/admin/routes",
            content=b'{"execution": "x", "backend": "echo"}',
            headers={**ok, "Content-Type": "text/plain"},
        ).status_code
        == 415
    )
    assert httpx.post(f"{root}/admin/backends/echo/resume", headers=ok).status_code == 415
    assert (
        httpx.post(f"{root}/admin/routes", json=route, headers={**ok, "Origin": "http://evil.example"}).status_code
        == 403
    )
    assert (
        httpx.post(f"{root}/admin/routes", json=route, headers={**ok, "Sec-Fetch-Site": "cross-site"}).status_code
        == 403
    )
    assert "x" not in srv.gateway.routes  # none of the above changed anything
    assert httpx.post(f"{root}/admin/routes", json=route, headers=ok).status_code == 200
    assert srv.gateway.routes["x"] == "echo"


def test_serve_refuses_unauthenticated_admin_off_loopback():
    from evoharness.runtime.gateway import serve

    with pytest.raises(ValueError, match="admin_token"):
        serve(Gateway([EchoBackend()], served_model=MODEL), host="0.0.0.0", port=0)
