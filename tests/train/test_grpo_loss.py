"""GRPO loss on real forward passes of a tiny randomly initialised Qwen3 (fp32, CPU)."""

import copy

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from evoharness.config.rl import GRPOConfig
from evoharness.rollout.records import Trajectory, TurnRecord
from evoharness.train.grpo import TurnSample, logprobs_of, microbatch_loss
from evoharness.train.step import (
    mini_batch_slices,
    plan_updates,
    run_updates,
    set_token_weights,
    step_stats,
    turn_rows,
    update_metrics,
)
from evoharness.train.trainer import Trainer

VOCAB = 64


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(cfg).float()


def trainer(model, cfg: GRPOConfig, **kw) -> Trainer:
    """A `Trainer` of the tiny model; its "tokenizer" has every output row (nothing masked)."""
    return Trainer(model, range(VOCAB), cfg, **kw)


def step(model, samples, cfg: GRPOConfig, **kw) -> tuple[dict, Trainer]:
    """One RL step (`plan_updates` + `run_updates`) on a fresh trainer: its ``train/*`` metrics and the trainer."""
    t = trainer(model, cfg, **kw)
    runs = run_updates(t, plan_updates(samples, cfg), cfg.lr, step=0)
    return update_metrics(step_stats(runs)), t


def behaviour(model, prompt, comp, temperature=1.0) -> list[float]:
    with torch.no_grad():
        return logprobs_of(model, [prompt], [comp], temperature)[0, : len(comp)].tolist()


def samples_for(model, spec, temperature=1.0) -> list[TurnSample]:
    """spec: (prompt, completion, advantage, episode_id)."""
    return [TurnSample(p, c, behaviour(model, p, c, temperature), a, e) for p, c, a, e in spec]


SPEC = [
    ([1, 2, 3, 4, 5], [10, 11, 12], 1.0, "a"),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], [20, 21], 1.0, "a"),
    ([7, 7], [30, 31, 32, 33, 34], -0.5, "b"),
    ([9, 8, 7, 6], [40], 2.0, "c"),
]


def test_logprobs_of_matches_full_forward_and_ignores_padding():
    model = tiny_model()
    p, c = [1, 2, 3, 4], [5, 6, 7]
    alone = logprobs_of(model, [p], [c])
    batched = logprobs_of(model, [p, list(range(1, 20))], [c, [8] * 9])
    assert alone.shape == (1, 3) and batched.shape == (2, 9)
    assert torch.allclose(alone[0], batched[0, :3], atol=1e-5)
    assert torch.equal(batched[0, 3:], torch.zeros(6))
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([p + c])).logits[0], -1)
    ref = torch.stack([full[3 + j, c[j]] for j in range(3)])
    assert torch.allclose(alone[0], ref, atol=1e-5)
    t2 = logprobs_of(model, [p], [c], temperature=2.0)
    ref2 = torch.log_softmax(model(torch.tensor([p + c])).logits[0, 3:6] / 2.0, -1)
    assert torch.allclose(t2[0], ref2.gather(-1, torch.tensor(c)[:, None])[:, 0], atol=1e-5)


def test_one_update_moves_bandit_towards_positive_completion():
    """One step of rows without GRPO group ids (one mini-batch needs none)."""
    model = tiny_model()
    ref = copy.deepcopy(model).eval()
    prompt, good, bad = [1, 2, 3, 4, 5], [10, 11, 12, 13], [20, 21, 22, 23]
    samples = samples_for(model, [(prompt, good, 1.0, "g"), (prompt, bad, -1.0, "b")])
    before = logprobs_of(model, [prompt, prompt], [good, bad]).detach().sum(-1)
    m, _ = step(model, samples, GRPOConfig(lr=1e-2), ref_model=ref)
    after = logprobs_of(model, [prompt, prompt], [good, bad]).detach().sum(-1)
    assert after[0] > before[0] + 0.1
    assert after[1] < before[1] - 0.1
    assert m["train/n_tokens"] == 8 and m["train/kl"] == 0.0 and m["train/clip_fraction"] == 0.0
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["train/grad_norm"] > 0
    assert m["train/pg_loss"] == pytest.approx(0.0, abs=1e-6)  # ratio 1: -(+1 - 1)/2
    assert m["train/entropy"] > 0 and m["train/updates"] == 1 and m["train/lr"] == 1e-2


def test_trainer_refuses_kl_without_a_reference_and_bf16_masters():
    with pytest.raises(ValueError, match="reference"):
        trainer(tiny_model(), GRPOConfig(kl_beta=0.01))
    with pytest.raises(ValueError, match="fp32 master weights"):
        trainer(tiny_model().to(torch.bfloat16), GRPOConfig(kl_beta=0.0))


def _tight_clip_step(model, samples, updates: int, **grpo) -> dict:
    """One step at a large lr and a 1% clip, checking it took `updates` AdamW steps."""
    cfg = GRPOConfig(lr=1e-1, kl_beta=0.0, clip_low=0.01, clip_high=0.01, **grpo)
    m, t = step(model, samples, cfg)
    assert m["train/updates"] == updates and all(st["step"] == updates for st in t.optimizer.state.values())
    return m


def _grouped(samples, group_size: int) -> list[TurnSample]:
    for i, s in enumerate(samples):
        s.group = i // group_size
    return samples


def test_mini_batches_take_one_step_per_slice_and_the_clip_acts_after_the_first():
    model = tiny_model()
    prompt = [1, 2, 3, 4, 5]
    spec = [(prompt, [10 + i, 11, 12], a, f"e{i}") for i, a in enumerate([1.0, -1.0, 1.0, -1.0])]
    samples = _grouped(samples_for(model, spec), 2)
    single, _ = step(copy.deepcopy(model), samples, GRPOConfig(lr=1e-1, kl_beta=0.0))
    assert single["train/updates"] == 1 and single["train/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    m = _tight_clip_step(model, samples, updates=2, mini_batches=2)
    assert m["train/n_tokens"] == 12
    # slice 2 is scored by the policy slice 1 moved: ratios leave 1 and the tight clip bites
    assert m["train/ratio_max"] > 1.0 + 1e-3 and m["train/clip_fraction"] > 0
    # more slices than groups: one step per group
    few, _ = step(copy.deepcopy(model), samples, GRPOConfig(kl_beta=0.0, lr=1e-3, mini_batches=5))
    assert few["train/updates"] == 2


def test_mini_batch_slices_keep_groups_whole_and_weight_each_slice():
    model = tiny_model()
    spec = [([1, 2, 3], [10 + i] * (1 + i), 1.0, f"e{i}") for i in range(5)]
    rows = samples_for(model, spec)
    # one mini-batch: every row, group ids or not
    assert mini_batch_slices(rows, 1) == [rows]
    with pytest.raises(ValueError, match="group"):
        mini_batch_slices(rows, 2)
    for s, g in zip(rows, [7, 3, 7, 5, 3]):
        s.group = g
    slices = mini_batch_slices(rows, 2)  # groups 7, 3, 5 in order of first appearance, dealt round-robin
    assert [[s.episode_id for s in sl] for sl in slices] == [["e0", "e2", "e3"], ["e1", "e4"]]
    updates = plan_updates(rows, GRPOConfig(mini_batches=2, epochs=2))
    assert [[s.episode_id for s in u] for u in updates] == [["e0", "e2", "e3"], ["e1", "e4"]] * 2
    # token weights 1/(M·N_j) over each slice: M = 3 and 2 executions
    assert [s.weight for s in updates[0]] == pytest.approx([1 / (3 * 1), 1 / (3 * 3), 1 / (3 * 4)])
    assert [s.weight for s in updates[1]] == pytest.approx([1 / (2 * 2), 1 / (2 * 5)])
    assert plan_updates([], GRPOConfig()) == []


def test_epochs_repeat_the_slices_and_the_clip_acts_on_the_second_pass():
    model = tiny_model()
    prompt = [1, 2, 3, 4, 5]
    samples = samples_for(model, [(prompt, [10, 11, 12], 1.0, "a"), (prompt, [20, 21, 22], -1.0, "b")])
    m = _tight_clip_step(model, samples, updates=3, epochs=3)
    assert m["train/n_tokens"] == 18
    assert m["train/ratio_max"] > 1.0 + 1e-3 and m["train/clip_fraction"] > 0


class _Anchor:
    """An SFT anchor (`train.sft_anchor.SFTAnchor`'s interface): update j of step `step` adds the
    gradient of the completion NLL of `target` and logs (step, j)."""

    def __init__(self, target):
        self.target, self.calls = target, []

    def for_step(self, model, step, amp=None):
        def anchor(j):
            self.calls.append((step, j))
            logp = logprobs_of(model, *self.target)
            (-logp.sum()).backward()
            return {"anchor_nll": float(-logp.detach().sum())}

        return anchor


def test_an_anchor_adds_its_gradient_to_every_update_before_the_clip():
    model = tiny_model()
    samples = _grouped(samples_for(model, [([1, 2, 3], [10, 11], 0.0, "a"), ([1, 2, 3], [20, 21], 0.0, "b")]), 1)
    target = ([[1, 2, 3]], [[30, 31]])
    anchor = _Anchor(target)
    before = float(logprobs_of(model, *target).detach().sum())
    cfg = GRPOConfig(lr=1e-2, kl_beta=0.0, mini_batches=2)
    t = trainer(model, cfg, anchor=anchor)
    runs = run_updates(t, plan_updates(samples, cfg), cfg.lr, step=4)
    m = update_metrics(step_stats(runs))
    # advantages are 0: each update is the anchor's alone
    assert anchor.calls == [(4, 0), (4, 1)] and m["train/updates"] == 2 and m["train/grad_norm"] > 0
    assert "train/anchor_nll" in m
    assert float(logprobs_of(model, *target).detach().sum()) > before + 0.05


def test_no_gradient_reaches_prompt_or_padding_positions():
    model = tiny_model()
    ref = tiny_model(seed=1)  # differs: KL term active
    samples = samples_for(model, SPEC)
    for s in samples:
        s.logprobs = [x - 0.1 for x in s.logprobs]  # ratio != 1
    set_token_weights(samples)
    grabbed = {}

    def hook(_module, _inp, out):
        out.retain_grad()
        grabbed["h"] = out

    handle = model.model.norm.register_forward_hook(hook)
    cfg = GRPOConfig(kl_beta=0.1, entropy_coef=0.05)
    loss, _ = microbatch_loss(model, samples, cfg, ref_model=ref)
    handle.remove()
    loss.backward()
    g = grabbed["h"].grad.abs().sum(-1)  # [B, L]: gradient at each position's final hidden state
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        predicts = torch.zeros(g.shape[1], dtype=torch.bool)
        predicts[p - 1 : p + c - 1] = True  # positions whose logits predict completion tokens
        assert torch.all(g[i, ~predicts] == 0.0)
        assert torch.all(g[i, predicts] > 0.0)


def test_kl_zero_at_reference_positive_otherwise():
    model = tiny_model()
    samples = samples_for(model, SPEC)
    set_token_weights(samples)
    cfg = GRPOConfig(kl_beta=0.01)
    _, st = microbatch_loss(model, samples, cfg, ref_model=copy.deepcopy(model))
    assert st["kl"] == 0.0
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.add_(0.05 * torch.randn_like(other.lm_head.weight))
    _, st = microbatch_loss(model, samples, cfg, ref_model=other)
    assert st["kl"] > 0.0

    class Boom(torch.nn.Module):
        def forward(self, *a, **k):
            raise AssertionError("reference model must not run when kl_beta == 0")

    _, st = microbatch_loss(model, samples, GRPOConfig(kl_beta=0.0), ref_model=Boom())
    assert st["kl"] == 0.0


def test_token_mean_per_trajectory_then_mean_over_trajectories():
    model = tiny_model()
    samples = samples_for(model, SPEC)
    set_token_weights(samples)
    # a: 3 + 2 tokens, b: 5, c: 1; M = 3 trajectories.
    assert [s.weight for s in samples] == pytest.approx([1 / 15, 1 / 15, 1 / 15, 1 / 3])
    m = trainer(model, GRPOConfig(kl_beta=0.0)).accumulate(samples)
    # ratio == 1, so per-token pg = -A and L = -(1/M) Σ_j A_j
    assert m["loss"] == pytest.approx(-(1.0 - 0.5 + 2.0) / 3, abs=1e-5)
    assert m["n_tokens"] == 11
    # the gradient stays in .grad for `apply` (or a satellite's `gradients`)
    assert all(p.grad is not None for p in model.lm_head.parameters())


def test_micro_batch_size_does_not_change_loss_or_gradients():
    results = []
    for mbs in (4, 2, 1):
        model = tiny_model()
        ref = tiny_model(seed=1)
        samples = samples_for(model, SPEC)
        for s in samples:
            s.logprobs = [x + 0.3 * ((k % 3) - 1) for k, x in enumerate(s.logprobs)]  # some clipped tokens
        set_token_weights(samples)
        m = trainer(model, GRPOConfig(kl_beta=0.05, entropy_coef=0.01, micro_batch_size=mbs), ref_model=ref).accumulate(
            samples
        )
        results.append((m, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (m0, g0) = results[0]
    assert m0["n_clipped"] > 0
    for m, g in results[1:]:
        for k in ("loss", "pg_loss", "kl", "entropy", "n_clipped", "ratio_sum", "ratio_max", "n_tokens"):
            assert m[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k
        for n in g0:
            assert torch.allclose(g[n], g0[n], rtol=1e-4, atol=1e-7), n


def test_clip_stops_gradient_only_on_the_clipped_side():
    model = tiny_model()
    p, c = [1, 2, 3], [4, 5, 6]
    cfg = GRPOConfig(kl_beta=0.0)
    for adv, clipped in ((1.0, True), (-1.0, False)):
        model.zero_grad()
        s = TurnSample(p, c, [x - 1.0 for x in behaviour(model, p, c)], adv, "e")  # ratio = e > 1.2
        set_token_weights([s])
        loss, st = microbatch_loss(model, [s], cfg)
        loss.backward()
        gnorm = sum(float(q.grad.abs().sum()) for q in model.parameters() if q.grad is not None)
        assert st["n_clipped"] == (3 if clipped else 0)
        assert (gnorm == 0.0) == clipped
        assert st["ratio_max"] == pytest.approx(torch.e, rel=1e-4)


def _rec(i, prompt, comp, kind="env"):
    return TurnRecord(
        turn=i,
        messages=[],
        completion="x",
        kind=kind,
        action="look",
        feedback="",
        prompt_token_ids=prompt,
        completion_token_ids=comp,
        logprobs=[-1.0] * len(comp) if comp is not None else None,
    )


def _traj(turns, episode_id="task#0", **kw):
    return Trajectory(
        episode_id=episode_id,
        task_id="task",
        task_type="pick_and_place_simple",
        split="train",
        harness="bpe",
        policy="local",
        turns=turns,
        **kw,
    )


def test_turn_rows_from_trajectory_records():
    t = _traj([_rec(0, [1, 2], [3, 4]), _rec(1, [1, 2, 3], None), _rec(2, [5], [6], "invalid")])
    out = turn_rows(t, [0.5, 0.25, -0.5], GRPOConfig(), step=0, group=3)
    assert [(s.prompt_ids, s.completion_ids, s.advantage, s.episode_id, s.group) for s in out] == [
        ([1, 2], [3, 4], 0.5, "task#0", 3),
        ([5], [6], -0.5, "task#0", 3),
    ]
    # an episode an environment error ended trains nothing; a branch's replayed prefix is not drawn
    assert turn_rows(_traj(t.turns, stop_reason="error"), [0.5] * 3, GRPOConfig(), 0) == []
    replayed = _traj(t.turns, info={"replayed_turns": 1})
    assert [s.completion_ids for s in turn_rows(replayed, [0.5] * 3, GRPOConfig(), 0)] == [[6]]
    bad = _traj(
        [
            TurnRecord(
                turn=0,
                messages=[],
                completion="x",
                kind="env",
                action="look",
                feedback="",
                prompt_token_ids=[1],
                completion_token_ids=[2, 3],
                logprobs=[-1.0],
            )
        ]
    )
    with pytest.raises(ValueError, match="length mismatch"):
        turn_rows(bad, [1.0], GRPOConfig(), 0)


def test_turn_subsampling_is_bounded_and_seeded():
    turns = [
        TurnRecord(
            turn=i,
            messages=[],
            completion="x",
            kind="env",
            action="look",
            feedback="",
            prompt_token_ids=[1, 2],
            completion_token_ids=[3 + i],
            logprobs=[-0.5],
        )
        for i in range(10)
    ]
    traj = _traj(turns, episode_id="e#0")
    adv = [float(i) for i in range(10)]
    assert len(turn_rows(traj, adv, GRPOConfig(), step=1)) == 10
    capped = GRPOConfig(max_train_turns=3)
    a = turn_rows(traj, adv, capped, step=1)
    b = turn_rows(traj, adv, capped, step=1)
    assert len(a) == 3 and [s.completion_ids for s in a] == [s.completion_ids for s in b]
    # each kept turn keeps its own advantage, in turn order
    assert all(s.advantage == s.completion_ids[0] - 3 for s in a)
    assert [s.completion_ids[0] for s in a] == sorted(s.completion_ids[0] for s in a)
    draws = {tuple(s.completion_ids[0] for s in turn_rows(traj, adv, capped, step=k)) for k in range(8)}
    assert len(draws) > 1


def _grads(model) -> torch.Tensor:
    return torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])


def test_decoupled_ppo_equals_ppo_on_fresh_samples():
    """Samples from the weights being trained (π_behaviour = π_prox): the same loss and gradient."""
    out = {}
    for mode in ("ppo", "decoupled"):
        model = tiny_model()
        samples = samples_for(model, SPEC)
        set_token_weights(samples)
        loss, _ = microbatch_loss(model, samples, GRPOConfig(kl_beta=0.0, off_policy=mode))
        loss.backward()
        out[mode] = (float(loss.detach()), _grads(model))
    assert out["ppo"][0] == pytest.approx(out["decoupled"][0], rel=1e-6)
    torch.testing.assert_close(out["ppo"][1], out["decoupled"][1], rtol=1e-5, atol=1e-7)


def test_decoupled_ppo_keeps_stale_tokens_with_a_truncated_importance_weight():
    """A sample whose policy moved past the clip since it was sampled (ratio e to the behaviour
    policy): PPO drops its gradient, decoupled PPO trains it with weight min(e, c) times the
    on-policy gradient (AReaL Eq. 5, truncated IS)."""
    p, c = [1, 2, 3], [4, 5, 6]
    grads = {}
    for mode, cap, shift in (
        ("ppo", 2.0, 1.0),
        ("decoupled", 2.0, 1.0),
        ("decoupled", 10.0, 1.0),
        ("decoupled", 2.0, 0.0),
    ):
        model = tiny_model()
        s = TurnSample(p, c, [x - shift for x in behaviour(model, p, c)], 1.0, "e")
        set_token_weights([s])
        loss, st = microbatch_loss(model, [s], GRPOConfig(kl_beta=0.0, off_policy=mode, behaviour_weight_cap=cap))
        loss.backward()
        grads[(mode, cap, shift)] = _grads(model)
        assert st["ratio_max"] == pytest.approx(torch.e**shift, rel=1e-4)
        # the weight e hits the cap 2 (not 10); PPO caps nothing
        assert st["n_capped"] == (3 if (mode, cap, shift) == ("decoupled", 2.0, 1.0) else 0)
    fresh = grads[("decoupled", 2.0, 0.0)]
    assert float(grads[("ppo", 2.0, 1.0)].abs().sum()) == 0.0
    torch.testing.assert_close(grads[("decoupled", 2.0, 1.0)], 2.0 * fresh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[("decoupled", 10.0, 1.0)], torch.e * fresh, rtol=1e-4, atol=1e-6)


def test_decoupled_ppo_takes_several_updates_and_auto_resolves_by_staleness():
    from evoharness.config.rl import resolved_off_policy

    # several updates per step record π_prox first (`Trainer.prepare`; tests/train/test_trainer.py)
    assert GRPOConfig(off_policy="decoupled", mini_batches=2, epochs=2).mini_batches == 2
    g = GRPOConfig()
    assert g.off_policy == "auto"
    assert resolved_off_policy(g, stale=True).off_policy == "decoupled"
    assert resolved_off_policy(g, stale=False).off_policy == "ppo"
    assert resolved_off_policy(GRPOConfig(off_policy="ppo"), stale=True).off_policy == "ppo"
