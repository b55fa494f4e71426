"""The quickstart's command block (docs/index.md) runs as written, in a scratch directory: the smoke
pipeline, an in-process evaluation, the gateway, an evaluation through the endpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quickstart_block() -> str:
    text = (ROOT / "docs" / "index.md").read_text()
    section = text.split("## Five minutes")[1].split("\n## ")[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return block


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart waits for the server with curl")
def test_quickstart_block_runs_as_written(tmp_path):
    with socket.socket() as s:  # the block's port must be free; if not, the test would read another server
        assert s.connect_ex(("127.0.0.1", 8011)) != 0, "port 8011 is in use"
    script = "set -euo pipefail\n" + quickstart_block()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    local = json.loads((tmp_path / "runs" / "smoke_eval" / "summary.json").read_text())
    served = json.loads((tmp_path / "runs" / "smoke_openai" / "summary.json").read_text())
    assert local["overall"]["n"] == served["overall"]["n"] == 6
    assert served["overall"]["policy_errors"] == 0 and served["overall"]["unreached"] == 0
    assert (tmp_path / "runs" / "smoke" / "report.md").is_file()
    # the recipe travelled with the model: plain `eval --model-path` replays the job's own evaluation of
    # SFT + GRPO (compact prompt, 1024-token budget, constrained, its experience store) game for game
    recipe = json.loads((tmp_path / "runs" / "smoke" / "rl" / "final" / "harness_recipe.json").read_text())
    assert recipe["harness"]["system_prompt"] == "compact" and recipe["constrained"] is True

    def actions(path: Path) -> dict[str, list[str]]:
        return {d["episode_id"]: [t["action"] for t in d["turns"]] for d in map(json.loads, path.open())}

    job = actions(tmp_path / "runs/smoke/eval/sft_grpo/episodes.jsonl")
    plain = actions(tmp_path / "runs/smoke_eval/episodes.jsonl")
    assert plain.keys() == job.keys()
    for e, acts in job.items():  # the job ends a repeating episode early (stop_repeats 3); plain eval plays on
        assert plain[e][: len(acts)] == acts, e
    assert "model recipe" in out.stderr
