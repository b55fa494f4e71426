"""SIGKILL a real `evoharness rl` process mid-run, rerun the same command:
no completed step is lost or repeated and the result equals an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # real subprocesses, several RL runs: ~25 s on 2 cores

SETTINGS = [
    "steps=4",
    "max_steps=4",
    "max_new_tokens=12",
    "max_prompt_tokens=512",
    "decode_threads=1",
    "threads=1",
    "seed=5",
    "grpo.group_size=2",
    "grpo.prompts_per_step=2",
    "grpo.lr=1e-3",
    "grpo.micro_batch_size=8",
    "grpo.mini_batches=2",
]


def _cmd(model: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "evoharness.cli", "rl", "--model-path", str(model), "--out", str(out)]
    for s in SETTINGS:
        cmd += ["--set", s]
    return cmd


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.is_file() else []


def _env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
        # bitwise-reproducible MKL GEMMs whatever the memory alignment (runs are compared exactly)
        "MKL_CBWR": "AUTO,STRICT",
    }


def test_sigkill_mid_run_then_resume(model_dir, tmp_path):
    full = tmp_path / "full"
    subprocess.run(_cmd(model_dir, full), check=True, env=_env(), capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(model_dir, killed), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_metrics(killed)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # step 3 is in flight: its rollout or update is lost, nothing else
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = [m["step"] for m in _metrics(killed)]
    assert done[:2] == [1, 2] and len(done) < 4

    subprocess.run(_cmd(model_dir, killed), check=True, env=_env(), capture_output=True, timeout=600)
    strip = lambda ms: [{k: v for k, v in m.items() if not k.startswith("timing_s")} for m in ms]  # noqa: E731
    assert strip(_metrics(killed)) == strip(_metrics(full))
    a, b = load_file(str(full / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
