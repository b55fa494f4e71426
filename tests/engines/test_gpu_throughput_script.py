"""benchmarks/gpu_throughput.py only runs for real on a lent GPU; its ``--cpu-smoke``
mode runs the same code paths (SFT step, both engines, HF generate) on a micro
shape, so an API change that would break the GPU run fails here first."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_throughput_cpu_smoke_prints_a_full_row():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), "--cpu-smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("micro"))
    # size, params, train tok/s, MFU, then static / engine / generate new tok/s: all measured, none OOM
    fields = row.split()
    assert len(fields) == 7, row
    assert all(float(f) > 0 for f in (fields[2], *fields[4:])), row
    assert re.fullmatch(r"\d+\.\d%", fields[3]), row
