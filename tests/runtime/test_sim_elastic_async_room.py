"""Regression: elastic-async moved every satellite to train while dispatched executions still
waited for a rollout cell, and (its staleness gate shut) never moved one back: a deadlock."""

from __future__ import annotations

import pytest

from evoharness.config.sim import SimConfig
from evoharness.runtime.sim import simulate


@pytest.mark.parametrize(
    "cells,capacity,groups,group_size,eta", [(3, 6, 3, 2, 1), (2, 2, 2, 2, 0), (3, 4, 2, 2, 1), (2, 2, 2, 2, 1)]
)
def test_queued_executions_bring_a_cell_back_to_rollout(cells, capacity, groups, group_size, eta):
    cfg = SimConfig.model_validate(
        {
            "workload": {"groups_per_step": groups, "group_size": group_size},
            "cluster": {"cells": cells, "capacity": capacity},
            "policy": {"staleness": eta},
            "steps": 5,
        }
    )
    res = simulate(cfg, "elastic-async")
    assert len(res.step_end_s) == 5 and max(res.staleness) <= eta
