"""On-policy teacher labels (experiments/on_policy_anchor): which rollout states the teacher relabels,
and the anchor's extra term on them, on real games and a real model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from evoharness.config.harness import HarnessConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.base import META_VERBS, split_completion
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.harness.factory import make_harness
from evoharness.models.init import load_model, load_tokenizer
from evoharness.policies.scripted import RandomPolicy
from evoharness.policies.teacher import TeacherPolicy, teacher_completion
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.sft import collate, completion_loss, plan_epoch, tokenize_examples
from experiments.on_policy_anchor.on_policy_anchor import OnPolicyAnchor, OnPolicyAnchorConfig, relabel_states


def write_examples(path: Path, n_games: int = 8) -> Path:
    """One example per real train game: the BPE harness's first prompt and a teacher-style reply
    that goes to the first receptacle the admissible commands name (as tests/train/test_sft_anchor.py)."""
    rows = []
    for task in discover_games("train")[:n_games]:
        env = make_env(task, engine="fast")
        h, first = BPEHarness(ExperienceStore()), env.reset()
        h.reset(task, first)
        go = next(c for c in first.admissible_commands if c.startswith("go to "))
        rows.append({"messages": h.messages(), "completion": f"<think>search</think><action>{go}</action>"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class StrayingTeacher:
    """The teacher, but every third turn a random admissible command: it reaches states where the
    teacher (who has committed its plan) would act in the world and it did not."""

    name = "straying"

    def __init__(self) -> None:
        self.teacher, self.random = TeacherPolicy(), RandomPolicy(0)

    def act(self, requests):
        return [(self.random if r.turn % 3 == 2 else self.teacher).act([r])[0] for r in requests]


def played(policy, kind: str = "bpe", n_games: int = 3, max_steps: int = 12) -> list:
    """Real train games played by `policy` through a fresh harness of `kind`."""
    tasks = discover_games("train")[:n_games]
    return run_episodes(
        [EpisodeSpec(t, f"{policy.name}{i}") for i, t in enumerate(tasks)],
        lambda t: make_env(t, engine="fast"),
        lambda: make_harness(HarnessConfig(kind=kind)),
        policy,
        max_steps=max_steps,
    )


def user_of(messages: list[dict]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def test_relabel_keeps_lost_states_where_the_teacher_would_act_otherwise_in_the_world():
    random_trajs, teacher_trajs = played(StrayingTeacher()), played(TeacherPolicy())
    states = {json.dumps(t.messages): t for tr in random_trajs for t in tr.turns}
    lost = {k: t for k, t in states.items() if any(t in tr.turns for tr in random_trajs if not tr.won)}

    def differs(turn, env_only: bool) -> bool:
        label = split_completion(teacher_completion(user_of(turn.messages)))[1].strip()
        return label != split_completion(turn.completion)[1].strip() and not (
            env_only and label.split()[0] in META_VERBS
        )

    everything = relabel_states(random_trajs + teacher_trajs, seed=0, step=0, limit=1000, which="all")
    lost_env = relabel_states(random_trajs + teacher_trajs, seed=0, step=0, limit=1000)
    # the teacher never disagrees with itself; each distinct random state is kept once
    assert len(everything) == sum(differs(t, False) for t in states.values())
    assert len(lost_env) == sum(differs(t, True) for t in lost.values()) > 0
    assert len(lost_env) < len(everything) and all(ex in everything for ex in lost_env)
    for ex in everything:
        assert ex["completion"] == teacher_completion(user_of(ex["messages"]))
        assert differs(states[json.dumps(ex["messages"])], False)
    # a won episode's states are another route: kept only under "all"
    won = [dataclasses.replace(t, won=True) for t in random_trajs]
    assert relabel_states(won, 0, 0, 1000) == [] and len(relabel_states(won, 0, 0, 1000, "all")) == len(everything)
    # over the limit: a seeded sample, in rollout order
    few = relabel_states(random_trajs, seed=0, step=3, limit=4)
    assert len(few) == 4 and few == relabel_states(random_trajs, seed=0, step=3, limit=4)
    assert [lost_env.index(ex) for ex in few] == sorted(lost_env.index(ex) for ex in few)
    with pytest.raises(ValueError, match="BPE-harness prompts"):
        relabel_states(played(RandomPolicy(0), kind="react", n_games=1), 0, 0, 10)


def test_the_on_policy_term_is_one_mean_over_each_updates_relabelled_tokens(model_dir, tmp_path):
    data = write_examples(tmp_path / "sft.jsonl")
    cfg = OnPolicyAnchorConfig(
        data_path=str(data),
        coef=1.0,
        on_policy_coef=0.5,
        batch_tokens=1200,
        max_prompt_tokens=512,
        max_completion_tokens=64,
    )
    tok, model = load_tokenizer(model_dir), load_model(model_dir, "cpu", torch.float32)
    relabelled = relabel_states(played(StrayingTeacher()), seed=0, step=0, limit=12, which="all")
    anchor = OnPolicyAnchor(cfg, tok, seed=0, updates_per_step=2)
    metrics_1 = anchor.for_step(model, 0, relabelled=relabelled)(1)  # update 1 of step 0
    got = [p.grad.clone() for p in model.parameters()]
    # by hand: update 1's SFT batch and every other relabelled state, each as one padded batch
    model.zero_grad()
    loss, n = completion_loss(model, *collate(anchor.batch(1), tok.pad_token_id or 0))
    (loss / n).backward()
    rows = tokenize_examples(tok, relabelled, 512, 64)[1::2]
    assert len(plan_epoch([len(r[0]) for r in rows], cfg.batch_tokens, 0, 0)) > 1  # the anchor cut them into several
    loss, m = completion_loss(model, *collate(rows, tok.pad_token_id or 0))
    (0.5 * loss / m).backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
    assert metrics_1["on_policy_states"] == len(rows)
    assert metrics_1["on_policy_nll"] == pytest.approx(float(loss.detach()) / m, rel=1e-4)
