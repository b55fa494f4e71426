"""Which episodes an evaluation plays (its protocol).

- ``panel`` (default): every game of the split exactly once, sorted by task
  id, seed fixed; step cap 50. The same numbers whatever the worker count.
- ``evoharness``: the same panel with EvoHarness-RL's step cap T_max = 70.
- ``random128``: verl-agent-style validation, 128 games drawn uniformly *with
  replacement* from the split using the seed; step cap 50. Published numbers
  that use it move with the draw; it is here for comparison only.
"""

from __future__ import annotations

import random

from evoharness.config.eval import protocol_step_cap
from evoharness.envs.base import TaskSpec
from evoharness.rollout.episode import EpisodeSpec


def build_episodes(tasks: list[TaskSpec], protocol: str, seed: int, samples: int = 1) -> list[EpisodeSpec]:
    """Episodes for `protocol` over `tasks` (already filtered and sorted).

    Args:
        samples: repeats per game (``#k`` suffix in the episode id), for pass@k
            or RL groups; evaluation panels use 1.
    """
    protocol_step_cap(protocol)
    tasks = sorted(tasks, key=lambda t: t.task_id)
    if protocol == "random128":
        rng = random.Random(seed)
        drawn = [rng.choice(tasks) for _ in range(128)]
        return [EpisodeSpec(t, f"{t.task_id}#draw{i}", seed) for i, t in enumerate(drawn)]
    return [EpisodeSpec(t, f"{t.task_id}#{k}", seed) for t in tasks for k in range(samples)]
