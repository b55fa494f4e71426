"""A short real evaluation for report tests: `policy` plays `games` of `split` (BPE harness, 8-step cap)."""

from __future__ import annotations

from pathlib import Path

from evoharness.config.eval import EvalConfig
from evoharness.eval.evaluate import evaluate


def play_panel(tmp_path: Path, name: str, games: list[str], policy: dict, split: str = "train") -> Path:
    """Evaluate into ``tmp_path/name`` (``summary.json``, ``episodes.jsonl``) and return that directory.
    An 8-step cap makes a noisy policy lose some games, so two systems differ per game."""
    cfg = EvalConfig.model_validate(
        dict(
            split=split,
            games=games,
            batch_size=4,
            out_dir=str(tmp_path / name),
            harness={"kind": "bpe"},
            policy=policy,
            max_steps=8,
        )
    )
    evaluate(cfg, progress=False)
    return tmp_path / name
