"""Learning-rate schedules shared by the SFT stage (per optimizer step) and GRPO (per RL step)."""

from __future__ import annotations

import math


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier at 0-based `step`: linear warm-up over `warmup` steps, then cosine from 1 to
    `min_ratio` at `total`, flat at `min_ratio` after it."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
