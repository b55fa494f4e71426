"""What an environment's recipe hands the RL job (`recipes.rl.WORKLOADS`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Recipe:
    """An environment's part of an RL job.

    Attributes:
        workload: the agents (`runtime.cell_backend.AgentWorkload`), in the driver process.
        cell: ``cell(threads)`` -> the picklable factory ``(cell, init_dir) -> CellParts`` that
            builds a cell's model, server and trainer where the cell runs (`runtime.cell.CellParts`).
        evaluate: ``evaluate(weights_file, version, store)`` -> ``eval/*`` metrics of published
            weights; None: no periodic evaluation for this environment.
    """

    workload: Any
    cell: Callable[..., Callable[[int, str | None], Any]]
    evaluate: Callable[[Path, int, Any], dict[str, float]] | None = None
