"""SFT training throughput of `train_sft` (the real code path) on this CPU.

Synthetic harness-style examples (~`--prompt-len` prompt tokens + ~40
completion tokens), fp32, length-bucketed batches of `--batch-tokens` padded
tokens; tok/s counts every token a step runs (prompt + completion + padding),
target tok/s only the completion tokens that carry loss. Median over steps
2..N (step 1 warms up).

    python benchmarks/bench_sft.py [--sizes tiny small] [--steps 6] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from evoharness.config.sft import SFTConfig
from evoharness.models.init import count_params, init_model  # noqa: E402
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402
from evoharness.train.sft import train_sft

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import corpus  # noqa: E402


def examples(tok, n: int, prompt_len: int) -> list[dict]:
    ids = tok.encode("\n".join(corpus()), add_special_tokens=False)
    step = max(1, (len(ids) - 2 * prompt_len) // n)
    out = []
    for i in range(n):
        want = prompt_len - prompt_len // 5 + (i * 2 * prompt_len // 5) // n  # +-20%
        user = tok.decode(ids[i * step : i * step + want])
        out.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a household agent."},
                    {"role": "user", "content": user},
                ],
                "completion": f"<think>the object may be in cabinet {i % 9 + 1}, go and look there first</think>"
                f"<action>go to cabinet {i % 9 + 1}</action>",
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=500)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tok = train_tokenizer(corpus())
    exs = examples(tok, 64, a.prompt_len)
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine), "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, fp32 CPU, "
        f"prompts ~{a.prompt_len} tokens (+-20%), batch {a.batch_tokens} padded tokens, median of steps 2..{a.steps}"
    )
    print(f"{'size':<6} {'params':>8} {'tok/s':>8} {'target_tok/s':>13} {'s/step':>7}")
    for size in a.sizes:
        with tempfile.TemporaryDirectory() as d:
            model = init_model(size, tok, Path(d) / "init", seed=0)
            cfg = SFTConfig(
                max_steps=a.steps,
                batch_tokens=a.batch_tokens,
                ckpt_every=0,
                progress=False,
                max_prompt_tokens=2 * a.prompt_len,
            )
            train_sft(cfg, exs, Path(d) / "init", Path(d) / "run")
            recs = [json.loads(ln) for ln in (Path(d) / "run/metrics.jsonl").read_text().splitlines()][1:]
            tps = statistics.median(r["tok_per_s"] for r in recs)
            ratio = statistics.median(r["target_tokens"] / r["tokens"] for r in recs)
            print(
                f"{size:<6} {count_params(model) / 1e6:>7.1f}M {tps:>8.0f} {tps * ratio:>13.0f} "
                f"{statistics.median(r['tokens'] / r['tok_per_s'] for r in recs):>7.2f}"
            )


if __name__ == "__main__":
    main()
