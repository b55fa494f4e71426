"""The BPE harness of EvoHarness-RL (arXiv 2608.05446): Belief, Progress, Experience.

- `belief.py`: rule-based world model, 48 relation edges (meta-action ``track``).
- `progress.py`: plan of at most 8 (subgoal, status) records (``commit``).
- `experience.py`: cross-episode store, 4 categories x 80 entries, top-3
  retrieval, LFU eviction, frozen per batch, consolidated per epoch
  (``recall``, ``note``); default entries in `seeds.py`.
- `goal.py`: ALFWorld objective parser.
- `harness.py`: `BPEHarness`, the prompt and the meta-actions.
"""

from evoharness.harness.bpe.belief import Belief
from evoharness.harness.bpe.experience import ExperienceStore, Op, RuleConsolidator
from evoharness.harness.bpe.goal import Goal, parse_goal
from evoharness.harness.bpe.harness import BPEHarness
from evoharness.harness.bpe.progress import Progress

__all__ = ["BPEHarness", "Belief", "ExperienceStore", "Goal", "Op", "Progress", "RuleConsolidator", "parse_goal"]
