"""The devices of this machine, and the check `evoharness rl` / `sft` run before loading anything.

GPU memory is read in a short child process (``torch.cuda.get_device_properties``), so the
command's own process never initialises CUDA (a driver that holds no model then keeps no CUDA
context on GPU 0). Host RAM is ``MemAvailable`` of ``/proc/meminfo``: what can be allocated now
without swapping, other tenants' memory excluded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from evoharness.config.rl import RLConfig
from evoharness.config.sft import SFTConfig
from evoharness.plan.memory import GIB
from evoharness.plan.planner import Plan, plan_run

_CUDA_QUERY = (
    "import json, torch; "
    "print(json.dumps([torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]"
    " if torch.cuda.is_available() else []))"
)


def cuda_memory_gib() -> list[float]:
    """Total memory (GiB) of each CUDA device this process may use (``CUDA_VISIBLE_DEVICES``
    applies); empty without CUDA or when the query fails."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CUDA_QUERY], capture_output=True, text=True, timeout=120, env=dict(os.environ)
        )
        return [b / GIB for b in json.loads(out.stdout.strip().splitlines()[-1])] if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []


def host_available_gib(meminfo: str = "/proc/meminfo") -> float:
    """``MemAvailable`` of `meminfo` in GiB (elsewhere than Linux: free physical pages).

    Raises:
        OSError: neither source can be read.
    """
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GIB  # the file counts kB
    except FileNotFoundError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB


def wants_cuda(cfg: RLConfig | SFTConfig) -> bool:
    """The run places its models on GPUs."""
    if isinstance(cfg, RLConfig):
        return cfg.runtime.gpus_per_cell > 0 or cfg.device.startswith("cuda")
    return cfg.device.startswith("cuda")


@dataclass(frozen=True)
class Preflight:
    """The check's outcome: the plan against this machine's devices, or why there is none."""

    plan: Plan | None
    skipped: str = ""

    @property
    def refused(self) -> bool:
        return self.plan is not None and not self.plan.fits


def preflight(cfg: RLConfig | SFTConfig, model_path: str | None = None) -> Preflight:
    """Plan `cfg` on the devices it will run on here: the visible CUDA devices (count and total
    memory each) for a GPU run, the available host RAM for a CPU run.

    Skipped (``plan`` None, ``skipped`` says why) where the numbers cannot be known here: cells on
    a remote Ray cluster, a GPU run on a machine with no visible CUDA device (the run fails on its
    own), or no architecture to plan (no ``config.json`` and no ``layout``; loading fails with its
    own error).
    """
    if isinstance(cfg, RLConfig) and cfg.runtime.backend == "ray" and cfg.runtime.ray_address:
        return Preflight(
            None, "the cells run on a Ray cluster (plan it: `evoharness plan --devices N --device-memory G`)"
        )
    if wants_cuda(cfg):
        caps = cuda_memory_gib()
        if not caps:
            return Preflight(None, "no CUDA device is visible here")
    else:
        caps = [host_available_gib()]
    try:
        return Preflight(plan_run(cfg, caps, len(caps), model_path))
    except ValueError as e:
        return Preflight(None, str(e))
