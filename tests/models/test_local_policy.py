"""LocalHFPolicy: the Policy protocol over a local model directory."""

from __future__ import annotations

import torch

from evoharness.harness.base import parse_completion
from evoharness.policies.base import Completion, Policy, PolicyRequest
from evoharness.policies.local import LocalHFPolicy

COMMANDS = ["go to fridge 1", "go to cabinet 12", "open fridge 1", "take apple 1 from countertop 2", "look"]


def requests(n: int) -> list[PolicyRequest]:
    return [
        PolicyRequest(
            messages=[
                {"role": "system", "content": "You are an agent. " * 8},
                {"role": "user", "content": f"OBSERVATION: you see a fridge {i + 1}." * (i + 1)},
            ],
            episode_id=f"game{i}#0",
            turn=i,
            admissible_commands=COMMANDS,
        )
        for i in range(n)
    ]


def test_act_returns_token_records(model_dir, tokenizer):
    budget = 100  # the system prompt fits; the longest user message does not
    pol = LocalHFPolicy(model_dir, max_new_tokens=12, max_prompt_tokens=budget, policy_version=3)
    assert isinstance(pol, Policy)
    reqs = requests(3)
    outs = pol.act(reqs)
    assert len(outs) == 3 and all(isinstance(c, Completion) for c in outs)
    for req, c in zip(reqs, outs):
        assert c.error is None and c.policy_version == 3
        assert c.prompt_tokens == len(c.prompt_token_ids) <= budget
        full = tokenizer.encode(tokenizer.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True))
        system = tokenizer.encode(
            tokenizer.apply_chat_template(req.messages[:1], tokenize=False) + "<|im_start|>user\n"
        )
        if len(full) <= budget:
            assert c.prompt_token_ids == full and c.extra["prompt_fit"] is None
        else:  # over budget: the system prompt is kept, the cut is right after it, the end is kept
            assert c.prompt_token_ids[: len(system)] == system and c.prompt_token_ids[-10:] == full[-10:]
            assert len(c.prompt_token_ids) == budget
            assert c.extra["prompt_fit"] == {"history_dropped": 0, "tokens_cut": len(full) - budget}
        assert c.completion_tokens == len(c.completion_token_ids) == len(c.logprobs) <= 12
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.text == tokenizer.decode(
            [t for t in c.completion_token_ids if t != tokenizer.eos_token_id], skip_special_tokens=False
        )
    assert [c.completion_token_ids for c in pol.act(reqs)] == [c.completion_token_ids for c in outs]  # greedy


def test_constrained_sampling_policy_and_bad_request(model_dir):
    pol = LocalHFPolicy(model_dir, temperature=1.0, max_new_tokens=40, constrained=True, seed=1)
    reqs = requests(4)
    reqs.insert(1, PolicyRequest(messages=None, episode_id="bad", turn=0, admissible_commands=COMMANDS))  # type: ignore[arg-type]
    outs = pol.act(reqs)
    assert outs[1].error and outs[1].finish_reason == "error" and outs[1].text == ""
    for c in outs[:1] + outs[2:]:
        assert (
            c.error is None
            and parse_completion(c.text, COMMANDS, ("track", "commit", "recall", "note")).kind != "invalid"
        )
    # per-episode seeds: the same request alone gets the same sample
    assert pol.act([reqs[3]])[0].completion_token_ids == outs[3].completion_token_ids


def test_update_weights_bumps_version_and_changes_outputs(model_dir):
    pol = LocalHFPolicy(model_dir, max_new_tokens=8)
    before = pol.act(requests(2))
    sd = {k: v.clone() for k, v in pol.model.state_dict().items() if k != "lm_head.weight"}  # tied weight left out
    g = torch.Generator().manual_seed(0)
    sd = {k: v + 0.5 * torch.randn(v.shape, generator=g) if v.ndim == 2 else v for k, v in sd.items()}
    assert pol.update_weights(sd) == 1
    after = pol.act(requests(2))
    assert all(c.policy_version == 1 for c in after)
    assert [c.completion_token_ids for c in after] != [c.completion_token_ids for c in before]
    assert pol.update_weights(sd, version=7) == 7


def test_policy_config_selects_the_decoder_and_both_answer_alike(model_dir):
    from evoharness.config.policy import PolicyConfig
    from evoharness.engines import StaticEngine
    from evoharness.engines.hf import Engine
    from evoharness.policies.factory import make_policy

    made = {
        d: make_policy(PolicyConfig(kind="hf", model_path=str(model_dir), max_tokens=10, decoder=d))
        for d in ("auto", "hf")
    }
    assert isinstance(made["auto"].engine, StaticEngine) and isinstance(made["hf"].engine, Engine)
    reqs = requests(2)
    fast, ref = (made[d].act(reqs) for d in ("auto", "hf"))
    assert [c.completion_token_ids for c in fast] == [c.completion_token_ids for c in ref]  # greedy: same tokens
    for a, b in zip(fast, ref):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
