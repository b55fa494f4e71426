"""vLLM's OpenAI-compatible server with the project's grammar processor: a real ``vllm serve``
process on 127.0.0.1 (~35 s to start, ~4 GB). Skipped without vllm; here:

    PYTHONPATH=src .venv-vllm/bin/python -m pytest -q tests/engines/test_vllm_server.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from engine_helpers import COMMANDS, SYSTEM
from model_helpers import MICRO

from evoharness.engines.vllm_engine import vllm_available
from evoharness.harness.base import META_VERBS, parse_completion

pytestmark = [pytest.mark.skipif(not vllm_available(), reason="vllm is not installed"), pytest.mark.slow]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer):
    from evoharness.models.init import init_model

    d = tmp_path_factory.mktemp("served")
    init_model(dict(MICRO, head_dim=32, initializer_range=0.3), tokenizer, d, seed=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        VLLM_CPU_KVCACHE_SPACE="1",
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.Popen(
        # the api_server module, not `vllm serve`: the CLI looks up a "vllm" distribution (vllm-cpu is not one)
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(d),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--logprobs-mode",
            "processed_logprobs",
            "--logits-processors",
            "evoharness.engines.vllm_grammar:ActionGrammarLogitsProcessor",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited: {proc.stderr.read()[-3000:]}")
        try:
            urllib.request.urlopen(base + "/v1/models", timeout=2)
            break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("vllm serve did not come up in 240 s")
    yield base, d
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_served_grammar_constrains_and_logprobs_follow_the_contract(server, tokenizer):
    """Over HTTP the grammar goes in ``vllm_xargs``; every completion parses, and the returned
    log-probs equal a teacher-forced forward under the replayed grammar masks."""
    from evoharness.engines.grammar import ActionGrammar, Vocab
    from evoharness.models.init import load_model

    base, d = server
    model = load_model(d)
    vocab = Vocab(tokenizer, model.config.vocab_size, torch.device("cpu"))
    N, T = 40, 1.2
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "You are in the kitchen. Find an apple."},
    ]
    for seed in range(3):
        out = _post(
            base + "/v1/chat/completions",
            {
                "model": str(d),
                "messages": msgs,
                "max_tokens": N,
                "temperature": T,
                "seed": seed,
                "logprobs": True,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "vllm_xargs": {
                    "action_grammar_commands": COMMANDS,
                    "action_grammar_meta_verbs": list(META_VERBS),
                    "action_grammar_max_new_tokens": N,
                },
            },
        )
        ch = out["choices"][0]
        ids, lps = ch["token_ids"], [c["logprob"] for c in ch["logprobs"]["content"]]
        g, masks = ActionGrammar(vocab, COMMANDS, META_VERBS), []
        for step, t in enumerate(ids):
            if g.done:  # after </action> the processor allows only end-of-sequence: log-prob 0
                assert t == tokenizer.eos_token_id and abs(lps[step]) < 1e-6
                ids, lps = ids[:step], lps[:step]
                break
            masks.append(g.allowed(N - step))
            g.advance(t)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert g.done and parse_completion(text, COMMANDS, META_VERBS).kind in ("env", "meta"), text
        prompt = out["prompt_token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / T
        logits[:, len(tokenizer) :] = float("-inf")
        ref = torch.log_softmax(logits.masked_fill(~torch.stack(masks), float("-inf")), -1)
        ref = ref.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), ref, atol=1e-4), (lps, ref.tolist())


def test_gateway_in_front_of_vllm_records_contract_logprobs(server, tokenizer, tmp_path):
    """``evoharness serve --backend URL --backend-grammar xargs``: the gateway sends ``action_grammar``
    as the processor's ``vllm_xargs``; each CallRecord holds the engine's prompt ids, the completion
    ids, the constraint, and log-probs equal to a forward under the replayed grammar masks (the
    ``regex`` form's masks are the regex's, which the trainer cannot replay)."""
    from evoharness.engines.grammar import ActionGrammar, Vocab
    from evoharness.models.init import load_model
    from evoharness.runtime.backends import HTTPBackend
    from evoharness.runtime.gateway import Gateway, GatewayServer

    base, d = server
    model = load_model(d)
    vocab = Vocab(tokenizer, model.config.vocab_size, torch.device("cpu"))
    N, T = 40, 1.2
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "You are in the kitchen. Find an apple."},
    ]
    with GatewayServer(
        Gateway([HTTPBackend(base + "/v1", grammar="xargs")], served_model="m", records=tmp_path)
    ) as srv:
        for seed in range(2):
            out = _post(
                srv.url + "/chat/completions",
                {
                    "model": "m",
                    "messages": msgs,
                    "max_tokens": N,
                    "temperature": T,
                    "seed": seed,
                    "logprobs": True,
                    "return_token_ids": True,
                    "user": f"x{seed}",
                    "top_logprobs": 2,
                    "action_grammar": {"commands": COMMANDS, "meta_verbs": list(META_VERBS)},
                },
            )
            (rec,) = srv.gateway.records.read(f"x{seed}")
            assert all(len(c["top_logprobs"]) == 2 for c in out["choices"][0]["logprobs"]["content"])  # passed through
            assert (
                rec.prompt_token_ids == out["prompt_token_ids"]
                and rec.completion_token_ids == out["choices"][0]["token_ids"]
            )
            assert rec.constraint == {"commands": COMMANDS, "meta_verbs": list(META_VERBS), "max_new_tokens": N}
            ids, lps = rec.completion_token_ids, rec.logprobs
            assert len(lps) == len(ids) > 0 and rec.policy_version == 0 and rec.retries == 0
            g, masks = ActionGrammar(vocab, COMMANDS, META_VERBS), []
            for step, t in enumerate(ids):
                if g.done:
                    assert t == tokenizer.eos_token_id and abs(lps[step]) < 1e-6
                    ids, lps = ids[:step], lps[:step]
                    break
                masks.append(g.allowed(N - step))
                g.advance(t)
            assert g.done and parse_completion(out["choices"][0]["message"]["content"], COMMANDS, META_VERBS).kind in (
                "env",
                "meta",
            )
            prompt = rec.prompt_token_ids
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / T
            logits[:, len(tokenizer) :] = float("-inf")
            ref = torch.log_softmax(logits.masked_fill(~torch.stack(masks), float("-inf")), -1)
            ref = ref.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(lps), ref, atol=1e-4), (lps, ref.tolist())


def test_openai_policy_sends_the_exact_grammar_to_vllm(server):
    """``constraint_format="vllm_xargs"``: every sampled completion is a legal action under the
    engine's grammar, with one behaviour log-prob per token and its constraint recorded."""
    from evoharness.policies.base import PolicyRequest
    from evoharness.policies.openai_policy import OpenAIPolicy

    base, d = server
    policy = OpenAIPolicy(
        base_url=base + "/v1",
        model=str(d),
        temperature=1.2,
        max_tokens=40,
        seed=0,
        constrained=True,
        constraint_format="vllm_xargs",
        max_retries=0,
    )
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "You are in the kitchen. Find an apple."},
    ]
    reqs = [PolicyRequest(messages=msgs, episode_id=f"e{i}", turn=0, admissible_commands=COMMANDS) for i in range(3)]
    for c in policy.act(reqs):
        assert c.error is None and parse_completion(c.text, COMMANDS, META_VERBS).kind in ("env", "meta"), c.text
        assert len(c.logprobs) == len(c.completion_token_ids) > 0 and c.extra["constraint"]["max_new_tokens"] == 40
    policy.close()
