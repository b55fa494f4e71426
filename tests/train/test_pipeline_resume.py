"""The main job resumes only itself (issue 10 fault 7's kind, review): rerun with other settings,
its finished stages would be reported as the new settings' results."""

from __future__ import annotations

import json

import pytest

from evoharness.config.base import load_config
from evoharness.config.run import RunConfig
from evoharness.pipeline import run_pipeline

TINY = [
    "train_games=2",
    "budget_minutes=0.02",
    "skip_rl=true",
    "eval_limit=1",
    "max_steps=30",
    "sft.max_steps=2",
    "sft.ckpt_every=0",
    "sft.progress=false",
    "vocab_size=300",
    'model_preset="mini"',
    "dev_games=2",
    "dagger_rounds=1",
    "dagger_games=2",
    "dagger_sft_steps=1",
    "curve_games=1",
]


def test_rerun_with_other_settings_is_refused(tmp_path):
    out = f'out_dir="{tmp_path / "run"}"'
    run_pipeline(load_config(RunConfig, overrides=[*TINY, out, "model_overrides.head_dim=16"]), log=lambda m: None)
    assert json.loads((tmp_path / "run" / "model_init" / "config.json").read_text())["head_dim"] == 16
    # the same job with another budget and worker count: every stage is done, nothing is redone
    run_pipeline(
        load_config(
            RunConfig, overrides=[*TINY, out, "model_overrides.head_dim=16", "budget_minutes=0.03", "eval_workers=2"]
        ),
        log=lambda m: None,
    )
    with pytest.raises(ValueError, match=r"harness.history_window: None -> 2"):
        run_pipeline(
            load_config(RunConfig, overrides=[*TINY, out, "model_overrides.head_dim=16", "harness.history_window=2"]),
            log=lambda m: None,
        )


def test_a_partial_section_keeps_the_main_jobs_defaults():
    """`evoharness run --set sft.lr=1e-3` (the CLI's own example) swapped in SFTConfig's standalone
    defaults for every other sft key, so the prompt-budget check refused the run; `--set
    rl.grpo.lr=...` silently reset the RL sizes (150 steps, 16 prompts) and `--set
    harness.history_window=2` the compact system prompt."""
    base = RunConfig()
    cfg = load_config(RunConfig, overrides=["sft.lr=1e-3", "rl.grpo.lr=1e-5", "harness.history_window=2"])
    assert cfg.sft == base.sft.model_copy(update={"lr": 1e-3})
    assert cfg.rl.grpo == base.rl.grpo.model_copy(update={"lr": 1e-5})
    assert cfg.rl.model_copy(update={"grpo": base.rl.grpo}) == base.rl
    assert cfg.harness == base.harness.model_copy(update={"history_window": 2})


def test_dev_teacher_examples_play_only_development_games_and_leave_the_store_alone(tmp_path):
    """Probes of the student (experiments/grounding/student_grounding.py, student_levers/) read the teacher's
    turns on games the student never trained on, without changing the run's experience store."""
    from evoharness.harness.bpe import ExperienceStore
    from evoharness.pipeline import dev_split, dev_teacher_examples

    cfg = load_config(RunConfig, overrides=["dev_games=6"])
    store = tmp_path / "experience.json"
    ExperienceStore().save(store)
    before = store.read_bytes()
    examples = dev_teacher_examples(cfg, store, tmp_path / "traces.jsonl", n_games=3)
    train, dev = dev_split(cfg)
    played = {ex["episode_id"].split("#")[0] for ex in examples}
    assert played == {t.task_id for t in dev[:3]}
    assert not played & {t.task_id for t in train}
    assert all(ex["completion"].startswith("<think>") for ex in examples)
    assert store.read_bytes() == before
    # played afresh, not resumed from the traces file the first call left
    assert len(dev_teacher_examples(cfg, store, tmp_path / "traces.jsonl", n_games=3)) == len(examples)


def test_a_dagger_round_fine_tunes_at_its_own_learning_rate(tmp_path):
    """`dagger_lr` sets the peak lr of a DAgger round's SFT (a converged model re-warmed to the
    from-scratch lr lost games: benchmarks/results/student/dagger90_lr2e3/); the first SFT stage keeps sft.lr."""
    out = f'out_dir="{tmp_path / "run"}"'
    run_pipeline(load_config(RunConfig, overrides=[*TINY, out, "dagger_lr=3e-5"]), log=lambda m: None)
    first = json.loads((tmp_path / "run" / "sft" / "sft_config.json").read_text())
    dagger = json.loads((tmp_path / "run" / "sft_dagger1" / "sft_config.json").read_text())
    assert first["lr"] == RunConfig().sft.lr and dagger["lr"] == 3e-5
    steps = [json.loads(line) for line in (tmp_path / "run" / "sft_dagger1" / "metrics.jsonl").read_text().splitlines()]
    assert steps and all(0 < s["lr"] <= 3e-5 for s in steps)
    with pytest.raises(ValueError, match="greater than 0"):
        load_config(RunConfig, overrides=["dagger_lr=0"])
