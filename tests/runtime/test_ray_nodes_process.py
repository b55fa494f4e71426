"""tests/runtime/test_ray_nodes.py (two Ray nodes, no shared filesystem) in a pytest process of its
own, with Ray's auth mode set before Ray is imported (see that module's note)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_two_node_ray_module_in_a_process_of_its_own():
    pytest.importorskip("ray")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_ray_nodes.py")],
        cwd=HERE.parents[1],
        # an earlier ray.init in this process set RAY_AUTH_MODE=token; the two-node cluster runs without auth
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "EVOHARNESS_RAY_NODES_OWN_PROCESS": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout.splitlines()[-1], out.stdout[-500:]
