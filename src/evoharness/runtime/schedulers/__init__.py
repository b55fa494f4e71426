"""Rollout/training schedules: colocate, async, elastic, elastic-gated, elastic-async (see each module)."""

from __future__ import annotations

from typing import Any

from evoharness.runtime.schedulers.async_ import Async
from evoharness.runtime.schedulers.base import Scheduler
from evoharness.runtime.schedulers.colocate import Colocate
from evoharness.runtime.schedulers.elastic import Elastic, ElasticGated
from evoharness.runtime.schedulers.elastic_async import ElasticAsync

SCHEDULERS: dict[str, type[Scheduler]] = {
    "colocate": Colocate,
    "async": Async,
    "elastic": Elastic,
    "elastic-gated": ElasticGated,
    "elastic-async": ElasticAsync,
}


def make_scheduler(name: str, **kwargs: Any) -> Scheduler:
    """Build a schedule by name; `kwargs` are its constructor arguments."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](**kwargs)


__all__ = ["SCHEDULERS", "Async", "Colocate", "Elastic", "ElasticAsync", "ElasticGated", "Scheduler", "make_scheduler"]
