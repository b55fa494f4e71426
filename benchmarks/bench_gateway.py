#!/usr/bin/env python
"""Gateway overhead per call and throughput at 64 concurrent agent executions.

Model: the CPU main job's ``mini`` preset (~1.1M params, random init) with a
tokenizer trained on real BPE-harness ALFWorld prompts; prompts are the
first-turn BPE prompts of real valid_seen games (~600-900 tokens). Greedy,
unconstrained, ``max_tokens`` fixed, so every path generates the same tokens.

1. Overhead per call (one call at a time): the engine called directly
   (`Engine.generate` on one request) vs the same call through the gateway
   (HTTP on loopback, JSON, routing, recording), with the httpx client and
   the official `openai` client; ``max_tokens=1`` isolates the fixed cost.
2. Throughput at 64 concurrent executions, each making ``--turns`` calls in
   sequence (every call waits for the previous answer, as an agent does):
   the in-process ideal (64 requests per `Engine.generate`, lock-step) vs the
   gateway with the in-process engine vs the gateway with ``--workers``
   worker processes.

    python benchmarks/bench_gateway.py | tee benchmarks/results/bench_gateway.txt
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

import httpx  # noqa: E402
import torch  # noqa: E402

from evoharness.engine import Engine, GenRequest  # noqa: E402
from evoharness.envs.alfworld import make_env  # noqa: E402
from evoharness.envs.alfworld.games import discover_games  # noqa: E402
from evoharness.harness.bpe import BPEHarness, ExperienceStore  # noqa: E402
from evoharness.models.init import init_model, load_model, load_tokenizer  # noqa: E402
from evoharness.models.tokenizer import build_tokenizer  # noqa: E402
from evoharness.runtime.backends import LocalBackend, WorkerBackend  # noqa: E402
from evoharness.runtime.gateway import Gateway, GatewayServer  # noqa: E402


def first_prompts(n: int) -> list[list[dict]]:
    games = discover_games("valid_seen")
    out = []
    for task in (games * (n // len(games) + 1))[:n]:
        env = make_env(task, engine="fast")
        h = BPEHarness(ExperienceStore())
        h.reset(task, env.reset())
        out.append(h.messages())
    return out


def build_model(d: Path, prompts: list[list[dict]]) -> None:
    corpus = [m["content"] for p in prompts for m in p] + ["<think>go</think><action>go to countertop 1</action>"]
    tok = build_tokenizer(corpus, d, vocab_size=1024)
    init_model("mini", tok, out_dir=d, seed=0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def overhead(model_dir: Path, prompts: list[list[dict]], calls: int, max_tokens: int) -> list[tuple[str, list[float]]]:
    import openai

    tok = load_tokenizer(model_dir)
    engine = Engine(load_model(model_dir), tok)
    ids = [tok(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
           ["input_ids"] for p in prompts[:calls]]
    rows = []
    direct = []
    for x in ids:
        t = time.perf_counter()
        engine.generate([GenRequest(x)], max_tokens, 0.0)
        direct.append(time.perf_counter() - t)
    rows.append(("engine direct", direct))
    with GatewayServer(Gateway([LocalBackend(engine, tok, batch_wait_s=0.0)], served_model="mini")) as srv:
        with httpx.Client(timeout=120) as client:
            via = []
            for k, p in enumerate(prompts[:calls]):
                t = time.perf_counter()
                r = client.post(f"{srv.url}/chat/completions", headers={"X-Execution-Id": f"o{k}"}, json={
                    "model": "mini", "messages": p, "max_tokens": max_tokens, "temperature": 0,
                    "logprobs": True, "return_token_ids": True})
                via.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
        rows.append(("gateway, httpx client", via))
        oai = openai.OpenAI(base_url=srv.url, api_key="x")
        via = []
        for k, p in enumerate(prompts[:calls]):
            t = time.perf_counter()
            oai.chat.completions.create(model="mini", messages=p, max_tokens=max_tokens, temperature=0, logprobs=True,
                                        extra_body={"return_token_ids": True},
                                        extra_headers={"X-Execution-Id": f"q{k}"})
            via.append(time.perf_counter() - t)
        rows.append(("gateway, openai client", via))
    return rows


def lockstep(model_dir: Path, prompts: list[list[dict]], turns: int, max_tokens: int) -> tuple[float, int]:
    """The in-process ideal: all executions' calls of a turn in one `generate`."""
    tok = load_tokenizer(model_dir)
    engine = Engine(load_model(model_dir), tok)
    msgs = [list(p) for p in prompts]
    t, n_tok = time.perf_counter(), 0
    for _ in range(turns):
        ids = [tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for m in msgs]
        res = engine.generate([GenRequest(x) for x in ids], max_tokens, 0.0)
        for m, r in zip(msgs, res):
            n_tok += len(r.token_ids)
            m.append({"role": "assistant", "content": tok.decode(r.token_ids, skip_special_tokens=True)})
            m.append({"role": "user", "content": "Nothing happens."})
    return time.perf_counter() - t, n_tok


def agents(url: str, prompts: list[list[dict]], turns: int, max_tokens: int) -> tuple[float, int, list[float]]:
    """Each execution: `turns` calls in sequence, all executions at once."""
    lat: list[float] = []

    async def one(client: httpx.AsyncClient, k: int, msgs: list[dict]) -> int:
        n = 0
        for _ in range(turns):
            t = time.perf_counter()
            r = await client.post(f"{url}/chat/completions", headers={"X-Execution-Id": f"exec{k}"}, json={
                "model": "mini", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                "logprobs": True, "return_token_ids": True})
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            body = r.json()
            n += body["usage"]["completion_tokens"]
            msgs = msgs + [{"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""},
                           {"role": "user", "content": "Nothing happens."}]
        return n

    async def main() -> int:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=256)) as client:
            return sum(await asyncio.gather(*(one(client, k, list(p)) for k, p in enumerate(prompts))))

    t = time.perf_counter()
    n = asyncio.run(main())
    return time.perf_counter() - t, n, lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--executions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("uptime at start:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    prompts = first_prompts(a.executions)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "mini"
        build_model(d, prompts)
        tok = load_tokenizer(d)
        plen = [len(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)) for p in prompts]
        print(f"model: mini preset ({sum(p.numel() for p in load_model(d).parameters()) / 1e6:.2f}M params), "
              f"torch threads 1; prompts: first-turn BPE prompts of real valid_seen games "
              f"({statistics.median(plen):.0f} chars median)\n")

        print(f"## Overhead per call ({a.calls} calls one at a time; ms)\n")
        print("| path | max_tokens | median | p90 | overhead vs direct (median) |")
        print("|---|---|---|---|---|")
        for mt in (1, a.max_tokens):
            rows = overhead(d, prompts, a.calls, mt)
            base = statistics.median(rows[0][1])
            for name, xs in rows:
                med = statistics.median(xs)
                extra = "" if name == "engine direct" else f"+{(med - base) * 1e3:.1f} ms"
                print(f"| {name} | {mt} | {med * 1e3:.1f} | {pct(xs, 0.9) * 1e3:.1f} | {extra} |")

        n_calls = a.executions * a.turns
        print(f"\n## Throughput: {a.executions} concurrent executions x {a.turns} sequential calls "
              f"(max_tokens {a.max_tokens})\n")
        print("| path | wall s | calls/s | new tok/s | call latency median / p90 (s) |")
        print("|---|---|---|---|---|")
        wall, n_tok = lockstep(d, prompts, a.turns, a.max_tokens)
        print(f"| in-process lock-step (64 per generate) | {wall:.1f} | {n_calls / wall:.1f} | {n_tok / wall:.0f} | - |")
        tok_, model_ = load_tokenizer(d), load_model(d)
        with GatewayServer(Gateway([LocalBackend(Engine(model_, tok_), tok_)], served_model="mini")) as srv:
            wall, n_tok, lat = agents(srv.url, prompts, a.turns, a.max_tokens)
            b = srv.gateway.backends["local"]
            print(f"| gateway, in-process engine ({b.batches} batches) | {wall:.1f} | {n_calls / wall:.1f} | "
                  f"{n_tok / wall:.0f} | {statistics.median(lat):.2f} / {pct(lat, 0.9):.2f} |")
        if a.workers:
            ws = [WorkerBackend(d, name=f"w{i}", args=["--num-threads", "1"]) for i in range(a.workers)]
            with GatewayServer(Gateway(ws, served_model="mini")) as srv:
                wall, n_tok, lat = agents(srv.url, prompts, a.turns, a.max_tokens)
                split = "/".join(str(w.served) for w in ws)
                print(f"| gateway, {a.workers} worker processes (calls {split}) | {wall:.1f} | {n_calls / wall:.1f} | "
                      f"{n_tok / wall:.0f} | {statistics.median(lat):.2f} / {pct(lat, 0.9):.2f} |")
    print("\nuptime at end:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
