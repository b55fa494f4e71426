"""SFT checkpoints: an interrupted run, resumed, reaches the uninterrupted run's exact weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evoharness.config.sft import SFTConfig
from evoharness.models.init import init_model
from evoharness.models.tokenizer import build_tokenizer
from evoharness.train.checkpoint import latest_checkpoint
from evoharness.train.sft import train_sft

MICRO = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16
)


def examples(n: int = 10) -> list[dict]:
    rooms = ["fridge 1", "cabinet 4", "sinkbasin 1", "microwave 1", "countertop 2", "drawer 3"]
    return [
        {
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {
                    "role": "user",
                    "content": f"OBJECTIVE: find item {i}\nOBSERVATION: you see {rooms[i % 6]}."
                    + " Nothing happens." * (i % 4),
                },
            ],
            "completion": f"<think>try {rooms[(i + 1) % 6]}</think><action>go to {rooms[(i + 1) % 6]}</action>",
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    tok = build_tokenizer([json.dumps(e) for e in examples()] * 2, root / "tok", vocab_size=400)
    init_model(MICRO, tok, root / "init", seed=0)
    return root / "init"


@pytest.fixture(autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


CFG = SFTConfig(lr=3e-3, max_steps=9, warmup_steps=2, batch_tokens=250, ckpt_every=3, progress=False, seed=5)


def weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


class Interrupt(Exception):
    pass


def test_interrupted_run_resumes_to_identical_weights(tmp_path, model_dir):
    ref = train_sft(CFG, examples(), model_dir, tmp_path / "ref")
    ref_losses = [json.loads(ln)["loss"] for ln in (tmp_path / "ref/metrics.jsonl").read_text().splitlines()]
    assert len(ref_losses) == 9

    def crash_at_5(step, _rec):
        if step == 5:
            raise Interrupt

    run = tmp_path / "run"
    with pytest.raises(Interrupt):
        train_sft(CFG, examples(), model_dir, run, on_step=crash_at_5)
    assert latest_checkpoint(run).name == "step_0000003" and not (run / "final").exists()
    out = train_sft(CFG, examples(), model_dir, run)  # resumes from step 3
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 10))  # steps 4-5 of the crashed run were dropped
    assert [r["loss"] for r in recs] == ref_losses
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_0000006", "step_0000009"]  # keep_checkpoints=2, no temp dirs left
    assert not any(p.name.startswith(".") for p in run.rglob("*"))


def test_time_budget_stops_after_a_checkpoint_and_resumes(tmp_path, model_dir):
    ref = train_sft(CFG, examples(), model_dir, tmp_path / "ref")
    run = tmp_path / "run"
    part = train_sft(CFG.model_copy(update={"max_minutes": 1e-9}), examples(), model_dir, run)
    state = json.loads((part / "sft_state.json").read_text())
    assert state == {"step": 1, "total_steps": 9, "complete": False}
    assert latest_checkpoint(run).name == "step_0000001"
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["event"] == "stopped"
    done = train_sft(CFG, examples(), model_dir, run)
    assert json.loads((done / "sft_state.json").read_text())["complete"] is True
    a, b = weights(ref), weights(done)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_other_data(tmp_path, model_dir):
    train_sft(CFG.model_copy(update={"max_steps": 2}), examples(), model_dir, tmp_path / "run")
    with pytest.raises(ValueError, match="other examples"):
        train_sft(CFG.model_copy(update={"max_steps": 2}), examples(7), model_dir, tmp_path / "run")
    # other training settings are another run too (review): named, not silently trained on
    with pytest.raises(ValueError, match=r"lr: 0.003 -> 0.001"):
        train_sft(CFG.model_copy(update={"max_steps": 2, "lr": 1e-3}), examples(), model_dir, tmp_path / "run")
    # how it runs may change
    train_sft(
        CFG.model_copy(update={"max_steps": 2, "micro_batch_tokens": 100, "ckpt_every": 1}),
        examples(),
        model_dir,
        tmp_path / "run",
    )


def test_torn_metrics_and_unreadable_latest_checkpoint_fall_back(tmp_path, model_dir):
    """Issue 10 fault 7 for SFT: a torn last metrics line is dropped, an unreadable latest
    checkpoint falls back to the previous one (with a warning), and the run still ends on the
    uninterrupted run's weights and losses."""
    ref = train_sft(CFG, examples(), model_dir, tmp_path / "ref")
    ref_losses = [json.loads(ln)["loss"] for ln in (tmp_path / "ref/metrics.jsonl").read_text().splitlines()]

    def crash_at_7(step, _rec):
        if step == 7:
            raise Interrupt

    run = tmp_path / "run"
    with pytest.raises(Interrupt):
        train_sft(CFG, examples(), model_dir, run, on_step=crash_at_7)
    assert latest_checkpoint(run).name == "step_0000006"
    state = run / "checkpoints" / "step_0000006" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:200])  # unreadable
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "loss": 0.1')  # torn by a kill mid-write
    with pytest.warns(UserWarning) as caught:
        out = train_sft(CFG, examples(), model_dir, run)
    messages = " ".join(str(w.message) for w in caught)
    assert "step_0000006" in messages and "falling back to step_0000003" in messages and "torn line" in messages
    a, b = weights(ref), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == ref_losses


@pytest.mark.parametrize(
    "pointer",
    [b"step_000", b"\xff\xfe\x00\x13", b"", b"../../ref/checkpoints/step_0000009"],
    ids=["torn-prefix", "garbage-bytes", "empty", "a-path"],
)
def test_torn_latest_pointer_resumes_from_the_newest_checkpoint(tmp_path, model_dir, pointer):
    """A `checkpoints/latest` that names no checkpoint directory (torn by a crash of the file
    system, garbage, a path out of the run) is reported and ignored: the run resumes from the
    newest complete step directory and ends on the uninterrupted run's weights and losses."""
    ref = train_sft(CFG, examples(), model_dir, tmp_path / "ref")
    ref_losses = [json.loads(ln)["loss"] for ln in (tmp_path / "ref/metrics.jsonl").read_text().splitlines()]

    def crash_at_8(step, _rec):
        if step == 8:
            raise Interrupt

    run = tmp_path / "run"
    with pytest.raises(Interrupt):
        train_sft(CFG, examples(), model_dir, run, on_step=crash_at_8)
    (run / "checkpoints" / "latest").write_bytes(pointer)
    assert latest_checkpoint(run) is None
    with pytest.warns(UserWarning, match="does not name a checkpoint"):
        out = train_sft(CFG, examples(), model_dir, run)
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 10)) and [r["loss"] for r in recs] == ref_losses
    a, b = weights(ref), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
