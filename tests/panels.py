"""Real episodes for report and diagnosis tests: a short evaluation of `policy` on `games` of `split` (BPE
harness, 8-step cap), and the scripted teacher's episodes on given games."""

from __future__ import annotations

from pathlib import Path

from engines import pick_engine

from evoharness.config.eval import EvalConfig
from evoharness.config.harness import HarnessConfig
from evoharness.envs.alfworld import make_env
from evoharness.eval.evaluate import evaluate
from evoharness.harness.factory import make_harness
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes


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


def teacher_episodes(tasks: list) -> list[dict]:
    """The scripted teacher on `tasks` (BPE harness, an empty experience store, cap 50), as ``episodes.jsonl``
    records."""
    played = run_episodes(
        [EpisodeSpec(t, f"{t.task_id}#0") for t in tasks],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(HarnessConfig()),
        TeacherPolicy(),
        max_steps=50,
    )
    return [t.to_dict() for t in played]
