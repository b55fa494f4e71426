"""The SFT anchor (PPO-ptx): its batches, its errors, and GRPO with it on real games and a real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rl_cells import metrics, rl_config

from evoharness.config.sft import SFTAnchorConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import load_model, load_tokenizer
from evoharness.recipes.rl import train_rl
from evoharness.train.sft import collate, completion_loss, load_examples, plan_epoch, tokenize_examples
from evoharness.train.sft_anchor import SFTAnchor


def write_examples(path: Path, n_games: int = 8) -> Path:
    """One example per real train game: the BPE harness's first prompt and a teacher-style reply
    that goes to the first receptacle the admissible commands name."""
    rows = []
    for task in discover_games("train")[:n_games]:
        env = make_env(task, engine="fast")
        h, first = BPEHarness(ExperienceStore()), env.reset()
        h.reset(task, first)
        go = next(c for c in first.admissible_commands if c.startswith("go to "))
        rows.append({"messages": h.messages(), "completion": f"<think>search</think><action>{go}</action>"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mean_nll(model_dir: Path, data: Path) -> float:
    tok, model = load_tokenizer(model_dir), load_model(model_dir, "cpu", torch.float32)
    rows = tokenize_examples(tok, load_examples(data), 512, 64)
    with torch.no_grad():
        loss, n = completion_loss(model, *collate(rows, tok.pad_token_id or 0))
    return float(loss) / n


def test_batches_cover_every_row_once_per_epoch_and_replay_after_a_restart(model_dir, tmp_path):
    data = write_examples(tmp_path / "sft.jsonl")
    cfg = SFTAnchorConfig(data_path=str(data), batch_tokens=1200, max_prompt_tokens=512)
    tok = load_tokenizer(model_dir)
    a = SFTAnchor(cfg, tok, seed=0, updates_per_step=2)
    per_epoch = len(plan_epoch([len(r[0]) for r in a.rows], cfg.batch_tokens, 0, 0))
    assert 1 < per_epoch < len(a.rows)  # several rows per batch, several batches
    for epoch in range(2):
        seen = sorted(tuple(r[0]) for i in range(per_epoch) for r in a.batch(epoch * per_epoch + i))
        assert seen == sorted(tuple(r[0]) for r in a.rows)
    b = SFTAnchor(cfg, tok, seed=0, updates_per_step=2)  # a resumed run draws the same batches
    assert [b.batch(i) for i in range(3 * per_epoch)] == [a.batch(i) for i in range(3 * per_epoch)]


def test_a_missing_or_unusable_data_file_is_a_clear_error(model_dir, tmp_path):
    tok = load_tokenizer(model_dir)
    with pytest.raises(FileNotFoundError, match="sft_anchor.data_path"):
        SFTAnchor(SFTAnchorConfig(data_path=str(tmp_path / "none.jsonl")), tok, 0, 1)
    (tmp_path / "bad.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(ValueError, match="needs 'messages' and 'completion'"):
        SFTAnchor(SFTAnchorConfig(data_path=str(tmp_path / "bad.jsonl")), tok, 0, 1)
    data = write_examples(tmp_path / "sft.jsonl", 2)
    with pytest.raises(ValueError, match="fits the token budgets"):
        SFTAnchor(SFTAnchorConfig(data_path=str(data), max_prompt_tokens=4), tok, 0, 1)


def test_grpo_with_the_anchor_learns_the_teacher_rows_that_grpo_alone_does_not(model_dir, tmp_path, rl_reference):
    data = write_examples(tmp_path / "sft.jsonl")
    cfg = rl_config(model_dir, tmp_path / "rl")  # rl_reference's run, plus the anchor
    cfg.sft_anchor = SFTAnchorConfig(data_path=str(data), coef=1.0, max_prompt_tokens=512, max_completion_tokens=64)
    final = train_rl(cfg, progress=False)
    recs = metrics(tmp_path / "rl")
    assert [r["step"] for r in recs] == [1, 2] and all(r["train/anchor_nll"] > 0 for r in recs)
    # the same rollouts (the first step samples from the same weights) ...
    assert recs[0]["success"] == rl_reference.metrics[0]["success"]
    assert recs[0]["train/n_tokens"] == rl_reference.metrics[0]["train/n_tokens"]
    # ... but the update also fits the teacher rows: their NLL falls below GRPO alone's
    alone = rl_reference.out / "final"
    assert mean_nll(final, data) < mean_nll(alone, data) - 0.05
    assert mean_nll(final, data) < mean_nll(model_dir, data) - 0.05
