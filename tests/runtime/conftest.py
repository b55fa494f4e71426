"""Small simulator workloads for the runtime tests (each runs in well under a second)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from evoharness.config.sim import SimConfig

LONG_TAIL: dict[str, Any] = {
    "workload": {
        "groups_per_step": 4,
        "group_size": 4,
        "initial_prompt_tokens": 500,
        "turns": {"kind": "lognormal", "median": 8, "sigma": 0.9, "max": 80},
        "completion_tokens": {"kind": "lognormal", "median": 200, "sigma": 0.5},
        "prompt_tokens": {"kind": "lognormal", "median": 400, "sigma": 0.7},
        "tool_latency_s": {"kind": "lognormal", "median": 2.0, "sigma": 0.8},
        "timeout_s": 600,
        "timeout_ref_tps": 30,
    },
    "cluster": {
        "cells": 4,
        "accelerators_per_cell": 8,
        "capacity": 4,
        "gen_tps_single": 50.0,
        "gen_concurrency_exponent": 0.8,
        "prefill_speedup": 50.0,
        "train_tps": 2000.0,
        "weight_sync_s": 3.0,
    },
    "steps": 3,
    "seed": 1,
}


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = v
    return a


@pytest.fixture
def make_cfg():
    """make_cfg(**sections) -> SimConfig: the long-tail workload with overrides."""

    def make(**over: Any) -> SimConfig:
        return SimConfig.model_validate(_merge(copy.deepcopy(LONG_TAIL), over))

    return make


class Recorder:
    """Wraps a scheduler and logs every event it sees and command it issues."""

    def __init__(self, inner):
        self.inner = inner
        self.log: list[tuple[str, Any]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self):
        cmds = self.inner.start()
        self.log += [("cmd", c) for c in cmds]
        return cmds

    def handle(self, ev):
        self.log.append(("ev", ev))
        cmds = self.inner.handle(ev)
        self.log += [("cmd", c) for c in cmds]
        return cmds


@pytest.fixture
def recorder():
    return Recorder


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head on 127.0.0.1 (2 CPUs) for a test module; skips when Ray is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()
