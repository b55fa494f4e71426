"""`train.trainer.Trainer` on a real micro Qwen3 and real ALFWorld BPE episodes the model played
itself (constrained decoding, fp32): tree-packed rows give the turn rows' loss statistics and
gradient, also where rows repeat or share positions of each other's completions
(`rollout.tree.TreeNode.claims`); decoupled PPO over several updates records π_prox first."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from evoharness.config.rl import GRPOConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import load_model
from evoharness.policies.local import LocalHFPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.grpo import TokenMasks, TurnSample, logprobs_of
from evoharness.train.packing import linear_cost, pack_trees
from evoharness.train.step import plan_updates, run_updates, set_token_weights, step_stats, turn_rows, update_metrics
from evoharness.train.trainer import Trainer
from evoharness.train.tree_loss import row_trees


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def played(model_dir):
    """Four real BPE episodes (3 turns each) sampled from the micro model at T=1 under the action
    grammar: games 0, 1, 2 and game 0 again (its first prompt is game 0's, its answer another)."""
    policy = LocalHFPolicy(
        model_dir, temperature=1.0, max_new_tokens=16, max_prompt_tokens=4096, seed=1, constrained=True, num_threads=1
    )
    tasks = discover_games("valid_seen")[:3]
    specs = [EpisodeSpec(t, f"{t.task_id}#0", seed=i) for i, t in enumerate(tasks)]
    specs.append(EpisodeSpec(tasks[0], f"{tasks[0].task_id}#1", seed=0))
    trajs = run_episodes(
        specs, lambda t: make_env(t, engine="fast"), lambda: BPEHarness(ExperienceStore()), policy, max_steps=3
    )
    assert all(len(t.turns) == 3 and all(x.completion_token_ids for x in t.turns) for t in trajs)
    return trajs, policy.tokenizer, policy.model


def _turn(t, k: int, **change):
    return dataclasses.replace(copy.deepcopy(t), turn=k, **change)


def step_rows(played, shift: float = 0.25) -> list:
    """The rows of one step (`train.step.turn_rows`) of four executions in two GRPO groups:

    - game 0's episode with four extra turns: turn 1 again (the same prompt and completion:
      an agent that repeats itself), the other game-0 episode's first turn (the same prompt, an
      answer that starts alike and diverges), turn 2 cut short (an answer ending inside
      another), and a continuation of turn 0 (a prompt that holds the first tokens of turn
      0's answer, a completion that re-generates the rest at the same positions, unconstrained,
      with its behaviour log-probs as an unconstrained sampler records them);
    - the other game-0 episode, in the same group;
    - game 1's episode, and game 2's ended by an environment error (no rows), in group 1.

    Behaviour log-probs are moved off the policy's by up to ±`shift` per token (differently in
    each turn, so rows that share a token keep their own), so ratios leave 1 and the clip acts.
    """
    trajs, tokenizer, model = played
    t0, t1, t2, t3 = copy.deepcopy(trajs)
    a, b, c = t0.turns
    assert t3.turns[0].prompt_token_ids == a.prompt_token_ids
    assert t3.turns[0].completion_token_ids != a.completion_token_ids
    assert t3.turns[0].completion_token_ids[0] == a.completion_token_ids[0]  # "<think>": forced first
    k = len(c.completion_token_ids) // 2
    j = 3
    prompt, comp = a.prompt_token_ids + a.completion_token_ids[:j], a.completion_token_ids[j:]
    allowed = TokenMasks(tokenizer, model.get_output_embeddings().weight.shape[0])(
        [TurnSample(prompt, comp, [0.0] * len(comp), 0.0, "")], len(comp), torch.device("cpu")
    )
    with torch.no_grad():
        free = logprobs_of(model, [prompt], [comp], 1.0, allowed)[0].tolist()
    t0.turns += [
        _turn(b, 3),
        _turn(t3.turns[0], 4),
        _turn(c, 5, completion_token_ids=c.completion_token_ids[:k], logprobs=c.logprobs[:k]),
        _turn(a, 6, prompt_token_ids=prompt, completion_token_ids=comp, logprobs=free, constraint=None),
    ]
    t2.stop_reason = "error"
    for traj in (t0, t1, t2, t3):
        for n, turn in enumerate(traj.turns):
            turn.logprobs = [x + shift * ((i + n) % 3 - 1) for i, x in enumerate(turn.logprobs)]
    adv = {
        id(t0): [1.0, -0.5, 0.3, 0.8, -1.2, 0.6, 0.4],
        id(t3): [-0.7] * 3,
        id(t1): [0.9, 0.2, -0.1],
        id(t2): [0.0] * 3,
    }
    assert turn_rows(t2, adv[id(t2)], GRPOConfig(), 0) == []
    return [
        r
        for traj, g in ((t0, 0), (t3, 0), (t1, 1), (t2, 1))
        for r in turn_rows(traj, adv[id(traj)], GRPOConfig(), 0, group=g)
    ]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(a, b, rtol=1e-5):
    """Each tensor within `rtol` of the largest entry of its reference."""
    assert a.keys() == b.keys() and a
    for n in a:
        scale = b[n].abs().max().clamp(min=1e-8)
        assert float((a[n] - b[n]).abs().max() / scale) < rtol, n


COUNTS = ("n_tokens", "n_clipped", "n_capped", "n_forced")
SUMS = ("loss", "pg_loss", "kl", "entropy", "ratio_sum", "ratio_max")


def test_the_rows_repeat_and_share_completion_positions(played):
    rows = step_rows(played)
    assert len(rows) == 7 + 3 + 3 and {r.group for r in rows} == {0, 1}
    trees, rows_of = row_trees(rows)
    assert len(trees) == 3 and [len(r) for r in rows_of] == [7, 3, 3]
    claims = {(n, off): cs for n, node in enumerate(trees[0].nodes) for off, cs in node.claims.items()}
    claimed_by = {c for cs in claims.values() for c, _ in cs}
    # the repeat claims all of turn 1's answer, the sibling its shared first tokens, the cut-short
    # turn 2 the first half of its answer, the continuation the rest of turn 0's
    assert claimed_by == {3, 4, 5, 6}
    assert sum(len(cs) for cs in claims.values()) == (
        len(rows[1].completion_ids)
        + len(rows[5].completion_ids)
        + len(rows[6].completion_ids)
        + sum(1 for _ in _common(rows[0], rows[4]))
    )


def _common(r, s):
    for x, y in zip(r.completion_ids, s.completion_ids):
        if x != y:
            return
        yield x


@pytest.mark.parametrize(
    "kl_beta,entropy_coef,pack_tokens,micro_batch_size",
    [(0.0, 0.0, 4096, 8), (0.05, 0.01, 4096, 8), (0.05, 0.0, 700, 2)],
)
def test_packed_rows_equal_turn_rows(model_dir, played, kl_beta, entropy_coef, pack_tokens, micro_batch_size):
    """Trainer(packing=True).accumulate gives the turn rows' gradient and statistics to 1e-5, with
    a KL reference, with the entropy bonus, and with a token budget that spreads a tree over
    several packed rows (the claimed positions train in the row that trains their node)."""
    _, tokenizer, _ = played
    rows = step_rows(played)
    set_token_weights(rows)
    model = load_model(model_dir)
    ref = None
    if kl_beta > 0:
        ref = copy.deepcopy(model).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.01 * torch.randn_like(p))
    cfg = GRPOConfig(
        kl_beta=kl_beta, entropy_coef=entropy_coef, pack_tokens=pack_tokens, micro_batch_size=micro_batch_size
    )
    want = Trainer(model, tokenizer, cfg, ref_model=ref).accumulate(rows)
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    got = Trainer(model, tokenizer, cfg.model_copy(update={"packing": True}), ref_model=ref).accumulate(rows)
    assert want["n_clipped"] > 0 and want["n_forced"] > 0 and (want["kl"] > 0) == (kl_beta > 0)
    for k in COUNTS:
        assert got[k] == want[k], k
    for k in SUMS:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    _assert_grads_close(_grads(model), want_grads)
    assert got["packed_tokens"] < sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    # trees spread over several packed rows: a node re-runs as context in a later row
    trees, _ = row_trees(rows)
    packed = pack_trees(trees, None, pack_tokens, linear_cost(model.config))
    assert got["rows"] == len(packed) > 3 and any(not seg.train for row in packed for seg in row.segments)


def _sgd_step(model_dir, tokenizer, rows, cfg) -> tuple[list[dict], torch.nn.Module]:
    """One RL step (`plan_updates` + `run_updates`) with SGD in place of AdamW, so that float noise
    in near-zero gradients stays noise."""
    model = load_model(model_dir)
    trainer = Trainer(model, tokenizer, cfg)
    trainer.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    return run_updates(trainer, plan_updates(rows, cfg), cfg.lr, step=0), model


@pytest.mark.parametrize("packing", [False, True])
def test_decoupled_ppo_over_mini_batches_clips_against_the_proximal_policy(model_dir, played, packing):
    """Decoupled PPO, two mini-batches: `prepare` records π_prox (the weights the step starts
    from) for every row; the first update is the plain decoupled gradient (ratio 1 to π_prox, no
    clip, even with behaviour log-probs far off: those enter as the capped importance weight);
    the second is taken at moved weights, and the clip acts on the ratio to π_prox."""
    _, tokenizer, _ = played
    cfg = GRPOConfig(
        off_policy="decoupled", mini_batches=2, kl_beta=0.0, lr=0.05, clip_low=0.05, clip_high=0.05, packing=packing
    )
    model = load_model(model_dir)
    trainer = Trainer(model, tokenizer, cfg)
    # fresh samples: π_prox is the behaviour policy
    rows = step_rows(played, shift=0.0)
    updates = plan_updates(rows, cfg)
    assert len(updates) == 2 and {r.group for r in updates[0]} == {0} and {r.group for r in updates[1]} == {1}
    trainer.prepare(updates)
    assert all(len(r.prox_logprobs) == len(r.completion_ids) for r in rows)
    assert max(abs(p - q) for r in rows for p, q in zip(r.prox_logprobs, r.logprobs)) < 1e-5
    # ratio 1 to π_prox in the first update: its gradient is the one taken without recorded π_prox
    first = trainer.accumulate(updates[0])
    with_prox = _grads(model)
    model.zero_grad(set_to_none=True)
    saved = [r.prox_logprobs for r in updates[0]]
    for r in updates[0]:
        r.prox_logprobs = None
    assert trainer.accumulate(updates[0])["loss"] == pytest.approx(first["loss"], rel=1e-6)
    _assert_grads_close(_grads(model), with_prox)
    model.zero_grad(set_to_none=True)
    for r, lp in zip(updates[0], saved):
        r.prox_logprobs = lp

    # stale behaviour log-probs (π_prox / π_behaviour = e > the cap 2) and a big lr
    stale = step_rows(played, shift=0.0)
    for r in stale:
        r.logprobs = [x - 1.0 for x in r.logprobs]
    runs, _ = _sgd_step(model_dir, tokenizer, stale, cfg)
    m = update_metrics(step_stats(runs))
    assert m["train/updates"] == 2 and m["train/behaviour_capped_fraction"] == 1.0
    assert runs[0]["n_clipped"] == 0 and runs[0]["ratio_sum"] / runs[0]["n_tokens"] == pytest.approx(torch.e, rel=1e-4)
    assert runs[1]["n_clipped"] > 0 and m["train/clip_fraction"] > 0
    assert all(r.prox_logprobs is not None for r in stale)
    fresh = update_metrics(step_stats(_sgd_step(model_dir, tokenizer, step_rows(played, shift=0.0), cfg)[0]))
    assert fresh["train/behaviour_capped_fraction"] == 0.0


def test_decoupled_ppo_over_mini_batches_packed_equals_turn_rows(model_dir, played):
    """Two epochs of two mini-batches: π_prox read per target of a packed tree (claims included)
    gives the turn rows' updates."""
    _, tokenizer, _ = played
    cfg = GRPOConfig(
        off_policy="decoupled", mini_batches=2, epochs=2, kl_beta=0.0, lr=0.5, clip_low=0.05, clip_high=0.05
    )
    out = {}
    for packing in (False, True):
        runs, model = _sgd_step(model_dir, tokenizer, step_rows(played), cfg.model_copy(update={"packing": packing}))
        out[packing] = (runs, model)
    (want, a), (got, b) = out[False], out[True]
    assert len(want) == len(got) == 4 and sum(r["n_clipped"] for r in want[1:]) > 0
    for u, v in zip(want, got):
        for k in COUNTS:
            assert v[k] == u[k], k
        for k in ("loss", "ratio_sum", "grad_norm"):
            assert v[k] == pytest.approx(u[k], rel=1e-4), k
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-4), n


def test_satellite_gradients_add_up_to_the_whole_batch(model_dir, played):
    """A data-parallel step without all-reduce: each train cell's `gradients` of its share of an
    update, added on the core (`add_gradients`), are the gradient of the whole update."""
    _, tokenizer, _ = played
    cfg = GRPOConfig(kl_beta=0.0)
    rows = step_rows(played)
    (update,) = plan_updates(rows, cfg)
    model = load_model(model_dir)
    core = Trainer(model, tokenizer, cfg)
    whole = core.accumulate(update)
    want = core.gradients()
    assert all(p.grad is None for p in model.parameters())  # handed over: cleared
    other = Trainer(load_model(model_dir), tokenizer, cfg)
    parts = [core.accumulate(update[0::2]), other.accumulate(update[1::2])]
    core.add_gradients(other.gradients())
    _assert_grads_close(_grads(model), want)
    assert sum(p["n_tokens"] for p in parts) == whole["n_tokens"]
    assert sum(p["loss"] for p in parts) == pytest.approx(whole["loss"], rel=1e-5)
    with torch.no_grad():  # the recomputed log-probs are the policy's, untouched by accumulating
        lp = logprobs_of(model, [update[0].prompt_ids], [update[0].completion_ids])
    assert lp.shape[1] == len(update[0].completion_ids)
