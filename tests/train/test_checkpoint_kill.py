"""Issue 10 fault 7: kill a real `evoharness rl` process at each point of a step's commit,
rerun the same command, and get exactly the uninterrupted run: metrics.jsonl without gaps,
duplicates or torn lines, and the same final weights. An unreadable latest checkpoint falls
back to the previous one with a clear message; checkpoints load without arbitrary unpickling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evoharness.files import FAILPOINT_ENV, read_jsonl
from evoharness.train.checkpoint import checkpoint_candidates, load_trainer_state

pytestmark = pytest.mark.slow  # a dozen real RL processes: ~1-2 min on 2 cores

SETTINGS = [
    "steps=3",
    "max_steps=3",
    "max_new_tokens=12",
    "max_prompt_tokens=512",
    "decode_threads=1",
    "threads=1",
    "seed=7",
    "grpo.group_size=2",
    "grpo.prompts_per_step=2",
    "grpo.lr=1e-3",
    "grpo.micro_batch_size=8",
    "keep_checkpoints=3",
]


def _run(model: Path, out: Path, failpoint: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "evoharness.cli", "rl", "--model-path", str(model), "--out", str(out)]
    for s in SETTINGS:
        cmd += ["--set", s]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
        # bitwise-reproducible MKL GEMMs whatever the memory alignment (runs are compared exactly)
        "MKL_CBWR": "AUTO,STRICT",
    }
    env.pop(FAILPOINT_ENV, None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(out / "metrics.jsonl")]


def _strip(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith("timing_s")} for ln in lines]


def _latest(out: Path) -> str:
    return (out / "checkpoints" / "latest").read_text().strip()


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rl") / "full"
    done = _run(model_dir, out)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _same_as_reference(out: Path, reference: Path) -> None:
    assert _strip(out) == _strip(reference)
    a, b = (
        load_file(str(reference / "final" / "model.safetensors")),
        load_file(str(out / "final" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# (failpoint, metrics steps left by the kill, checkpoint `latest` names after the kill); a kill
# before the metrics append ("before_metrics") is the random-time SIGKILL of test_rl_kill.py
POINTS = [
    ("torn_metrics:2", [1], "step_0000001"),  # half of step 2's line written (torn)
    ("after_metrics:2", [1, 2], "step_0000001"),  # step 2 recorded, not checkpointed: the old gap
    ("mid_checkpoint:2", [1, 2], "step_0000001"),  # checkpoint half written in its temp dir
    ("after_checkpoint:2", [1, 2], "step_0000001"),  # checkpoint in place, `latest` not moved
]


@pytest.mark.parametrize("point,left,latest", POINTS, ids=[p[0].split(":")[0] for p in POINTS])
def test_kill_at_each_commit_point_then_resume(model_dir, reference, tmp_path, point, left, latest):
    out = tmp_path / "run"
    killed = _run(model_dir, out, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    raw = (out / "metrics.jsonl").read_text()
    if point.startswith("torn"):
        assert not raw.endswith("\n")  # a torn last line
    with pytest.warns(UserWarning, match="torn") if point.startswith("torn") else _nothing():
        assert _steps(out) == left
    assert _latest(out) == latest

    resumed = _run(model_dir, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _same_as_reference(out, reference)


def test_unreadable_latest_checkpoint_falls_back_with_a_message(model_dir, reference, tmp_path):
    out = tmp_path / "run"
    assert _run(model_dir, out, "before_metrics:3").returncode == -signal.SIGKILL
    assert _latest(out) == "step_0000002" and _steps(out) == [1, 2]
    weights = out / "checkpoints" / "step_0000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a torn copy / bad disk
    assert [p.name for p in checkpoint_candidates(out)] == ["step_0000002", "step_0000001"]

    resumed = _run(model_dir, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "step_0000002 is unreadable" in resumed.stderr and "falling back to step_0000001" in resumed.stderr
    _same_as_reference(out, reference)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_state_is_never_unpickled_arbitrarily(tmp_path):
    path = tmp_path / "trainer_state.pt"
    torch.save({"optimizer": {"state": {}, "param_groups": []}, "rng": _Evil()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        load_trainer_state(path)


def test_job_checkpoint_names_only_the_projects_classes(tmp_path):
    """A job file (`checkpoints/step_N/job.pkl`) from elsewhere cannot run code when a run resumes:
    only the project's classes, plain containers and enum members / project methods are looked up."""
    import pickle

    from evoharness.runtime.cells import Role
    from evoharness.runtime.driver import load_job

    path = tmp_path / "job.pkl"
    path.write_bytes(pickle.dumps({"roles": [Role.TRAIN], "ok": {1, 2}}))
    assert load_job(path) == {"roles": [Role.TRAIN], "ok": {1, 2}}
    for evil in (_Evil(), os.system, pickle.loads):
        path.write_bytes(pickle.dumps({"x": evil}))
        with pytest.raises(pickle.UnpicklingError):
            load_job(path)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
