"""A micro Qwen3 model directory whose tokenizer is trained on real BPE-harness ALFWorld prompts."""

from __future__ import annotations

from pathlib import Path

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import init_model
from evoharness.models.tokenizer import build_tokenizer

MICRO = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def build_micro_model_dir(d: Path, **init: float) -> Path:
    """Tokenizer (1,024 tokens) on the first prompts of 12 real train games, and a random
    micro model (`MICRO`, `init` overrides, e.g. ``initializer_range``) saved into `d`."""
    corpus = []
    for task in discover_games("train")[:12]:
        env = make_env(task, engine="fast")
        h = BPEHarness(ExperienceStore())
        h.reset(task, env.reset())
        corpus += [m["content"] for m in h.messages()]
        corpus.append("<think>go</think><action>go to countertop 1</action> track commit recall note")
    tok = build_tokenizer(corpus, d, vocab_size=1024)
    init_model(dict(MICRO, **init), tok, out_dir=d, seed=0)
    return d
