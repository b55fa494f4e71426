"""Rollout cells behind the gateway (``runtime.via_gateway``): the ALFWorld RL workload on cell
processes with every model call routed by the gateway to the execution's cell. Role switches
drain cells, a killed rollout cell's calls are re-issued; no turn is aborted and the run plays
and trains exactly the in-process loop's episodes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from rl_cells import assert_same_steps, metrics, rl_config

from evoharness.recipes.rl import train_rl


def test_elastic_through_the_gateway_drains_switching_cells(model_dir, tmp_path, rl_reference):
    """elastic on 3 cells: cells leave rollout mid-step and are drained through the gateway
    (their calls re-issued where the executions go); 0 aborted turns, same steps (~20 s)."""
    out = tmp_path / "elastic"
    train_rl(rl_config(model_dir, out, schedule="elastic", cells=3, via_gateway=True), progress=False)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/switches"] > 0 and rt["runtime/drains"] > 0
    assert rt["runtime/aborted_turns"] == 0 and rt["runtime/micro_batches"] == 8
    assert_same_steps(metrics(out), rl_reference.metrics)


def test_a_killed_rollout_cell_behind_the_gateway_loses_no_turn(model_dir, tmp_path, rl_reference):
    """SIGKILL of a rollout cell mid-step (elastic-async, the scheduler that replaces a lost
    cell): the gateway re-issues its calls where the executions are bound next; the step
    completes and the run equals the in-process loop (~20 s)."""
    from evoharness.recipes.rl import RLJob

    job = RLJob(
        rl_config(
            model_dir,
            tmp_path,
            schedule="elastic-async",
            cells=2,
            staleness=0,
            capacity=4,
            backend="local",
            via_gateway=True,
        )
    )
    be = job.backend
    killed = []

    def killer() -> None:  # a satellite (not the core) while gateway calls run on it, after 5 calls
        while True:
            try:
                cells = {be._jobs[t][1] for t in list(be._gw_jobs)} - {0}
            except (KeyError, RuntimeError):  # the driver thread moved on meanwhile
                cells = set()
            if cells and be.counts["calls"] >= 5:
                break
            time.sleep(0.002)
        os.kill(be.transport.pid(min(cells)), signal.SIGKILL)
        killed.append(min(cells))

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        stats = job.driver.run()
    finally:
        job.backend.close()
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0 == be.counts["aborted_turns"]
    assert_same_steps(be.records, rl_reference.metrics)


def test_http_calls_follow_the_execution_binding(gw_model_dir, serve):
    """Over HTTP: a bound execution's calls (X-Execution-Id) go to its backend only; a held
    one waits in the gateway until it is bound, then runs there; others are load-balanced."""
    import httpx

    from evoharness.runtime.backends import LocalBackend
    from evoharness.runtime.gateway import Gateway

    a, b = (LocalBackend.from_model_path(gw_model_dir, name=n) for n in ("a", "b"))
    srv = serve(Gateway([a, b], served_model="micro"))
    body = {
        "model": "micro",
        "messages": [{"role": "user", "content": "You see a fridge 1."}],
        "max_tokens": 4,
        "temperature": 0.0,
    }

    def post(eid):
        return httpx.post(f"{srv.url}/chat/completions", headers={"X-Execution-Id": eid}, json=body, timeout=60)

    srv.gateway.bind("x1", "b")
    for _ in range(3):
        assert post("x1").status_code == 200
    assert [r.attempts[-1].backend for r in srv.gateway.records.read("x1")] == ["b"] * 3
    srv.gateway.bind("x1", None)  # held (its cell drained, no new cell yet)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=post("x1")))
    t.start()
    time.sleep(0.5)
    assert "r" not in box and len(srv.gateway.records.read("x1")) == 3  # still waiting
    admin = srv.url.removesuffix("/v1")
    assert httpx.post(f"{admin}/admin/routes", json={"execution": "x1", "backend": "zz"}).status_code == 404
    assert httpx.post(f"{admin}/admin/routes", json={"execution": "x1", "backend": "a"}).status_code == 200
    t.join(30)
    assert box["r"].status_code == 200 and srv.gateway.records.read("x1")[-1].attempts[-1].backend == "a"
    srv.gateway.bind("x1", "b")
    assert post("x1").status_code == 200 and b.served == 4 and a.served == 1
    assert (
        httpx.delete(f"{admin}/admin/routes/x1").status_code == 200
    )  # unbound: the least-loaded backend (fewest served) again
    assert post("x1").status_code == 200 and srv.gateway.records.read("x1")[-1].attempts[-1].backend == "a"
