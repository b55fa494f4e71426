"""Fixtures for the gateway tests: a micro Qwen3 model whose tokenizer is trained on real
BPE-harness ALFWorld prompts, and gateways served on loopback."""

from __future__ import annotations

import pytest
import torch

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import init_model
from evoharness.models.tokenizer import build_tokenizer

MICRO = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="session")
def gw_model_dir(tmp_path_factory):
    """A random micro model (init std 0.3: varied greedy tokens) with a tokenizer trained on real prompts."""
    corpus = []
    for task in discover_games("train")[:12]:
        env = make_env(task, engine="fast")
        h = BPEHarness(ExperienceStore())
        h.reset(task, env.reset())
        corpus += [m["content"] for m in h.messages()]
        corpus.append("<think>go</think><action>go to countertop 1</action> track commit recall note")
    d = tmp_path_factory.mktemp("gw_micro")
    tok = build_tokenizer(corpus, d, vocab_size=1024)
    init_model(dict(MICRO, initializer_range=0.3), tok, out_dir=d, seed=0)
    return d


@pytest.fixture(autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: one thread avoids OpenMP spin-wait stalls
    yield
    torch.set_num_threads(prev)


@pytest.fixture()
def serve():
    """``serve(gateway) -> GatewayServer`` started on a free loopback port; stopped after the test."""
    from evoharness.runtime.gateway import GatewayServer

    servers = []

    def start(gateway):
        srv = GatewayServer(gateway).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
