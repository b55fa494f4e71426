"""`train.step`: the pieces of one RL step that do not depend on where it runs (streamed
micro-batches against the whole batch's update, ranks and updates merged into one record) and
the reward budget an RL config resolves. A tiny randomly initialised Qwen3 (fp32, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from evoharness.config.rl import GRPOConfig, RLConfig
from evoharness.train.grpo import TurnSample, logprobs_of
from evoharness.train.step import merged_update_metrics, plan_updates, run_updates, stream_scale, streamed_rows, streams
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


# executions of one step: (episode, group, [(prompt, completion, advantage), ...]); "d" ended in an
# environment error and has no rows, but is one of the step's N = 4 executions (M = 3 train)
EXECUTIONS = [
    ("a", 0, [([1, 2, 3, 4], [10, 11, 12], 1.0), ([1, 2, 3, 4, 5, 6], [13, 14], 0.5)]),
    ("b", 0, [([1, 2, 3, 4], [20, 21, 22, 23, 24], -1.5)]),
    ("c", 1, [([7, 8], [30], 2.0), ([7, 8, 9], [31, 32, 33], -0.25), ([7, 8, 9, 40], [34, 35], 0.75)]),
]
N = 4


def rows_of(model, episode: str) -> list[TurnSample]:
    """The execution's rows; behaviour log-probs a little off the model's (ratios leave 1)."""
    out = []
    for e, g, spec in EXECUTIONS:
        if e != episode:
            continue
        for p, c, a in spec:
            with torch.no_grad():
                lp = logprobs_of(model, [p], [c])[0].tolist()
            out.append(TurnSample(p, c, [x + 0.2 * ((k % 3) - 1) for k, x in enumerate(lp)], a, e, group=g))
    return out


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_streamed_rows_give_the_whole_batch_gradient():
    """Micro-batches of whole executions trained as they finish, weighted 1/(N·N_j) with N all of
    the step's executions, times N/M once M (those with rows) is known, are the gradient and the
    loss of the whole batch's one update (weights 1/(M·N_j))."""
    cfg = GRPOConfig(kl_beta=0.05, entropy_coef=0.01, micro_batch_size=2)
    assert streams(cfg) and not streams(cfg.model_copy(update={"mini_batches": 2}))
    assert not streams(cfg.model_copy(update={"epochs": 2}))
    base, ref = tiny_model(), tiny_model(seed=1)

    whole_model = copy.deepcopy(base)
    whole = Trainer(whole_model, range(VOCAB), cfg, ref_model=ref)
    rows = [r for e in "abcd" for r in rows_of(base, e)]
    (update,) = plan_updates(rows, cfg)
    n_tok = {"a": 5, "b": 5, "c": 6}
    assert [r.weight for r in update] == pytest.approx([1 / (3 * n_tok[r.episode_id]) for r in update])
    want_stats = whole.accumulate(update)
    want = _grads(whole_model)

    stream_model = copy.deepcopy(base)
    streamed = Trainer(stream_model, range(VOCAB), cfg, ref_model=ref)
    micro = []
    for finished in (["c"], ["a", "d"], ["b"]):  # in the order executions finish
        mb = streamed_rows([r for e in finished for r in rows_of(base, e)], N)
        assert [r.weight for r in mb] == pytest.approx([1 / (N * n_tok[r.episode_id]) for r in mb])
        micro.append(streamed.accumulate(mb))
    scale = stream_scale(N, 3)
    assert scale == pytest.approx(4 / 3) and stream_scale(N, 0) == 1.0
    torch.testing.assert_close(_grads(stream_model) * scale, want, rtol=1e-5, atol=1e-7)

    # the step's update and its metrics: `run_updates` without rows applies the streamed gradient
    lr = 1e-3
    runs_whole = run_updates(whole, [], lr, step=0)  # the accumulated gradient, as it stands
    runs_stream = run_updates(streamed, [], lr, step=0, scale=scale)
    assert runs_stream[0]["grad_norm"] == pytest.approx(runs_whole[0]["grad_norm"], rel=1e-5)
    # AdamW's first step is lr * g / (|g| + eps): where a gradient is near eps (1e-8) the float
    # noise of another summation order (within the atol above) moves the step by a fraction of lr
    # (1.5e-3 lr seen on an AMD EPYC), so the weights agree to 1% of lr, the gradients exactly above
    for p, q in zip(whole_model.parameters(), stream_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-2 * lr)
    got = merged_update_metrics(micro, [runs_stream], scale)
    exp = merged_update_metrics([want_stats], [runs_whole], 1.0)
    assert got.keys() == exp.keys()
    for k in got:
        assert got[k] == pytest.approx(exp[k], rel=1e-5, abs=1e-8), k
    assert got["train/n_tokens"] == 16 and got["train/updates"] == 1 and got["train/lr"] == lr


def test_a_planned_step_runs_the_same_update_as_streamed_rows():
    """`run_updates` with the planned update (mini_batches = epochs = 1) reaches the weights of the
    streamed run (SGD: Adam's g/sqrt(v) would blow float noise in near-zero gradients up to a
    full step)."""
    cfg = GRPOConfig(kl_beta=0.0, lr=1.0)
    base = tiny_model()
    rows = [r for e in "abcd" for r in rows_of(base, e)]

    def sgd_trainer(model):
        t = Trainer(model, range(VOCAB), cfg)
        t.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        return t

    planned_model, stream_model = copy.deepcopy(base), copy.deepcopy(base)
    planned = run_updates(sgd_trainer(planned_model), plan_updates(rows, cfg), cfg.lr, step=0)
    streamed = sgd_trainer(stream_model)
    micro = [
        streamed.accumulate(streamed_rows([r for e in es for r in rows_of(base, e)], N))
        for es in (["a", "b"], ["c", "d"])
    ]
    runs = run_updates(streamed, [], cfg.lr, step=0, scale=stream_scale(N, 3))
    with torch.no_grad():
        moved = max(float((p - q).abs().max()) for p, q in zip(planned_model.parameters(), base.parameters()))
        assert moved > 1e-3
        for p, q in zip(planned_model.parameters(), stream_model.parameters()):
            assert float((p - q).abs().max()) < 1e-4 * moved
    a = merged_update_metrics([], [planned])
    b = merged_update_metrics(micro, [runs], stream_scale(N, 3))
    for k in ("train/loss", "train/pg_loss", "train/grad_norm", "train/ratio_mean", "train/clip_fraction"):
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-8), k


def test_ranks_add_up_within_an_update_and_updates_average():
    """Two train ranks, two updates: a rank's share of an update sums with the other's; the step's
    record averages the updates' losses and grad norms and sums their tokens."""
    cfg = GRPOConfig(kl_beta=0.0, mini_batches=2, lr=1e-3)
    base = tiny_model()
    rows = [r for e in "abcd" for r in rows_of(base, e)]
    updates = plan_updates(rows, cfg)
    assert [{r.group for r in u} for u in updates] == [{0}, {1}]
    one = Trainer(copy.deepcopy(base), range(VOCAB), cfg)
    whole = [one.accumulate(u) for u in updates]
    for _ in updates:
        one.model.zero_grad(set_to_none=True)
    ranks = [
        [{**one.accumulate(u[r::2]), "grad_norm": 1.0 + j, "lr": cfg.lr} for j, u in enumerate(updates)]
        for r in range(2)
    ]
    m = merged_update_metrics([], ranks)
    assert m["train/updates"] == 2 and m["train/n_tokens"] == 16
    assert m["train/loss"] == pytest.approx(sum(w["loss"] for w in whole) / 2, rel=1e-5)
    assert m["train/grad_norm"] == 1.5  # taken once per update, then averaged
    assert m["train/ratio_max"] == pytest.approx(max(w["ratio_max"] for w in whole))


# ---- the reward's step budget (RLConfig `_one_episode_budget`, `train.rewards.trajectory_reward`) ------


def _won(steps: int, max_steps: int):
    from evoharness.rollout.records import Trajectory, TurnRecord

    turns = [
        TurnRecord(turn=i, messages=[], completion="", kind="env", action="look", feedback="") for i in range(steps)
    ]
    return Trajectory(
        episode_id="t#0",
        task_id="t",
        task_type="pick_and_place_simple",
        split="train",
        harness="bpe",
        policy="p",
        turns=turns,
        won=True,
        stop_reason="won",
        max_steps=max_steps,
    )


def test_reward_t_max_unset_is_each_episodes_own_step_cap():
    """Unset (the default), T_max of the efficiency term is the cap the episode ran under: a run's
    max_steps (or its step_caps mix); set, it must be max_steps."""
    from evoharness.train.rewards import trajectory_reward

    cfg = RLConfig(max_steps=30)
    assert cfg.grpo.reward.t_max is None and GRPOConfig().reward.t_max is None
    r = cfg.grpo.reward
    assert trajectory_reward(_won(6, 30), 0, r).efficiency == pytest.approx(1 - 6 / 30)
    assert trajectory_reward(_won(6, 12), 0, r).efficiency == pytest.approx(1 - 6 / 12)  # a step_caps episode
    assert RLConfig(max_steps=30, step_caps=[12, 30]).grpo.reward.t_max is None
    same = RLConfig(max_steps=30, grpo={"reward": {"t_max": 30}})
    assert trajectory_reward(_won(6, 30), 0, same.grpo.reward) == trajectory_reward(_won(6, 30), 0, r)
    with pytest.raises(ValueError, match="no step budget"):
        trajectory_reward(_won(6, 0), 0, r)


def test_reward_t_max_other_than_the_step_cap_is_refused():
    with pytest.raises(ValueError, match=r"grpo\.reward\.t_max \(50\) must equal max_steps \(30\)"):
        RLConfig(max_steps=30, grpo={"reward": {"t_max": 50}})
    with pytest.raises(ValueError, match=r"t_max \(20\) must equal max_steps \(70\)"):
        RLConfig(grpo={"reward": {"t_max": 20}})
    with pytest.raises(ValueError, match="step_caps"):  # one T_max cannot be every episode's cap
        RLConfig(max_steps=30, step_caps=[12, 30], grpo={"reward": {"t_max": 30}})
