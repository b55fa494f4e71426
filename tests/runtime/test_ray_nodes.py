"""Cells on two Ray nodes that share nothing but the network, and GPU cells.

A real two-node Ray cluster on this machine (``ray start --head`` plus a second ``ray start
--address`` raylet, each with its own temporary directory, object store and 1 CPU): the RL job
runs with cells on both nodes, its published weights and satellite gradients travel through Ray's
object store (`runtime.ray_exchange.RayExchange`) and its trainer group meets over TCP, so
nothing a cell needs is written under the run's directory; the runs equal the in-process run
(`rl_reference`). The two raylets share this machine's filesystem, so what a cell on the second
node reads of the driver's checkpoint is checked directly (`test_the_object_store_outlives_...`).
GPU cells: the CUDA_VISIBLE_DEVICES slices of local cell processes, and the clear errors when the
machine or the cluster lacks the GPUs asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from rl_cells import RAY_STALL_S, assert_same_steps, assert_same_update, metrics, rl_config

from evoharness.recipes.rl import RLJob, train_rl
from evoharness.runtime.cell import WeightStore, load_sync_tensors, sync_tensors
from evoharness.runtime.exchange import FileExchange
from evoharness.runtime.transport import ProcessTransport, gpu_slices

# The driver must use the cluster's auth mode (disabled, as `ray start` runs here), and Ray reads
# RAY_AUTH_MODE when it is imported: an earlier ray.init in the same process sets it to "token" and
# the cells then die at start. So this module runs in a pytest process of its own, started with the
# mode set (test_ray_nodes_process.py).
OWN_PROCESS = "EVOHARNESS_RAY_NODES_OWN_PROCESS"
pytestmark = pytest.mark.skipif(
    os.environ.get(OWN_PROCESS) != "1", reason="runs in its own process: tests/runtime/test_ray_nodes_process.py"
)

NODE_CPUS = 1  # each node's CPUs: 3 cells of 0.4 CPU cannot share one node
CELL_CPUS = 0.4
UP_S = 120.0  # how long the cluster may take to start on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], log: Path) -> subprocess.Popen:
    """``ray start --block`` in a session of its own: it stops its node's processes on SIGTERM, and
    its process group is ours to kill if it does not."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--num-cpus={NODE_CPUS}", *args]
    cmd.append(f"--object-store-memory={256 * 2**20}")
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the group `_ray_start` made: this test's raylet only
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """``(address, driver node id, other node id)`` of a two-node cluster this test process is
    connected to (the driver's node is the raylet Ray attached it to)."""
    ray = pytest.importorskip("ray")
    d = tmp_path_factory.mktemp("ray_nodes")
    short = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # a raylet's socket paths must fit in 107 bytes
    port = _free_port()
    address = f"127.0.0.1:{port}"
    procs = [
        _ray_start(
            [
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--include-dashboard=false",
                # Ray's fixed default (52365) can equal a port Ray itself drew for another component of the
                # node, and the head then refuses to start: a free port of our own instead
                f"--dashboard-agent-listen-port={_free_port()}",
                '--resources={"head": 1}',
                f"--temp-dir={short / 'h'}",
            ],
            d / "head.log",
        )
    ]
    try:
        deadline = time.monotonic() + UP_S
        while True:  # the head's GCS accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray head did not start: {(d / 'head.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        procs.append(
            _ray_start(
                [
                    f"--address={address}",
                    "--node-ip-address=127.0.0.1",
                    f"--dashboard-agent-listen-port={_free_port()}",
                    '--resources={"node2": 1}',
                    f"--temp-dir={short / 'w'}",
                ],
                d / "node2.log",
            )
        )
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if procs[1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"second raylet did not join: {(d / 'node2.log').read_text()[-2000:]}")
            time.sleep(0.5)
        here = ray.get_runtime_context().get_node_id()
        (other,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
        yield address, here, other
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop(procs)
        shutil.rmtree(short, ignore_errors=True)


def _run_files(out: Path) -> list[Path]:
    """Weights or gradient files anywhere under a run's directory."""
    return [p for p in out.rglob("*") if p.suffix in (".safetensors", ".pt") and "checkpoints" not in p.parts]


class _Satellite:
    """An actor pinned to a node: leaves tensors in the exchange, reads a driver directory."""

    def __init__(self, exchange):
        self.exchange = exchange

    def put(self, key: str, tensors: dict) -> str:
        self.exchange.put(key, tensors)
        return os.uname().nodename

    def read_dir(self, path: str) -> tuple[str, dict[str, bytes]]:
        local = self.exchange.local_dir(path)
        files = {str(p.relative_to(local)): p.read_bytes() for p in Path(local).rglob("*") if p.is_file()}
        return local, files

    def close(self, local: str) -> bool:
        """Whether the copy at `local` is gone once the exchange closes."""
        self.exchange.close()
        return not Path(local).exists()


def test_the_object_store_outlives_a_satellite_and_serves_the_driver_directory(two_nodes, model_dir, tmp_path):
    """A gradient put by an actor on the other node is read after that actor is killed (the keeper
    on the driver's node owns it); a checkpoint directory of the driver's node reaches that actor
    as a copy in a directory of its own, removed when it closes; bfloat16 survives the trip."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from evoharness.runtime.ray_exchange import RayExchange

    _, here, other = two_nodes
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the raylets' workers cannot import tests
    ex = RayExchange()
    try:
        sat = (
            ray.remote(_Satellite)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))
            .remote(ex)
        )
        grads = {"w": torch.randn(3, 5), "b16": torch.randn(7).to(torch.bfloat16), "scalar": torch.tensor(2.5)}
        ray.get(sat.put.remote("grads/v0/mb1", grads))
        local, files = ray.get(sat.read_dir.remote(str(model_dir)))
        assert ray.get(sat.close.remote(local))
        ray.kill(sat, no_restart=True)
        got = ex.get("grads/v0/mb1")
        assert set(got) == set(grads)
        for k, t in grads.items():
            assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
        got["w"].add_(1.0)  # the caller owns what it got: writable, and not the stored copy
        assert torch.equal(ex.get("grads/v0/mb1")["w"], grads["w"])
        assert local != str(model_dir)  # a copy on the other node, not the driver's path
        assert files == {str(p.relative_to(model_dir)): p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
        assert ex.local_dir(str(model_dir)) == str(model_dir)  # on the driver's node: the path itself
        ex.drop(["grads/v0/mb1"])
        with pytest.raises(KeyError, match="grads/v0/mb1"):
            ex.get("grads/v0/mb1")
    finally:
        ex.shutdown()


def test_elastic_cells_on_two_nodes_train_the_inprocess_weights_without_files(
    two_nodes, model_dir, tmp_path, rl_reference
):
    """elastic on 3 cells over both nodes (the core beside the driver): satellites send their
    micro-batches' gradients and load the new weights through the object store, nothing is written
    under the run's directory but the trace and the final model, and the steps equal the in-process run
    (~15 s: three actors import torch)."""
    address, here, other = two_nodes
    out = tmp_path / "elastic"
    cfg = rl_config(
        model_dir,
        out,
        schedule="elastic",
        cells=3,
        backend="ray",
        ray_address=address,
        ray_num_cpus=CELL_CPUS,
        stall_s=RAY_STALL_S,
    )
    job = RLJob(cfg)
    try:
        records = list(job.steps())
        final = job.export(out / "final")
        nodes, be = dict(job.backend.transport.nodes), job.backend
    finally:
        job.close()
    assert nodes[0] == here and set(nodes.values()) == {here, other}  # the core beside the driver, a cell on each node
    assert be.training.gradients_sent > 0  # satellites trained micro-batches for the core
    assert be.counts["micro_batches"] == 8 and be.counts["cells_lost"] == 0
    assert _run_files(out / "runtime") == []
    assert_same_steps(records, rl_reference.metrics)
    assert_same_update(final, rl_reference.weights, model_dir)


def test_an_allreduce_group_over_two_nodes_resumes_to_the_inprocess_weights(
    two_nodes, model_dir, tmp_path, rl_reference
):
    """colocate on 3 cells over both nodes: the replicas' gloo group meets at a tcp:// address on
    the core's node; killed after step 1 (a finished run given one more step), the job resumes
    with every cell, the other node's included, starting from the checkpoint's weights and AdamW
    state (the core's directory, copied to the other node), and equals the in-process run (~30 s:
    two runs of three actors)."""
    address, _, _ = two_nodes
    out = tmp_path / "colocate"
    cfg = rl_config(
        model_dir,
        out,
        steps=1,
        schedule="colocate",
        cells=3,
        backend="ray",
        ray_address=address,
        ray_num_cpus=CELL_CPUS,
        stall_s=RAY_STALL_S,
    )
    cfg.ckpt_every = 1
    train_rl(cfg, progress=False)
    cfg.steps = 2
    final = train_rl(cfg, progress=False)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["cells"] == 3 and rt["runtime/aborted_turns"] == 0 and rt["runtime/cells_lost"] == 0
    assert _run_files(out / "runtime") == []
    assert_same_steps(metrics(out), rl_reference.metrics)
    assert_same_update(final, rl_reference.weights, model_dir)


def test_a_cluster_without_the_gpus_asked_for_fails_with_the_resources_named(two_nodes):
    """Cells of 1 GPU on a cluster of CPUs: the placement group times out with a clear error."""
    from evoharness.runtime.ray_transport import RayTransport

    address, _, _ = two_nodes
    t = RayTransport(address=address, num_cpus=CELL_CPUS, gpus_per_cell=1, place_timeout_s=3)
    try:
        with pytest.raises(RuntimeError, match=r"cannot place 2 cells of \{'CPU': 0.4, 'GPU': 1.0\}"):
            t.start(2, _EnvCell)
    finally:
        t.close()
    assert t.actors == []  # nothing started


# ---- GPU cells on one machine ---------------------------------------------------------------------


class _EnvCell:
    """A worker whose only job reports the ``CUDA_VISIBLE_DEVICES`` its process started with."""

    def __init__(self, cell: int):
        self.jobs: list[tuple] = []

    def submit(self, kind: str, token: int, payload, seconds: float = 0.0) -> None:
        self.jobs.append((kind, token, os.environ.get("CUDA_VISIBLE_DEVICES")))

    def cancel(self, token: int) -> None:
        pass

    def next_due(self):
        return 0.0 if self.jobs else None

    def ready(self) -> list[tuple]:
        out, self.jobs = self.jobs, []
        return out


def test_local_cell_processes_see_their_own_gpu_slice(monkeypatch):
    """3 cell processes x 2 GPUs of a (pretended) 8-GPU machine whose visible GPUs are 1,3,..,15:
    cell c starts with GPUs 2c and 2c+1 of that list (torch.cuda.device_count is the only pretence;
    the processes and their environments are real), and the driver's environment is unchanged."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(1, 16, 2)))
    t = ProcessTransport(gpus_per_cell=2)
    t.start(3, _EnvCell)
    try:
        for c in range(3):
            t.post(c, ("env", c + 1, None, 0.0))
        seen, deadline = {}, time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline:
            reply = t.next_reply(1.0)
            if reply is not None and reply[2] == "env":
                seen[reply[0]] = reply[4]
    finally:
        t.close()
    assert seen == {0: "1,3", 1: "5,7", 2: "9,11"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,3,5,7,9,11,13,15"


def test_more_gpus_than_the_machine_has_is_refused():
    have = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"need {2 * (have + 1)} GPUs; this machine has {have} visible"):
        gpu_slices(2, have + 1)
    with pytest.raises(ValueError, match="need"):
        ProcessTransport(gpus_per_cell=have + 1).start(2, _EnvCell)


# ---- the file exchange and the weights a sync moves ---------------------------------------------


def test_published_weights_round_trip_a_real_model_through_files(model_dir, tmp_path):
    """The micro model (tied embeddings) published and loaded into a fresh copy: the same logits;
    the store keeps the newest two versions; a gradient key's directories go with it."""
    from evoharness.models.init import load_model

    a, b = (load_model(str(model_dir), "cpu", torch.float32) for _ in range(2))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.01 * torch.randn_like(p))
    store = WeightStore(tmp_path / "w")
    for v in (1, 2, 3):
        store.publish(a, v)
    assert sorted(p.name for p in (tmp_path / "w").glob("v*.safetensors")) == ["v2.safetensors", "v3.safetensors"]
    store.load(b, 3)
    ids = torch.tensor([[5, 17, 42, 7]])
    torch.testing.assert_close(b(ids).logits, a(ids).logits, rtol=0, atol=0)
    tied = a.get_output_embeddings().weight.data_ptr() == a.get_input_embeddings().weight.data_ptr()
    assert len(sync_tensors(a)) == len(a.state_dict()) - int(tied)  # an alias travels once
    with pytest.raises(KeyError, match="unexpected \\['extra'\\]"):
        load_sync_tensors(b, {**sync_tensors(a), "extra": torch.zeros(1)}, "test")
    ex = FileExchange(tmp_path / "x")
    ex.put("grads/v4/mb1", {"g": torch.ones(2)})
    assert ex.keys() == ["grads/v4/mb1"]
    ex.drop(ex.keys())
    assert ex.keys() == [] and not (tmp_path / "x" / "grads").exists() and (tmp_path / "x").is_dir()
    with pytest.raises(KeyError, match="grads/v4/mb1"):
        ex.get("grads/v4/mb1")
