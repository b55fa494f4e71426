"""Fixtures for the gateway tests: a micro Qwen3 model whose tokenizer is trained on real
BPE-harness ALFWorld prompts, and gateways served on loopback."""

from __future__ import annotations

import pytest
import torch
from micro_model import build_micro_model_dir


@pytest.fixture(scope="session")
def gw_model_dir(tmp_path_factory):
    """A random micro model (init std 0.3: varied greedy tokens) with a tokenizer trained on real prompts."""
    return build_micro_model_dir(tmp_path_factory.mktemp("gw_micro"), initializer_range=0.3)


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
