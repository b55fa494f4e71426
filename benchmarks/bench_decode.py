"""Decode throughput side by side: HF `generate`, the module-forward engine
(``hf``, `evoharness.engines.hf.Engine`), the static-cache engine (``static``,
`evoharness.engines.StaticEngine`) and vLLM (when a vLLM python is given).

Prompts: ~300-token chat prompts (ALFWorld text) behind one shared ~120-token
system message; greedy, stop tokens disabled so every row decodes all
``--new`` tokens; fp32 CPU, 1 thread. For each (model, batch, decoder):

- prefill: a call with 1 new token (prompt tokens per second);
- decode: (end-to-end time - prefill time) for the remaining new tokens;
- end to end: ``--new`` new tokens per second, prefill included.

Each rate is given per wall second and per CPU second of this process (the
machine is shared: CPU seconds are the robust number). Best of ``--repeats``,
decoders alternated within a repeat so load changes hit them alike. Startup
(engine construction + first call) and weight sync (load new weights in place
+ whatever the engine needs before its next call) are timed once per model.

    python benchmarks/bench_decode.py [--sizes tiny small] [--batches 1 8 32 64] [--new 32]
        [--vllm-python .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# src/ must be on sys.path before the evoharness imports (run as a script, no install needed): hence noqa E402
from evoharness.engines import StaticEngine  # noqa: E402
from evoharness.engines.grammar import GenRequest  # noqa: E402
from evoharness.engines.hf import Engine  # noqa: E402
from evoharness.models.init import count_params, init_model, save_model  # noqa: E402
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402

REACT = ROOT.parent / "shared/data/react/alfworld_3prompts.json"


def corpus() -> list[str]:
    if REACT.is_file():
        return list(json.loads(REACT.read_text()).values())
    words = (
        "you are in the middle of a room looking around you see cabinet 1 a fridge 1 go to take put open close".split()
    )
    g = torch.Generator().manual_seed(0)
    return [" ".join(words[i] for i in torch.randint(len(words), (4000,), generator=g).tolist())]


def prompts(tok, n: int, length: int, system_len: int = 0) -> list[list[int]]:
    """`n` chat prompts of `length` +-10% tokens; the first `system_len` tokens
    (a system message) are the same in all of them, the rest differ."""
    ids = tok.encode("\n".join(corpus()), add_special_tokens=False)
    step = max(1, (len(ids) - 2 * length) // n)
    head = tok.apply_chat_template(
        [{"role": "system", "content": tok.decode(ids[-system_len:]) if system_len else ""}], tokenize=False
    )
    head = tok.encode(head, add_special_tokens=False)
    out = []
    for i in range(n):
        want = length - length // 10 + (i * length // 5) // n - len(head)
        user = tok.decode(ids[i * step : i * step + want])
        msgs = [{"role": "user", "content": user}]
        body = tok.encode(
            tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        out.append(head + body)
    return out


class Timer:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def decoders(model, tok) -> dict:
    """name -> (startup seconds, fn(batch, new) running one greedy call, fn() syncing new weights)."""
    sup = list(range(len(tok), model.config.vocab_size)) or None
    out = {}

    def gen(batch, new):
        pad = tok.pad({"input_ids": batch}, return_tensors="pt", padding_side="left")
        res = model.generate(
            **pad,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            suppress_tokens=sup,
            pad_token_id=tok.pad_token_id,
        )
        assert res.shape[1] == pad["input_ids"].shape[1] + new

    out["hf_generate"] = (0.0, gen, lambda: None)
    for name, cls in (("engine_hf", Engine), ("engine_static", StaticEngine)):
        with Timer() as t:
            eng = cls(model, tok, stop_ids=[])
            eng.generate([GenRequest([1, 2, 3])], 2)

        def run(batch, new, eng=eng):
            res = eng.generate([GenRequest(p) for p in batch], new)
            assert all(len(r.token_ids) == new for r in res)

        def sync(eng=eng):  # what the engine does before its next call after a weight load
            if hasattr(eng, "decoder"):
                eng.decoder.refresh()

        out[name] = (t.wall, run, sync)
    return out


def bench_vllm(python: str, model_dir: Path, batches: dict[int, list[list[int]]], new: int, repeats: int) -> dict:
    """Run benchmarks/vllm_decode_worker.py in the vLLM environment; its JSON results."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(
            {
                "model": str(model_dir),
                "batches": {str(b): p for b, p in batches.items()},
                "new": new,
                "repeats": repeats,
            },
            f,
        )
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="1")
    res = subprocess.run(
        [python, str(ROOT / "benchmarks/vllm_decode_worker.py"), f.name],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode or not line:
        print(f"# vLLM run failed (rc {res.returncode}): {res.stderr[-2000:]}", file=sys.stderr)
        return {}
    return json.loads(line[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--system-len", type=int, default=120)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vllm-python", default=None, help="python of an environment with vllm installed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = train_tokenizer(corpus())
    all_prompts = prompts(tok, max(a.batches), a.prompt_len, a.system_len)
    lens = [len(p) for p in all_prompts]
    print(f"$ python benchmarks/bench_decode.py {' '.join(sys.argv[1:])}")
    print(f"uptime at start: {os.popen('uptime').read().strip()}  (2 cores shared with other engineers)")
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; prompts {min(lens)}-{max(lens)} tokens "
        f"(~{a.system_len}-token shared system message), {a.new} new tokens, greedy, fp32, best of {a.repeats}"
    )
    print(
        "rates in tokens/s: prefill = prompt tokens, decode and e2e = new tokens; wall | cpu = per wall second | "
        "per CPU second of this process; x gen = vs HF generate (cpu)\n"
    )
    hdr = (
        "| model | batch | decoder | prefill wall | prefill cpu | decode wall | decode cpu | e2e wall | e2e cpu "
        "| decode x gen | e2e x gen |"
    )
    print(hdr)
    print("|---" * (hdr.count("|") - 1) + "|")
    extras = []
    for size in a.sizes:
        model = init_model(size, tok, seed=0)
        label = f"{size} {count_params(model) / 1e6:.1f}M"
        decs = decoders(model, tok)
        vres = {}
        if a.vllm_python:
            with tempfile.TemporaryDirectory() as d:
                save_model(model, tok, d)
                vres = bench_vllm(a.vllm_python, Path(d), {b: all_prompts[:b] for b in a.batches}, a.new, a.repeats)
        for B in a.batches:
            batch = all_prompts[:B]
            n_prompt = sum(map(len, batch))
            best = {}
            with torch.inference_mode():
                for _, run, _ in decs.values():
                    run(batch, 2)  # warm-up
                for _ in range(a.repeats):
                    for name, (_, run, _) in decs.items():
                        for new in (1, a.new):
                            with Timer() as t:
                                run(batch, new)
                            k = (name, new)
                            best[k] = (min(best.get(k, (9e9, 9e9))[0], t.wall), min(best.get(k, (9e9, 9e9))[1], t.cpu))
            rows = {name: best_rates(best[(name, 1)], best[(name, a.new)], n_prompt, B, a.new) for name in decs}
            if str(B) in vres.get("batches", {}):
                v = vres["batches"][str(B)]
                rows["vllm"] = best_rates(tuple(v["prefill"]), tuple(v["e2e"]), n_prompt, B, a.new)
            g = rows["hf_generate"]
            for name, r in rows.items():
                print(
                    f"| {label} | {B} | {name} | {r['pw']:.0f} | {r['pc']:.0f} | {r['dw']:.0f} | {r['dc']:.0f} | "
                    f"{r['ew']:.0f} | {r['ec']:.0f} | {r['dc'] / g['dc']:.1f}x | {r['ec'] / g['ec']:.1f}x |",
                    flush=True,
                )
        # startup and weight sync
        sd = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
        for name, (startup, _, sync) in decs.items():
            with Timer() as t:
                model.load_state_dict(sd, strict=False)
                sync()
            extras.append(f"| {label} | {name} | {startup:.2f} | {1e3 * t.wall:.1f} |")
        if vres:
            extras.append(f"| {label} | vllm | {vres['startup_s']:.1f} | {1e3 * vres['sync_s']:.1f} |")
    print("\n| model | decoder | startup s (construct + first call) | weight sync ms (load in place + pre-call work) |")
    print("|---|---|---|---|")
    print("\n".join(extras))
    print(f"\nuptime at end: {os.popen('uptime').read().strip()}")


def best_rates(prefill: tuple[float, float], e2e: tuple[float, float], n_prompt: int, B: int, new: int) -> dict:
    """Rates from the best (wall, cpu) seconds of a 1-token call and a `new`-token call."""
    # under heavy load the best wall times of the two calls can come from different repeats: a non-positive
    # difference has no meaning (printed as nan), the CPU columns stay usable
    dec = [e - p if e > p else float("nan") for e, p in zip(e2e, prefill)]
    return dict(
        pw=n_prompt / prefill[0],
        pc=n_prompt / prefill[1],
        dw=B * (new - 1) / dec[0],
        dc=B * (new - 1) / dec[1],
        ew=B * new / e2e[0],
        ec=B * new / e2e[1],
    )


if __name__ == "__main__":
    main()
