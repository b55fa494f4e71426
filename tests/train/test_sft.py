"""SFT: loss only on assistant tokens, and a real overfitting check through LocalHFPolicy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evoharness.config.sft import SFTConfig
from evoharness.models.init import init_model, load_model
from evoharness.models.tokenizer import build_tokenizer
from evoharness.policies.base import PolicyRequest
from evoharness.policies.local import LocalHFPolicy
from evoharness.train.sft import (
    IGNORE,
    collate,
    completion_loss,
    labels_for,
    load_examples,
    plan_epoch,
    prompt_labels,
    sft_losses,
    tokenize_examples,
    train_sft,
)

MICRO = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
SYSTEM = "You are a household agent. Answer with <think>reasoning</think><action>command</action>."
TASKS = [  # (objective, where the agent is, admissible commands, target think, target action)
    (
        "put a clean apple in fridge",
        "countertop 1",
        ["go to fridge 1", "go to sinkbasin 1", "look"],
        "the apple needs cleaning first",
        "go to sinkbasin 1",
    ),
    (
        "heat some mug and put it in cabinet",
        "the middle of the room",
        ["go to microwave 1", "go to cabinet 3"],
        "the microwave heats things",
        "go to microwave 1",
    ),
    (
        "look at the book under the desklamp",
        "desk 1",
        ["use desklamp 1", "take book 2 from desk 1", "look"],
        "the lamp is here so turn it on",
        "use desklamp 1",
    ),
    (
        "put two cds in safe",
        "drawer 2",
        ["take cd 1 from drawer 2", "close drawer 2", "go to safe 1"],
        "a cd is here so take it",
        "take cd 1 from drawer 2",
    ),
    (
        "cool some lettuce and put it in countertop",
        "fridge 1",
        ["open fridge 1", "go to countertop 1"],
        "the fridge is closed",
        "open fridge 1",
    ),
    (
        "find a pen and note where it was",
        "shelf 3",
        ["go to shelf 4", "examine shelf 3", "look"],
        "remember pens are on shelves",
        "note pens are often on shelves",
    ),
]


def example(obj, where, cmds, think, action):
    user = (
        f"OBJECTIVE: {obj}\nOBSERVATION: You are at {where}. Nothing special happens.\n"
        f"ADMISSIBLE COMMANDS: {', '.join(cmds)}\nPREVIOUS ACTIONS: look"
    )
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "completion": f"<think>{think}</think><action>{action}</action>",
    }


EXAMPLES = [example(*t) for t in TASKS]


def make_model_dir(root: Path, seed: int = 0) -> Path:
    corpus = [json.dumps(e) for e in EXAMPLES] * 3 + ["You arrive at fridge 1. The fridge 1 is closed. " * 5]
    tok = build_tokenizer(corpus, root / "tok", vocab_size=512)
    init_model(MICRO, tok, root / "init", seed=seed)
    return root / "init"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("sft"))


@pytest.fixture(autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_labels_are_ignore_exactly_on_the_prompt(model_dir):
    from evoharness.models.init import load_tokenizer

    tok = load_tokenizer(model_dir)
    rows = tokenize_examples(tok, EXAMPLES, 10_000, 10_000)
    for ex, row in zip(EXAMPLES, rows):
        prompt = tok.encode(tok.apply_chat_template(ex["messages"], tokenize=False, add_generation_prompt=True))
        target = tok.encode(ex["completion"] + "<|im_end|>")
        assert row == (prompt + target, len(prompt))
        labels = labels_for(row)
        assert labels[: len(prompt)] == [IGNORE] * len(prompt) and labels[len(prompt) :] == target
    full = rows[0]
    budget = full[1] - 6  # over budget: cut after the system prompt and OBJECTIVE, never them (harness.prompt)
    stats: dict[str, int] = {}
    short = tokenize_examples(tok, EXAMPLES[:1], budget, 10_000, stats)[0]
    assert short[1] == budget and short[0][budget - 10 : budget] == full[0][full[1] - 10 : full[1]]  # the end is kept
    assert tok.decode(short[0][:budget]).startswith(
        tok.apply_chat_template(EXAMPLES[0]["messages"], tokenize=False).split("\nOBSERVATION")[0]
    )
    assert stats["prompts_fitted"] == stats["prompts_cut"] == 1
    assert short[0][budget:] == full[0][full[1] :]  # the whole completion
    assert tokenize_examples(tok, EXAMPLES[:1], 16, 10_000, stats) == [] and stats["too_long_dropped"] == 1
    # a completion over its budget is dropped, not cut: cut, it loses its <action> answer and eos
    n_completion = len(full[0]) - full[1]
    assert tokenize_examples(tok, EXAMPLES[:1], 10_000, n_completion, stats) == [full]
    assert tokenize_examples(tok, EXAMPLES[:1], 10_000, n_completion - 1, stats) == []
    assert stats["completion_too_long_dropped"] == 1
    ids, lab = collate([short, full], tok.pad_token_id)
    assert ids.shape == lab.shape == (2, len(full[0])) and (lab[0, len(short[0]) :] == IGNORE).all()


def test_loss_ignores_every_prompt_position(model_dir):
    """Perturbing the hidden state (hence logits) at positions that predict prompt
    tokens leaves the loss unchanged; the last prompt position predicts the first
    completion token and does count."""
    from evoharness.models.init import load_tokenizer

    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    row = tokenize_examples(tok, EXAMPLES[:1], 10_000, 10_000)[0]
    ids, labels = collate([row], tok.pad_token_id)
    n_prompt = row[1]
    noise_at: list[int] = []

    def hook(_mod, _inp, out):
        out = out.clone()
        out[0, noise_at] += 5.0 * torch.randn(len(noise_at), out.shape[-1])
        return out

    h = model.model.norm.register_forward_hook(hook)
    try:
        with torch.no_grad():
            base, n = completion_loss(model, ids, labels)
            noise_at[:] = list(range(n_prompt - 1))
            same, _ = completion_loss(model, ids, labels)
            noise_at[:] = [n_prompt - 1]
            moved, _ = completion_loss(model, ids, labels)
    finally:
        h.remove()
    assert n == len(row[0]) - n_prompt
    assert torch.equal(base, same) and not torch.isclose(base, moved)
    with torch.no_grad():  # and it is the mean CE of exactly the completion tokens
        logits = model(ids).logits[0, n_prompt - 1 : -1]
        ref = torch.nn.functional.cross_entropy(logits, ids[0, n_prompt:], reduction="sum")
    assert torch.allclose(base, ref, rtol=1e-5)


def test_prompt_loss_covers_exactly_the_prompt_tokens(model_dir):
    """The auxiliary prompt loss (``prompt_loss_weight``) is the CE of predicting prompt
    tokens 1..n_prompt-1 from their prefixes; the completion loss of the same forward pass is
    `completion_loss`'s, and pads are in neither."""
    from evoharness.models.init import load_tokenizer

    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    rows = tokenize_examples(tok, EXAMPLES[:2], 10_000, 10_000)
    ids, labels = collate(rows, tok.pad_token_id)
    p_lab = prompt_labels(ids, rows)
    for i, (row, n_prompt) in enumerate(rows):
        assert p_lab[i, :n_prompt].tolist() == row[:n_prompt] and (p_lab[i, n_prompt:] == IGNORE).all()
    with torch.no_grad():
        loss_c, loss_p, n_p = sft_losses(model, ids, labels, p_lab)
        ref_c, _ = completion_loss(model, ids, labels)
        logits = model(ids).logits
        ref_p = sum(
            torch.nn.functional.cross_entropy(logits[i, : n - 1], ids[i, 1:n], reduction="sum")
            for i, (_, n) in enumerate(rows)
        )
    assert n_p == sum(n - 1 for _, n in rows)
    assert torch.allclose(loss_c, ref_c, rtol=1e-5) and torch.allclose(loss_p, ref_p, rtol=1e-5)


def test_prompt_loss_weight_trains_the_prompt_and_refuses_packing(tmp_path, model_dir):
    cfg = SFTConfig(
        lr=1e-2, max_steps=30, warmup_steps=2, batch_tokens=4096, ckpt_every=0, progress=False, prompt_loss_weight=1.0
    )
    train_sft(cfg, EXAMPLES, model_dir, tmp_path / "run")
    recs = [json.loads(ln) for ln in (tmp_path / "run/metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
    assert recs[-1]["prompt_loss"] < 0.5 * recs[0]["prompt_loss"]  # the prompt text is learned too
    with pytest.raises(ValueError, match="packing"):
        train_sft(cfg.model_copy(update={"packing": True}), EXAMPLES, model_dir, tmp_path / "run2")


def test_plan_epoch_is_a_seeded_bucketed_permutation():
    lengths = [5, 300, 40, 41, 290, 7, 100, 120, 6, 305]
    a = plan_epoch(lengths, 600, seed=1, epoch=0)
    assert sorted(i for b in a for i in b) == list(range(10))
    assert all(len(b) * max(lengths[i] for i in b) <= 600 or len(b) == 1 for b in a)
    assert a == plan_epoch(lengths, 600, seed=1, epoch=0) and a != plan_epoch(lengths, 600, seed=1, epoch=1)


def test_sft_overfits_and_policy_reproduces_the_actions(tmp_path, model_dir):
    path = tmp_path / "ex.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    cfg = SFTConfig(
        lr=1e-2, max_steps=120, warmup_steps=5, batch_tokens=4096, ckpt_every=0, progress=False, weight_decay=0.0
    )
    final = train_sft(cfg, path, model_dir, tmp_path / "run", eval_examples=EXAMPLES)
    recs = [json.loads(ln) for ln in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r]
    assert len(steps) == 120 and steps[0]["loss"] > 3.0 and steps[-1]["loss"] < 0.05
    assert {"step", "loss", "lr", "grad_norm", "tok_per_s", "tokens"} <= set(steps[0])
    assert recs[-1]["eval_loss"] < 0.05
    assert json.loads((final / "sft_state.json").read_text())["complete"] is True
    pol = LocalHFPolicy(final, max_new_tokens=48)
    reqs = [
        PolicyRequest(messages=e["messages"], episode_id=f"e{i}", turn=0, admissible_commands=t[2])
        for i, (e, t) in enumerate(zip(EXAMPLES, TASKS))
    ]
    outs = pol.act(reqs)
    assert [c.text for c in outs] == [e["completion"] for e in EXAMPLES]
    assert all(c.finish_reason == "stop" for c in outs)
    assert load_examples(path) == EXAMPLES


def test_sft_mirrors_its_metrics_to_tensorboard(tmp_path, model_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = SFTConfig(lr=1e-2, max_steps=3, warmup_steps=1, ckpt_every=0, progress=False, tracking="tensorboard")
    train_sft(cfg, EXAMPLES, model_dir, tmp_path / "run")
    recs = [json.loads(ln) for ln in (tmp_path / "run/metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("loss")} == pytest.approx({r["step"]: r["loss"] for r in recs})
