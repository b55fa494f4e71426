"""Rollout/training schedules: colocate, async, elastic, elastic-gated (see each module)."""

from __future__ import annotations

from typing import Any

from evoharness.runtime.schedulers.async_ import Async
from evoharness.runtime.schedulers.base import Scheduler
from evoharness.runtime.schedulers.colocate import Colocate
from evoharness.runtime.schedulers.elastic import Elastic, ElasticGated

SCHEDULERS: dict[str, type[Scheduler]] = {"colocate": Colocate, "async": Async, "elastic": Elastic,
                                          "elastic-gated": ElasticGated}


def make_scheduler(name: str, **kwargs: Any) -> Scheduler:
    """Build a schedule by name; `kwargs` are its constructor arguments."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](**kwargs)


__all__ = ["SCHEDULERS", "Async", "Colocate", "Elastic", "ElasticGated", "Scheduler", "make_scheduler"]
