"""benchmarks/gpu_main_job.py runs for real only on a lent GPU; ``--cpu-smoke`` runs its code path (one
`device` key for every stage, the stage caps, the report copied with the device named) on the smoke
preset on CPU, so that a change breaking the GPU run fails here first."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_main_job_cpu_smoke_publishes_the_report_with_both_paired_tests(tmp_path):
    out, results = tmp_path / "job", tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_main_job.py"), "--cpu-smoke"]
    done = subprocess.run(
        [*cmd, "--out", str(out), "--results", str(results)], capture_output=True, text=True, timeout=900, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = json.loads((out / "run_config.json").read_text())
    assert cfg["device"] == "cpu" and cfg["rl"]["max_minutes"] == 2.0 and cfg["rl"]["soup_seeds"] == 1
    report = (results / "report.md").read_text()
    assert "| SFT + GRPO vs SFT | valid_seen |" in report  # the paired success test
    assert "### Cost of won episodes" in report  # the paired cost test
    assert (results / "machine.txt").read_text().splitlines()[1].startswith("device: cpu; settings: device=cpu")
