"""Issue 10 fault 2: the trainer scores the distribution that acted.

Real ALFWorld games, the BPE harness and a micro Qwen3 model decoding through
the project's engine: the log-prob the trainer recomputes for every sampled
token equals the recorded behaviour log-prob (fp32, 1e-5), so the PPO ratio at
policy version 0 is 1, and tokens the constraint forced carry no gradient.
"""

from __future__ import annotations

import pytest
import torch

from evoharness.config.rl import GRPOConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.policies.local import LocalHFPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.grpo import TokenMasks, logprobs_of, microbatch_loss
from evoharness.train.step import set_token_weights, turn_rows

TEMP = 0.7


def _rollout(model_dir, constrained: bool):
    policy = LocalHFPolicy(
        model_dir,
        temperature=TEMP,
        constrained=constrained,
        max_new_tokens=20,
        seed=1,
        max_prompt_tokens=512,
        num_threads=1,
    )
    store = ExperienceStore()
    store.freeze()
    tasks = discover_games("train")[:2]
    trajs = run_episodes(
        [EpisodeSpec(t, f"{t.task_id}#{k}", 0) for t in tasks for k in range(2)],
        make_env=lambda task: make_env(task, engine="fast"),
        make_harness=lambda: BPEHarness(store),
        policy=policy,
        max_steps=3,
    )
    samples = [s for t in trajs for s in turn_rows(t, [1.0] * t.steps, GRPOConfig(temperature=TEMP), step=0)]
    masks = TokenMasks(policy.tokenizer, policy.model.get_output_embeddings().weight.shape[0])
    return policy, trajs, samples, masks


def _recompute(policy, samples, masks):
    prompts, comps = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    width = max(len(c) for c in comps)
    allowed = masks(samples, width, torch.device("cpu"))
    logp = logprobs_of(policy.model, prompts, comps, TEMP, allowed)
    return logp, allowed


def test_constrained_sample_recomputes_to_the_behaviour_logprob(model_dir):
    policy, trajs, samples, masks = _rollout(model_dir, constrained=True)
    assert len(samples) >= 8 and all(s.constraint is not None for s in samples)
    assert all(t.turns[0].constraint["commands"] == t.turns[0].admissible_commands for t in trajs)
    with torch.no_grad():
        logp, allowed = _recompute(policy, samples, masks)
    diffs = [abs(float(logp[i, j]) - s.logprobs[j]) for i, s in enumerate(samples) for j in range(len(s.logprobs))]
    assert max(diffs) < 1e-5

    # The unmasked softmax (the old trainer) is a different distribution: the check above can fail.
    with torch.no_grad():
        full = logprobs_of(policy.model, [s.prompt_ids for s in samples], [s.completion_ids for s in samples], TEMP)
    assert (
        max(abs(float(full[i, j]) - s.logprobs[j]) for i, s in enumerate(samples) for j in range(len(s.logprobs)))
        > 1e-2
    )

    # PPO ratio at policy version 0 is exactly 1 on every token
    set_token_weights(samples)
    cfg = GRPOConfig(temperature=TEMP, kl_beta=0.0, micro_batch_size=64)
    with torch.no_grad():
        _, st = microbatch_loss(policy.model, samples, cfg, masks=masks)
    assert st["ratio_sum"] / st["n_tokens"] == pytest.approx(1.0, abs=1e-5)
    assert st["ratio_max"] == pytest.approx(1.0, abs=1e-5) and st["n_clipped"] == 0
    assert st["n_forced"] > 0 and torch.isfinite(torch.tensor(st["entropy"]))

    with pytest.raises(ValueError, match="TokenMasks"):
        microbatch_loss(policy.model, samples, cfg)

    # tree-packed rows (the trainer's grpo.packing) rebuild the same distribution: ratio 1
    from evoharness.train.trainer import Trainer

    packed = Trainer(policy.model, policy.tokenizer, cfg.model_copy(update={"packing": True})).accumulate(samples)
    assert packed["n_tokens"] == st["n_tokens"] and packed["n_forced"] == st["n_forced"]
    assert packed["ratio_sum"] / packed["n_tokens"] == pytest.approx(1.0, abs=1e-5)
    assert packed["ratio_max"] == pytest.approx(1.0, abs=1e-5) and packed["n_clipped"] == 0
    policy.model.zero_grad(set_to_none=True)


def test_forced_tokens_have_logprob_zero_and_no_gradient(model_dir):
    policy, _, samples, masks = _rollout(model_dir, constrained=True)
    policy.model.train()
    logp, allowed = _recompute(policy, samples, masks)
    lengths = torch.tensor([len(s.completion_ids) for s in samples])
    valid = torch.arange(logp.shape[1])[None, :] < lengths[:, None]
    forced = (allowed.sum(-1) == 1) & valid
    free = (allowed.sum(-1) > 1) & valid
    # <think>, </think> -> <action>: at least three forced tokens per turn
    assert bool((forced.sum(-1) >= 3).all()) and bool(free.any())
    recorded = torch.zeros_like(logp)
    for i, s in enumerate(samples):
        recorded[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    assert bool((recorded[forced] == 0).all()) and bool((logp.detach()[forced] == 0).all())

    params = [p for p in policy.model.parameters() if p.requires_grad]
    g_forced = torch.autograd.grad((logp * forced).sum(), params, retain_graph=True, allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in g_forced)
    g_free = torch.autograd.grad((logp * free).sum(), params, allow_unused=True)
    assert sum(float(g.abs().sum()) for g in g_free if g is not None) > 0


def test_unconstrained_turns_mask_only_ids_beyond_the_tokenizer(model_dir):
    policy, _, samples, masks = _rollout(model_dir, constrained=False)
    assert samples and all(s.constraint is None for s in samples)
    assert policy.model.get_output_embeddings().weight.shape[0] > len(policy.tokenizer)  # padded rows exist
    with torch.no_grad():
        logp, allowed = _recompute(policy, samples, masks)
    n = len(policy.tokenizer)
    for i, s in enumerate(samples):
        c = len(s.completion_ids)
        assert bool(allowed[i, :c, :n].all()) and not bool(allowed[i, :c, n:].any())
    diffs = [abs(float(logp[i, j]) - s.logprobs[j]) for i, s in enumerate(samples) for j in range(len(s.logprobs))]
    assert max(diffs) < 1e-5


def test_replay_refuses_a_completion_the_grammar_never_allowed(model_dir):
    from evoharness.engines.grammar import ActionGrammar

    policy, _, samples, masks = _rollout(model_dir, constrained=True)
    s = samples[0]
    vocab = masks.vocab(torch.device("cpu"))
    g = ActionGrammar.from_constraint(vocab, s.constraint)
    assert g.replay(s.completion_ids, s.constraint["max_new_tokens"]).shape == (len(s.completion_ids), vocab.size)
    bad = list(s.completion_ids)
    bad[0] = policy.tokenizer.convert_tokens_to_ids("</action>")  # <think> is forced first
    with pytest.raises(ValueError, match="not allowed"):
        ActionGrammar.from_constraint(vocab, s.constraint).replay(bad, s.constraint["max_new_tokens"])
