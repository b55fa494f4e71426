"""`evoharness serve --workers 2` as real processes: a worker SIGKILLed mid-request costs the client nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow  # ~20 s: three processes import torch and load the model
def test_serve_workers_sigkill_mid_request(gw_model_dir, tmp_path):
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "evoharness.cli",
        "serve",
        "--model-path",
        str(gw_model_dir),
        "--workers",
        "2",
        "--port",
        str(port),
        "--records",
        str(tmp_path / "rec"),
        "--served-model-name",
        "micro",
        "--threads",
        "1",
    ]
    admin = {"Authorization": "Bearer t0ken"}  # `serve` protects its admin endpoints
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "OMP_NUM_THREADS": "1", "EVOHARNESS_ADMIN_TOKEN": "t0ken"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    frozen = None
    try:

        def healthy():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                return httpx.get(f"{root}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 240, "the gateway and its workers")
        backends = httpx.get(f"{root}/admin/backends", headers=admin).json()["data"]
        assert [b["name"] for b in backends] == ["worker0", "worker1"] and all(b["alive"] for b in backends)
        victim = backends[0]["pid"]
        os.kill(victim, signal.SIGSTOP)  # frozen: the call will sit on it, unanswered
        frozen = victim
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="x", max_retries=0, timeout=120)
        box = {}

        def call():
            box["resp"] = client.chat.completions.create(
                model="micro",
                messages=[{"role": "user", "content": "You see a fridge 1. Go."}],
                max_tokens=8,
                temperature=0.0,
                logprobs=True,
                extra_body={"return_token_ids": True},
                extra_headers={"X-Execution-Id": "killed-run"},
            )

        t = threading.Thread(target=call)
        t.start()
        # equal load: least-loaded routing sends the first call to worker0, the frozen one
        wait_until(
            lambda: httpx.get(f"{root}/admin/backends", headers=admin).json()["data"][0]["in_flight"] == 1,
            30,
            "the call to reach worker0",
        )
        os.kill(victim, signal.SIGKILL)
        frozen = None
        t.join(60)
        resp = box["resp"]
        assert resp.choices[0].finish_reason in ("stop", "length")
        (rec,) = httpx.get(f"{root}/v1/executions/killed-run/records").json()["data"]
        assert [a["backend"] for a in rec["attempts"]] == ["worker0", "worker1"]
        assert rec["attempts"][0]["error"] and rec["attempts"][1]["error"] is None
        assert rec["completion_token_ids"] == resp.choices[0].model_extra["token_ids"]
        assert len(rec["logprobs"]) == len(rec["completion_token_ids"]) > 0
        assert rec["prompt_token_ids"] == resp.model_extra["prompt_token_ids"]
        assert (tmp_path / "rec" / "killed-run.jsonl").is_file()
        # the dead worker is no longer routed to; later calls are answered by worker1
        for k in range(3):
            r = httpx.post(
                f"{root}/v1/chat/completions",
                timeout=60,
                json={"model": "micro", "messages": [{"role": "user", "content": f"again {k}"}], "max_tokens": 4},
                headers={"X-Execution-Id": "after"},
            )
            assert r.status_code == 200
        after = httpx.get(f"{root}/v1/executions/after/records").json()["data"]
        assert all(a["backend"] == "worker1" for r in after for a in r["attempts"])
        states = {
            b["name"]: (b["state"], b["alive"])
            for b in httpx.get(f"{root}/admin/backends", headers=admin).json()["data"]
        }
        assert states["worker0"][1] is False and states["worker1"] == ("active", True)
    finally:
        if frozen:
            os.kill(frozen, signal.SIGKILL)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    # the gateway stopped its remaining worker on shutdown
    assert proc.returncode is not None


def test_in_process_serve_adds_and_removes_worker_processes(gw_model_dir, tmp_path):
    """``evoharness serve --model-path DIR`` (engine in-process) can still grow worker processes at
    ``POST /admin/backends {"worker": true}`` (it answered 'started without --model-path'), and
    ``DELETE`` stops the process."""
    from evoharness.runtime.gateway import GatewayServer, build_gateway

    gw = build_gateway(str(gw_model_dir), records=tmp_path, served_model="micro", num_threads=1)
    admin = {"Authorization": f"Bearer {gw.admin_token}"}
    with GatewayServer(gw) as srv:
        root = srv.url.removesuffix("/v1")
        assert httpx.get(f"{root}/admin/backends").status_code == 401
        r = httpx.post(f"{root}/admin/backends", json={"worker": True, "name": "w"}, timeout=240, headers=admin)
        assert r.status_code == 200 and r.json()["alive"], r.text
        worker = gw.backends["w"]
        httpx.post(
            f"{root}/admin/backends/local/drain", json={"cancel_inflight": False}, headers=admin
        ).raise_for_status()
        r = httpx.post(
            f"{srv.url}/chat/completions",
            json={"model": "micro", "max_tokens": 4, "user": "e", "messages": [{"role": "user", "content": "go"}]},
            timeout=60,
        )
        assert r.status_code == 200 and [a.backend for a in gw.records.read("e")[0].attempts] == ["w"]
        assert httpx.delete(f"{root}/admin/backends/w", timeout=60, headers=admin).json() == {"removed": "w"}
        assert worker.proc.poll() is not None and "w" not in gw.backends
