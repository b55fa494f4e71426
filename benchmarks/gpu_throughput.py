"""GPU throughput at real Qwen3 sizes: SFT train tokens/s and decode tokens/s.

For a rented GPU (written for one H200). Random-initialised Qwen3-shaped models
(0.6B / 1.7B / 4B layouts from the public configs; ``--sizes 8b`` adds 8B),
no weights or hub needed. Per size:

- train: the SFT step of `evoharness.train.sft` (fp32 master weights, bf16
  autocast, AdamW, loss only on the completion tokens, LM head only on those
  positions); `--train-rows` rows of `--train-len` tokens, the last 64 of each
  row are the completion; tok/s counts all tokens; MFU against 989 TFLOP/s
  (H100/H200 dense bf16) with 6 * params * tokens;
- decode: the project's two engines (`StaticEngine`, the static-KV one the
  rollouts use, and `Engine`, the module-forward one) and `transformers`
  `generate`, side by side:
  `--n` prompts of `--prompt-len` random tokens, `--new` new tokens each,
  greedy, bf16 weights, stop tokens off; new tok/s includes the prefill.

Run from the repository root with only torch + transformers installed:

    python benchmarks/gpu_throughput.py               # ~2.5 minutes on an H200 (benchmarks/results/gpu_throughput.txt)
    python benchmarks/gpu_throughput.py --sizes 0.6b 1.7b 4b 8b

On a machine without CUDA it prints "no CUDA" and exits 0 (``--cpu-smoke``
runs a micro shape on CPU to check the script itself).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from evoharness.engines.grammar import GenRequest  # noqa: E402  (torch + transformers only)
from evoharness.engines.hf import Engine
from evoharness.engines.static import StaticEngine
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402

# Public Qwen3 layouts (hidden, layers, heads, kv heads, intermediate, tied embeddings).
SHAPES = {
    "micro": (64, 2, 4, 2, 128, True),
    "0.6b": (1024, 28, 16, 8, 3072, True),
    "1.7b": (2048, 28, 16, 8, 6144, True),
    "4b": (2560, 36, 32, 8, 9728, True),
    "8b": (4096, 36, 32, 8, 12288, False),
}
PEAK_BF16 = 989e12
DEADLINE_S = 330  # stop starting new measurements after this (the script must finish in ~6 min)


def build(size: str, vocab: int, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    h, layers, heads, kv, inter, tied = SHAPES[size]
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=128 if h >= 1024 else 16,
        intermediate_size=inter,
        tie_word_embeddings=tied,
        max_position_embeddings=32768,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype)


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_tok_s(size, vocab, device, rows, length, steps) -> tuple[float, float, int]:
    """SFT steps (as in train/sft.py): returns (tok/s, MFU, params)."""
    model = build(size, vocab, device, torch.float32)
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.01, fused=device.type == "cuda"
    )
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, 1000, (rows, length), generator=g).to(device)
    labels = torch.full_like(ids, -100)
    labels[:, -64:] = ids[:, -64:]
    times = []
    for _ in range(steps + 2):
        sync(device)
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
            keep = labels[:, 1:] != -100
            logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()
            loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t)
    n = n_params(model)
    del model, opt
    tok_s = rows * length / (sum(times[2:]) / steps)
    return tok_s, 6 * n * tok_s / PEAK_BF16, n


def decode_tok_s(size, vocab, device, tok, n, prompt_len, new) -> dict[str, float]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(size, vocab, device, dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(1)
    prompts = [torch.randint(7, len(tok), (prompt_len - 32 + (i * 64) // n,), generator=g).tolist() for i in range(n)]
    eng = Engine(model, tok, stop_ids=[])
    static = StaticEngine(model, tok, stop_ids=[])
    pad = tok.pad({"input_ids": prompts}, return_tensors="pt", padding_side="left").to(device)
    sup = list(range(len(tok), vocab))

    def engine():
        eng.generate([GenRequest(p) for p in prompts], max_new_tokens=new)

    def static_engine():
        static.generate([GenRequest(p) for p in prompts], max_new_tokens=new)

    def generate():
        model.generate(
            **pad,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            suppress_tokens=sup,
            pad_token_id=tok.pad_token_id,
        )

    out = {}
    with torch.inference_mode():
        for name, fn in (("static", static_engine), ("engine", engine), ("hf_generate", generate)):
            fn()
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            out[name] = n * new / (time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b", "4b"], choices=list(SHAPES))
    ap.add_argument("--train-rows", type=int, default=4)
    ap.add_argument("--train-len", type=int, default=2048)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--cpu-smoke", action="store_true", help="run the micro shape on CPU (checks the script)")
    a = ap.parse_args()
    if a.cpu_smoke:
        device, sizes = torch.device("cpu"), ["micro"]
        a.train_rows, a.train_len, a.train_steps, a.n, a.prompt_len, a.new = 2, 128, 1, 4, 64, 8
    elif not torch.cuda.is_available():
        print(
            "no CUDA: this script measures GPU throughput; nothing to do here "
            "(CPU figures: benchmarks/bench_sft.py, benchmarks/bench_decode.py)"
        )
        return
    else:
        device, sizes = torch.device("cuda"), a.sizes
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    t0 = time.perf_counter()
    tok = train_tokenizer(["go to fridge 1. You arrive at cabinet 12. take apple 1 from countertop 2."] * 50)
    vocab = 151936 if not a.cpu_smoke else 1024
    print(
        f"train: {a.train_rows} x {a.train_len} tokens/step, fp32 master + bf16 autocast, AdamW | "
        f"decode: {a.n} prompts x ~{a.prompt_len} tokens + {a.new} new, greedy, bf16"
    )
    print(
        f"{'size':<6} {'params':>7} {'train tok/s':>12} {'MFU':>6} {'static new tok/s':>17} "
        f"{'engine new tok/s':>17} {'generate new tok/s':>19}"
    )
    for size in sizes:
        if time.perf_counter() - t0 > DEADLINE_S:
            print(f"{size:<6} skipped (time budget)")
            continue
        row = [f"{size:<6}"]
        try:
            tps, mfu, n = train_tok_s(size, vocab, device, a.train_rows, a.train_len, a.train_steps)
            row += [f"{n / 1e9:>6.2f}B", f"{tps:>12.0f}", f"{100 * mfu:>5.1f}%"]
        except torch.OutOfMemoryError:
            row += [f"{'?':>7}", f"{'OOM':>12}", f"{'':>6}"]
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None
        try:
            d = decode_tok_s(size, vocab, device, tok, a.n, a.prompt_len, a.new)
            row += [f"{d['static']:>17.0f}", f"{d['engine']:>17.0f}", f"{d['hf_generate']:>19.0f}"]
        except torch.OutOfMemoryError:
            row += [f"{'OOM':>17}", f"{'OOM':>17}", f"{'OOM':>19}"]
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None
        print(" ".join(row), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
