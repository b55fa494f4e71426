"""Issue 10 fault 1: whatever the compute dtype, the optimizer updates fp32 master weights.

A micro Qwen3 model plays real ALFWorld games (constrained decoding); the same
GRPO samples then train three copies of it for 5 steps at lr 1e-6 (Table 4):

- fp32: fp32 weights, fp32 compute (the reference);
- bf16 as configured (``dtype = "bfloat16"``): fp32 master weights, bf16 autocast;
- pure bf16 weights (the old code path), built by hand for contrast.

Tolerance: the bf16-configured update equals the fp32 update to 15% relative L2
error (measured 5.6% after 10 steps) and changes >= 99% of the weights the fp32
update changes (over 90% of all: the rest are embedding rows of tokens the
samples never show); pure bf16 weights change under 10% of their entries
(measured 2%).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from evoharness.config.rl import GRPOConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import load_model
from evoharness.policies.local import LocalHFPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.grpo import TokenMasks, microbatch_loss
from evoharness.train.precision import autocast, check_master_weights
from evoharness.train.step import plan_updates, run_updates, set_token_weights, turn_rows
from evoharness.train.trainer import Trainer

STEPS, LR = 5, 1e-6


@pytest.fixture(scope="module")
def samples_and_masks(model_dir):
    policy = LocalHFPolicy(
        model_dir, temperature=1.0, constrained=True, max_new_tokens=16, max_prompt_tokens=512, num_threads=1, seed=2
    )
    store = ExperienceStore()
    store.freeze()
    task = discover_games("train")[0]
    trajs = run_episodes(
        [EpisodeSpec(task, f"{task.task_id}#{k}", 0) for k in range(2)],
        lambda t: make_env(t, engine="fast"),
        lambda: BPEHarness(store),
        policy,
        max_steps=2,
    )
    samples = [s for t, a in zip(trajs, (1.0, -1.0)) for s in turn_rows(t, [a] * t.steps, GRPOConfig(), 0, group=0)]
    return samples, policy.tokenizer, TokenMasks(policy.tokenizer, policy.model.get_output_embeddings().weight.shape[0])


CFG = GRPOConfig(lr=LR, kl_beta=0.0, micro_batch_size=32)


def _delta(model, start) -> torch.Tensor:
    return torch.cat([(v.detach().float() - start[k]).flatten() for k, v in model.state_dict().items()])


def _update(model, samples, tokenizer, amp=None):
    """`STEPS` RL steps of a `Trainer` (fp32 masters; `amp`: bf16 autocast compute) on `samples`."""
    start = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, tokenizer, CFG, **({"amp": amp} if amp else {}))
    for step in range(STEPS):
        run_updates(trainer, plan_updates(samples, CFG), LR, step)
    return _delta(model, start)


def _pure_bf16_update(model, samples, masks):
    """The old code path the trainer refuses: the same steps with AdamW on bf16 weights."""
    start = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for _ in range(STEPS):
        set_token_weights(samples)
        loss, _ = microbatch_loss(model, samples, CFG, masks=masks)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CFG.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _delta(model, start)


def test_bf16_compute_moves_fp32_master_weights_like_fp32(model_dir, samples_and_masks):
    samples, tokenizer, masks = samples_and_masks
    assert len(samples) <= CFG.micro_batch_size  # one micro-batch, as the pure-bf16 contrast takes
    base = load_model(model_dir).train()
    ref = _update(copy.deepcopy(base), samples, tokenizer)
    amp = _update(copy.deepcopy(base), samples, tokenizer, amp=lambda: autocast("cpu", torch.bfloat16))
    # most weights move (embedding rows of tokens the samples never show get no gradient), and the
    # bf16-configured update moves the same ones
    moved = ref != 0
    assert moved.float().mean() > 0.9 and (amp[moved] != 0).float().mean() > 0.99
    assert float((amp - ref).norm() / ref.norm()) < 0.15

    pure = copy.deepcopy(base).to(torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 master weights"):
        Trainer(pure, tokenizer, CFG)
    old = _pure_bf16_update(pure, samples, masks)
    assert (old != 0).float().mean() < 0.10  # the fault: most updates round away in bf16


def test_rl_in_bf16_keeps_fp32_weights_and_optimizer_state(model_dir, tmp_path):
    from evoharness.config.rl import RLConfig
    from evoharness.recipes.rl import train_rl

    cfg = RLConfig(
        model_path=str(model_dir),
        out_dir=str(tmp_path / "rl"),
        steps=1,
        max_steps=2,
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
        dtype="bfloat16",
        ckpt_every=1,
    )
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 1, 1e-6
    final = train_rl(cfg, progress=False)
    from safetensors.torch import load_file

    weights = load_file(str(final / "model.safetensors"))
    assert {v.dtype for v in weights.values()} == {torch.float32}
    before = load_file(str(model_dir / "model.safetensors"))
    changed = sum(int((weights[k] != before[k]).sum()) for k in weights) / sum(v.numel() for v in weights.values())
    # a 1e-6 step lands on the fp32 weights (embedding rows of tokens the batch never saw get no
    # gradient; pure bf16 weights changed ~2%)
    assert changed > 0.5
    ckpt = tmp_path / "rl" / "checkpoints" / (tmp_path / "rl" / "checkpoints" / "latest").read_text().strip()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    moments = [t for st in state["optimizer"]["state"].values() for k, t in st.items() if k.startswith("exp_avg")]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert json.loads((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()[0])["train/n_tokens"] > 0


def test_sft_keeps_fp32_master_weights_under_bf16_autocast(model_dir, tmp_path):
    from evoharness.config.sft import SFTConfig
    from evoharness.train.sft import train_sft

    examples = [
        {
            "messages": [{"role": "user", "content": f"You are in room {i}. Find the apple."}],
            "completion": f"<think>look</think><action>go to countertop {i}</action>",
        }
        for i in range(1, 5)
    ]
    runs = {}
    for precision in ("fp32", "bf16_autocast"):
        cfg = SFTConfig(
            lr=1e-6, max_steps=3, warmup_steps=0, batch_tokens=4096, precision=precision, progress=False, ckpt_every=0
        )
        final = train_sft(cfg, examples, model_dir, tmp_path / precision)
        runs[precision] = load_model(final).state_dict()
        assert {v.dtype for v in runs[precision].values()} == {torch.float32}
    base = load_model(model_dir).state_dict()
    d32 = torch.cat([(runs["fp32"][k] - base[k]).flatten() for k in base])
    d16 = torch.cat([(runs["bf16_autocast"][k] - base[k]).flatten() for k in base])
    assert (d16 != 0).float().mean() > 0.9 and float((d16 - d32).norm() / d32.norm()) < 0.15
    with pytest.raises(ValueError):
        SFTConfig(precision="bf16")  # pure-bf16 weights are no longer an option
    with pytest.raises(ValueError, match="fp32"):
        check_master_weights(load_model(model_dir).to(torch.bfloat16))


def test_sft_gradient_accumulation_on_a_bf16_model_keeps_fp32_masters_and_exports_bf16(model_dir, tmp_path):
    """SFT of a bf16 checkpoint (as Qwen3-8B ships) with micro-batches (gradient accumulation):
    the master weights in the resumable checkpoint are fp32 and move at lr 1e-6 like a one-batch
    fp32 run (fp32 micro-batches: 1e-3 relative L2; bf16 autocast micro-batches: 15%, as above);
    the exported ``final/`` is bf16, the source's dtype (not an fp32 copy that doubles its size
    and that vLLM's dtype=auto would serve in float16)."""
    from safetensors.torch import load_file

    from evoharness.config.sft import SFTConfig
    from evoharness.models.init import load_tokenizer
    from evoharness.train.sft import split_micro, tokenize_examples, train_sft

    src = tmp_path / "bf16_src"
    load_model(model_dir).to(torch.bfloat16).save_pretrained(str(src))
    load_tokenizer(model_dir).save_pretrained(str(src))
    examples = [
        {
            "messages": [{"role": "user", "content": f"You are in room {i}. Find the apple." + " Look." * i}],
            "completion": f"<think>look</think><action>go to countertop {i}</action>",
        }
        for i in range(1, 7)
    ]
    rows = tokenize_examples(load_tokenizer(src), examples, 512, 64)
    assert len(split_micro(rows, 96)) >= 3  # the step really accumulates over micro-batches
    base = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    deltas = {}
    for name, precision, micro in [
        ("fp32", "fp32", None),
        ("fp32_micro", "fp32", 96),
        ("bf16_micro", "bf16_autocast", 96),
    ]:
        cfg = SFTConfig(
            lr=1e-6,
            max_steps=3,
            warmup_steps=0,
            batch_tokens=4096,
            micro_batch_tokens=micro,
            precision=precision,
            progress=False,
            ckpt_every=3,
        )
        final = train_sft(cfg, examples, src, tmp_path / name)
        masters = load_file(str(tmp_path / name / "checkpoints" / "step_0000003" / "model.safetensors"))
        assert {v.dtype for v in masters.values()} == {torch.float32}
        exported = load_file(str(final / "model.safetensors"))
        assert {v.dtype for v in exported.values()} == {torch.bfloat16}
        assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
        deltas[name] = torch.cat([(masters[k] - base[k]).flatten() for k in base])
    ref = deltas["fp32"]
    assert (ref != 0).float().mean() > 0.9
    assert float((deltas["fp32_micro"] - ref).norm() / ref.norm()) < 1e-3
    assert (deltas["bf16_micro"] != 0).float().mean() > 0.9
    assert float((deltas["bf16_micro"] - ref).norm() / ref.norm()) < 0.15


def test_rl_from_a_bf16_model_exports_bf16_and_checkpoints_fp32_masters(model_dir, tmp_path):
    from safetensors.torch import load_file

    from evoharness.config.rl import RLConfig
    from evoharness.models.init import load_tokenizer
    from evoharness.recipes.rl import train_rl

    src = tmp_path / "bf16_src"
    load_model(model_dir).to(torch.bfloat16).save_pretrained(str(src))
    load_tokenizer(model_dir).save_pretrained(str(src))
    cfg = RLConfig(
        model_path=str(src),
        out_dir=str(tmp_path / "rl"),
        steps=1,
        max_steps=2,
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
        ckpt_every=1,
    )
    cfg.grpo.group_size, cfg.grpo.prompts_per_step = 2, 1
    final = train_rl(cfg, progress=False)
    assert {v.dtype for v in load_file(str(final / "model.safetensors")).values()} == {torch.bfloat16}
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    ckpt = tmp_path / "rl" / "checkpoints" / "step_0000001" / "model.safetensors"
    assert {v.dtype for v in load_file(str(ckpt)).values()} == {torch.float32}
