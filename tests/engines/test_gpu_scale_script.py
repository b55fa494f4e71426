"""benchmarks/gpu_scale.py runs for real only on a lent GPU; ``--cpu-smoke`` runs every table (decode
engines, the SFT step, a sharded GRPO update with its weight sync, a LoRA update against the
planner) on a micro layout, so an API change that would break the GPU run fails here first."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_scale_cpu_smoke_fills_every_table(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_scale.py"), "--cpu-smoke", "--json", str(tmp_path / "f.json")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    f = json.loads((tmp_path / "f.json").read_text())
    decode = f["decode"]["micro"]
    assert all(float(decode[k]) > 0 for k in decode if not k.startswith("vllm")), decode
    assert f["sft"]["micro"]["tok_s"] > 0
    assert f["grpo"]["train_s"] > 0 and f["grpo"]["sync_s"] > 0 and f["grpo"]["tokens"] > 0
    assert f["lora"]["predicted"] > 0 and f["lora"]["fits"] is True
