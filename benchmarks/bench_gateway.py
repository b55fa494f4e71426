#!/usr/bin/env python
"""Gateway overhead per call and throughput at 64 concurrent agent executions.

Model: the CPU main job's ``mini`` preset (~1.1M params, random init) with a
tokenizer trained on real BPE-harness ALFWorld prompts; prompts are the
first-turn BPE prompts of real valid_seen games (~600-900 tokens). Greedy,
unconstrained, ``max_tokens`` fixed, so every path generates the same tokens.

1. Overhead per call (one call at a time): the engine called directly
   (`Engine.generate` on one tokenised request) vs the same call through
   ``evoharness serve`` in its own process (HTTP on loopback, JSON, chat
   template and tokenisation, routing, records to disk), with the httpx client
   and the official `openai` client, interleaved call by call;
   ``max_tokens=1`` isolates the fixed cost.
2. Throughput at 64 concurrent executions, each making ``--turns`` calls in
   sequence (every call waits for the previous answer, as an agent does):
   the in-process ideal (64 requests per `Engine.generate`, lock-step) vs
   ``evoharness serve`` with its engine in-process vs with ``--workers``
   worker processes (one torch thread each).

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

# src/ must be on sys.path before the evoharness imports (run as a script, no install needed): hence noqa E402
import httpx  # noqa: E402
import torch  # noqa: E402

from evoharness.engines.grammar import GenRequest  # noqa: E402
from evoharness.engines.hf import Engine  # noqa: E402
from evoharness.envs.alfworld import make_env  # noqa: E402
from evoharness.envs.alfworld.games import discover_games  # noqa: E402
from evoharness.harness.bpe import BPEHarness, ExperienceStore  # noqa: E402
from evoharness.models.init import init_model, load_model, load_tokenizer  # noqa: E402
from evoharness.models.tokenizer import build_tokenizer  # noqa: E402


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


class Served:
    """`evoharness serve` in a subprocess (the deployment an agent talks to); stopped on exit."""

    def __init__(self, model_dir: Path, records: Path, workers: int = 0):
        import socket

        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            self.port = sk.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [
            sys.executable,
            "-m",
            "evoharness.cli",
            "serve",
            "--model-path",
            str(model_dir),
            "--port",
            str(self.port),
            "--records",
            str(records),
            "--served-model-name",
            "mini",
            "--threads",
            "1",
            "--workers",
            str(workers),
        ]
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def __enter__(self) -> Served:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url[:-3]}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("evoharness serve exited")
            time.sleep(0.2)
        raise TimeoutError("evoharness serve did not start")

    def stats(self) -> dict:
        return httpx.get(f"{self.url[:-3]}/admin/stats").json()

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def overhead(
    model_dir: Path, prompts: list[list[dict]], calls: int, max_tokens: int, tmp: Path
) -> list[tuple[str, list[float]]]:
    """One call at a time, the three paths interleaved call by call (same machine load for each)."""
    import openai

    tok = load_tokenizer(model_dir)
    engine = Engine(load_model(model_dir), tok)
    times: dict[str, list[float]] = {"engine direct": [], "gateway, httpx client": [], "gateway, openai client": []}
    with Served(model_dir, tmp / f"rec_overhead_{max_tokens}") as srv, httpx.Client(timeout=120) as client:
        oai = openai.OpenAI(base_url=srv.url, api_key="x")
        for k, p in enumerate((prompts * 2)[: calls + 2]):
            ids = tok(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
                "input_ids"
            ]
            t = time.perf_counter()
            engine.generate([GenRequest(ids)], max_tokens, 0.0)
            t1 = time.perf_counter()
            r = client.post(
                f"{srv.url}/chat/completions",
                headers={"X-Execution-Id": f"o{k}"},
                json={
                    "model": "mini",
                    "messages": p,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            t2 = time.perf_counter()
            assert r.status_code == 200, r.text
            oai.chat.completions.create(
                model="mini",
                messages=p,
                max_tokens=max_tokens,
                temperature=0,
                logprobs=True,
                extra_body={"return_token_ids": True},
                extra_headers={"X-Execution-Id": f"q{k}"},
            )
            t3 = time.perf_counter()
            if k >= 2:  # the first two calls warm up both sides
                for name, dt in zip(times, (t1 - t, t2 - t1, t3 - t2)):
                    times[name].append(dt)
    return list(times.items())


def fixed_cost(prompts: list[list[dict]], calls: int) -> list[tuple[str, list[float]]]:
    """Per-call latency through a gateway (in this process, records in memory) whose backend costs nothing."""
    from evoharness.runtime.backends import Backend, GenOutput
    from evoharness.runtime.gateway import Gateway, GatewayServer

    class Instant(Backend):
        async def _generate(self, p):
            return GenOutput(
                list(range(600)), list(range(16)), [-1.0] * 16, "<think>x</think><action>look</action>", [], "stop", 0
            )

    out = []
    with GatewayServer(Gateway([Instant("instant")], served_model="mini")) as srv, httpx.Client() as client:
        xs = []
        for k in range(calls):
            t = time.perf_counter()
            r = client.post(
                f"{srv.url}/chat/completions",
                headers={"X-Execution-Id": f"f{k % 64}"},
                json={
                    "model": "mini",
                    "messages": prompts[k % len(prompts)],
                    "max_tokens": 16,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            xs.append(time.perf_counter() - t)
            assert r.status_code == 200
        out.append(("httpx, same process as the gateway", xs[10:]))
    return out


def lockstep(model_dir: Path, prompts: list[list[dict]], turns: int, max_tokens: int) -> tuple[float, int]:
    """The in-process ideal: all executions' calls of a turn in one `generate`."""
    tok = load_tokenizer(model_dir)
    engine = Engine(load_model(model_dir), tok)
    msgs = [list(p) for p in prompts]
    t, n_tok = time.perf_counter(), 0
    for _ in range(turns):
        ids = [
            tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
                "input_ids"
            ]
            for m in msgs
        ]
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
            r = await client.post(
                f"{url}/chat/completions",
                headers={"X-Execution-Id": f"exec{k}"},
                json={
                    "model": "mini",
                    "messages": msgs,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            body = r.json()
            n += body["usage"]["completion_tokens"]
            msgs = msgs + [
                {"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""},
                {"role": "user", "content": "Nothing happens."},
            ]
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
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("command: OMP_NUM_THREADS=1 python benchmarks/bench_gateway.py " + " ".join(sys.argv[1:]))
    print("uptime at start:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    prompts = first_prompts(a.executions)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "mini"
        build_model(d, prompts)
        tok = load_tokenizer(d)
        plen = [len(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)) for p in prompts]
        print(
            f"model: mini preset ({sum(p.numel() for p in load_model(d).parameters()) / 1e6:.2f}M params), "
            f"torch threads 1; prompts: first-turn BPE prompts of real valid_seen games "
            f"({statistics.median(plen):.0f} chars median)\n"
        )

        print(f"## Overhead per call ({a.calls} calls one at a time; ms)\n")
        print("| path | max_tokens | median | p90 | overhead vs direct (median) |")
        print("|---|---|---|---|---|")
        for mt in (1, a.max_tokens):
            rows = overhead(d, prompts, a.calls, mt, Path(tmp))
            base = statistics.median(rows[0][1])
            for name, xs in rows:
                med = statistics.median(xs)
                extra = "" if name == "engine direct" else f"{(med - base) * 1e3:+.1f} ms"
                print(f"| {name} | {mt} | {med * 1e3:.1f} | {pct(xs, 0.9) * 1e3:.1f} | {extra} |")

        print("\n## The gateway's own cost: a backend that answers at once (HTTP, validation, routing, record)\n")
        print("| client | median ms | p90 ms |")
        print("|---|---|---|")
        for name, xs in fixed_cost(prompts, 200):
            print(f"| {name} | {statistics.median(xs) * 1e3:.2f} | {pct(xs, 0.9) * 1e3:.2f} |")

        n_calls = a.executions * a.turns
        print(
            f"\n## Throughput: {a.executions} concurrent executions x {a.turns} sequential calls "
            f"(max_tokens {a.max_tokens})\n"
        )
        print(
            f"Each path run {a.repeats} times, paths interleaved (the machine is shared); calls/s and tok/s "
            "from the median wall time.\n"
        )
        print("| path | wall s (each run) | calls/s | new tok/s | call latency median / p90 (s, last run) |")
        print("|---|---|---|---|---|")
        runs: dict[str, list[tuple[float, int, list[float]]]] = {}
        names = {
            "lock": f"in-process lock-step ({a.executions} per generate)",
            0: "`evoharness serve`, in-process engine",
        }
        if a.workers:
            names[a.workers] = f"`evoharness serve --workers {a.workers}`"
        for r in range(a.repeats):
            wall, n_tok = lockstep(d, prompts, a.turns, a.max_tokens)
            runs.setdefault("lock", []).append((wall, n_tok, []))
            for workers in [0] + ([a.workers] if a.workers else []):
                with Served(d, Path(tmp) / f"rec_tp_{workers}_{r}", workers) as srv:
                    runs.setdefault(workers, []).append(agents(srv.url, prompts, a.turns, a.max_tokens))
        for key, rs in runs.items():
            walls = [x[0] for x in rs]
            med = statistics.median(walls)
            n_tok = rs[0][1]
            lat = rs[-1][2]
            lat_s = f"{statistics.median(lat):.2f} / {pct(lat, 0.9):.2f}" if lat else "-"
            print(
                f"| {names[key]} | {' / '.join(f'{w:.1f}' for w in walls)} | {n_calls / med:.1f} | "
                f"{n_tok / med:.0f} | {lat_s} |"
            )
    print("\nuptime at end:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
