"""Decode throughput: the project's engine vs `transformers` `generate`.

16 concurrent prompts of ~300 tokens (ALFWorld-style text), 32 new tokens each,
greedy, stop tokens disabled so every sequence decodes all 32 tokens; fp32 on
CPU. Prints one table row per (model size, decoder).

    python benchmarks/bench_decode.py [--sizes tiny small] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from evoharness.engine import Engine, GenRequest  # noqa: E402
from evoharness.models.init import count_params, init_model  # noqa: E402
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402

REACT = Path(__file__).resolve().parents[2] / "shared/data/react/alfworld_3prompts.json"


def corpus() -> list[str]:
    if REACT.is_file():
        return list(json.loads(REACT.read_text()).values())
    words = "you are in the middle of a room looking around you see cabinet 1 a fridge 1 go to take put open close".split()
    g = torch.Generator().manual_seed(0)
    return [" ".join(words[i] for i in torch.randint(len(words), (4000,), generator=g).tolist())]


def prompts(tok, n: int, length: int, system_len: int = 0) -> list[list[int]]:
    """`n` chat prompts of `length` +-10% tokens; the first `system_len` tokens
    (a system message) are the same in all of them, the rest differ."""
    ids = tok.encode("\n".join(corpus()), add_special_tokens=False)
    step = max(1, (len(ids) - 2 * length) // n)
    head = tok.apply_chat_template([{"role": "system", "content": tok.decode(ids[-system_len:]) if system_len else ""}],
                                   tokenize=False)
    head = tok.encode(head, add_special_tokens=False)
    out = []
    for i in range(n):
        want = length - length // 10 + (i * length // 5) // n - len(head)
        user = tok.decode(ids[i * step: i * step + want])
        msgs = [{"role": "user", "content": user}]
        body = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
        out.append(head + body)
    return out


def bench(model, tok, batch: list[list[int]], new: int, repeats: int) -> dict[str, float]:
    eng = Engine(model, tok, stop_ids=[])
    sup = list(range(len(tok), model.config.vocab_size)) or None
    pad = tok.pad({"input_ids": batch}, return_tensors="pt", padding_side="left")

    def run_engine():
        out = eng.generate([GenRequest(p) for p in batch], max_new_tokens=new)
        assert all(len(r.token_ids) == new for r in out)

    def run_generate():
        out = model.generate(**pad, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             suppress_tokens=sup, pad_token_id=tok.pad_token_id)
        assert out.shape[1] == pad["input_ids"].shape[1] + new

    res = {k: float("inf") for k in ("engine", "hf_generate", "engine_cpu", "hf_generate_cpu")}
    fns = {"engine": run_engine, "hf_generate": run_generate}
    with torch.inference_mode():
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(repeats):  # alternate, so load changes on the shared machine hit both alike
            for name, fn in fns.items():
                t, c = time.perf_counter(), time.process_time()
                fn()
                res[name] = min(res[name], time.perf_counter() - t)
                res[name + "_cpu"] = min(res[name + "_cpu"], time.process_time() - c)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--system-len", type=int, default=120, help="shared system-message tokens in the 2nd scenario")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tok = train_tokenizer(corpus())
    scenarios = {"distinct": prompts(tok, a.n, a.prompt_len), "shared_sys": prompts(tok, a.n, a.prompt_len, a.system_len)}
    lens = [len(p) for p in scenarios["distinct"]]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine), "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}")
    print(f"{a.n} chat prompts x {min(lens)}-{max(lens)} tokens, {a.new} new tokens each, greedy, fp32 CPU, "
          f"best of {a.repeats}; new tok/s includes the prefill")
    print(f"scenarios: distinct = no common prefix; shared_sys = the same ~{a.system_len}-token system message first")
    print("tok/s = new tokens per wall second; cpu tok/s = per CPU second of this process (robust to other load)")
    print(f"{'size':<6} {'params':>7} {'prompts':<11} {'engine tok/s':>13} {'generate tok/s':>15} {'speedup':>8}"
          f" {'engine cpu tok/s':>17} {'generate cpu tok/s':>19} {'cpu speedup':>12}")
    for size in a.sizes:
        model = init_model(size, tok, seed=0)
        for name, batch in scenarios.items():
            r = bench(model, tok, batch, a.new, a.repeats)
            e, g, ec, gc = (a.n * a.new / r[k] for k in ("engine", "hf_generate", "engine_cpu", "hf_generate_cpu"))
            print(f"{size:<6} {count_params(model) / 1e6:>6.1f}M {name:<11} {e:>13.0f} {g:>15.0f} {e / g:>7.2f}x"
                  f" {ec:>17.0f} {gc:>19.0f} {ec / gc:>11.2f}x", flush=True)


if __name__ == "__main__":
    main()
