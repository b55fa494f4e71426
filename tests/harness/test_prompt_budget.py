"""One prompt budget (issue 10 fault 4, review): standalone `sft`, `rl` and `eval` (hf and openai
policies) default to the same `max_prompt_tokens`, so a collect -> sft -> rl/eval recipe run with
the commands' defaults trains on the prompts the model is later shown. Real game, real teacher,
a real tokenizer and a micro Qwen3 model built here."""

from __future__ import annotations

import pytest

from evoharness.config.base import load_config
from evoharness.config.eval import EvalConfig
from evoharness.config.harness import DEFAULT_MAX_PROMPT_TOKENS, HarnessConfig
from evoharness.config.rl import RLConfig
from evoharness.config.sft import SFTConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.files import read_jsonl
from evoharness.harness.prompt import chat_ids
from evoharness.models.init import init_model, load_tokenizer
from evoharness.models.tokenizer import build_tokenizer
from evoharness.policies.base import PolicyRequest
from evoharness.policies.factory import make_policy
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.collect import bpe_harness_factory, collect_traces, traces_to_sft
from evoharness.train.sft import tokenize_examples

MICRO = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16
)


def test_every_stage_defaults_to_one_budget():
    # what `evoharness sft`, `rl` and `eval` build with no config file and no --set
    budgets = {
        "sft": load_config(SFTConfig).max_prompt_tokens,
        "rl": load_config(RLConfig).max_prompt_tokens,
        "eval hf": load_config(EvalConfig, overrides=['policy.kind="hf"']).policy.max_prompt_tokens,
        "eval openai": load_config(EvalConfig, overrides=['policy.kind="openai"']).policy.max_prompt_tokens,
    }
    assert budgets == dict.fromkeys(budgets, DEFAULT_MAX_PROMPT_TOKENS)


@pytest.fixture(scope="module")
def long_game(tmp_path_factory):
    """A teacher episode of a kitchen game collected with `evoharness collect`'s default
    harness, and a micro model whose small-vocabulary tokenizer makes its later prompts
    longer than the default budget."""
    task = next(t for t in discover_games("valid_seen") if t.task_type == "pick_heat_then_place_in_recep")
    d = tmp_path_factory.mktemp("budget")
    collect_traces(
        [task],
        TeacherPolicy(),
        bpe_harness_factory(HarnessConfig()),
        lambda t: make_env(t, engine="fast"),
        d / "traces.jsonl",
        progress=False,
    )
    (traj,) = read_jsonl(d / "traces.jsonl")
    corpus = [m["content"] for t in traj["turns"] for m in t["messages"]] + [t["completion"] for t in traj["turns"]]
    tok = build_tokenizer(corpus, d / "model", vocab_size=270)
    init_model(MICRO, tok, out_dir=d / "model", seed=0)
    return traj, d / "model"


def test_default_sft_rows_are_the_prompts_default_eval_shows(long_game):
    traj, model_dir = long_game
    tok = load_tokenizer(model_dir)
    examples = traces_to_sft([traj])
    lengths = [len(chat_ids(tok, ex["messages"])) for ex in examples]
    assert max(lengths) > DEFAULT_MAX_PROMPT_TOKENS, "the game must exceed the default budget"
    stats: dict[str, int] = {}
    rows = tokenize_examples(tok, examples, SFTConfig().max_prompt_tokens, SFTConfig().max_completion_tokens, stats)
    assert len(rows) == len(examples) and stats["history_dropped"] > 0
    policy = make_policy(
        load_config(EvalConfig, overrides=['policy.kind="hf"', f'policy.model_path="{model_dir}"']).policy
    )
    for (ids, n_prompt), ex, turn in zip(rows, examples, traj["turns"]):
        req = PolicyRequest(ex["messages"], "e", turn["turn"], [])
        assert policy._prompt_ids(req) == ids[:n_prompt]
        assert n_prompt <= DEFAULT_MAX_PROMPT_TOKENS
