"""LoRA vs full fine-tuning: one GRPO update's time and memory on this CPU (`train.lora`).

Each (model size, arm) runs in a fresh subprocess, so its peak RSS is its own: the worker loads
the model the way an RL cell does (`recipes.trained_cell`), builds the `train.trainer.Trainer`
with the KL term on (``kl_beta`` 0.01, the default) and runs ``--steps`` updates (accumulate +
AdamW apply) of the same rows: ``--rows`` turns of ``--prompt`` prompt + ``--completion``
completion tokens (random ids).

- full: fp32 masters for every weight, the KL reference a second copy of the model.
- lora: the base frozen, r/alpha adapters on every attention and MLP projection (the fp32
  masters), the reference the same model with its adapters off.

Columns: trainable parameters; optimizer state (AdamW moments, bytes); weights resident (the
model's and the reference's tensors, bytes); peak RSS of the process (ru_maxrss: imports, weights,
activations, gradients and AdamW state); median seconds per update over updates 2..N (update 1
warms up), wall and CPU seconds of the process at ``--threads`` torch threads: on a shared machine
the CPU seconds are the steadier figure, and only arms of the same run compare (the load is
recorded). ``--append`` adds a run (e.g. another row shape) to the results file.

    python benchmarks/bench_lora.py [--sizes mini small base] [--steps 5] [--threads 1] [--r 16]
        [--rows 8] [--prompt 256] [--completion 32] [--append]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "bench_lora.txt"


def worker(args: argparse.Namespace) -> dict:
    """One arm: load, build the trainer, time the updates; the measurements as a dict."""
    from evoharness.config.rl import GRPOConfig
    from evoharness.config.scale import LoRAConfig
    from evoharness.models.init import count_params, load_model, load_tokenizer
    from evoharness.train.grpo import TurnSample
    from evoharness.train.lora import apply_lora
    from evoharness.train.step import streamed_rows
    from evoharness.train.trainer import Trainer

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model)
    lora_on = args.arm == "lora"
    model = load_model(args.model, "cpu", torch.float32)
    lora = apply_lora(model, LoRAConfig(r=args.r, alpha=2.0 * args.r), seed=0) if lora_on else None
    ref = lora.reference() if lora_on else load_model(args.model, "cpu", torch.float32).requires_grad_(False)
    trainer = Trainer(model, tok, GRPOConfig(kl_beta=0.01, lr=1e-4, micro_batch_size=args.rows), ref_model=ref)
    g = torch.Generator().manual_seed(0)
    vocab = len(tok)
    rows = streamed_rows(
        [
            TurnSample(
                torch.randint(vocab, (args.prompt,), generator=g).tolist(),
                torch.randint(vocab, (args.completion,), generator=g).tolist(),
                [-7.0] * args.completion,  # behaviour log-probs near uniform: ratios clip as in early RL
                1.0 if i % 2 else -1.0,
                f"e{i}",
            )
            for i in range(args.rows)
        ],
        args.rows,
    )
    times, cpu = [], []
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.accumulate(rows)
        trainer.apply(1e-4, step)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt_bytes = sum(
        t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    tensors = {p.data_ptr(): p for p in model.parameters()}
    if not lora_on:
        tensors.update({p.data_ptr(): p for p in ref.parameters()})
    weight_bytes = sum(p.numel() * p.element_size() for p in tensors.values())
    return {
        "params": count_params(model) - (trainable if lora_on else 0),  # the base model's
        "trainable": trainable,
        "optimizer_bytes": opt_bytes,
        "weight_bytes": weight_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_s": statistics.median(times[1:] or times),
        "step_cpu_s": statistics.median(cpu[1:] or cpu),
        "steps": times,
    }


def build_models(root: Path, sizes: list[str]) -> dict[str, Path]:
    """A byte-level BPE tokenizer (2,048 tokens) and a from-scratch model per preset under `root`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_decode import corpus

    from evoharness.models.init import init_model
    from evoharness.models.tokenizer import build_tokenizer

    tok = build_tokenizer(corpus(), root / "tok", vocab_size=2048)
    for size in sizes:
        init_model(size, tok, out_dir=root / size, seed=0)
    return {size: root / size for size in sizes}


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["mini", "small", "base"], help="models.init presets")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--r", type=int, default=16, help="LoRA rank (alpha = 2r)")
    ap.add_argument("--rows", type=int, default=8, help="turns per update (one micro-batch)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm", choices=["full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--append", action="store_true", help="add this run to --out instead of replacing it")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    shape = ["--steps", str(args.steps), "--threads", str(args.threads), "--r", str(args.r)]
    shape += ["--rows", str(args.rows), "--prompt", str(args.prompt), "--completion", str(args.completion)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    lines = [
        f"# python benchmarks/bench_lora.py --sizes {' '.join(args.sizes)} {' '.join(shape)}",
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        f"# one GRPO update (kl_beta 0.01) of {args.rows} turns x ({args.prompt} prompt + {args.completion} "
        f"completion) tokens, fp32; lora: r {args.r}, alpha {2 * args.r}, all attention and MLP projections",
        f"# load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}",
        "",
        "| model | params | arm | trainable | optimizer MiB | weights+ref MiB | peak RSS MiB "
        "| s/update | CPU s/update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    data = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(Path(tmp), args.sizes)
        for size, path in models.items():
            for arm in ("full", "lora"):
                cmd = [sys.executable, __file__, "--worker", "--arm", arm, "--model", str(path), *shape]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
                m = json.loads(res.stdout.strip().splitlines()[-1])
                data[f"{size}/{arm}"] = m
                lines.append(
                    f"| {size} | {m['params'] / 1e6:.2f}M | {arm} | {m['trainable']:,} | {mib(m['optimizer_bytes'])} "
                    f"| {mib(m['weight_bytes'])} | {mib(m['peak_rss_bytes'])} "
                    f"| {m['step_s']:.3f} | {m['step_cpu_s']:.3f} |"
                )
                print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"# load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for size in args.sizes:
        full, lo = data[f"{size}/full"], data[f"{size}/lora"]
        ratio = {k: lo[k] / full[k] for k in ("step_s", "step_cpu_s", "optimizer_bytes", "peak_rss_bytes")}
        lines.append(
            f"# {size}: lora/full  s/update {ratio['step_s']:.2f}x (CPU s {ratio['step_cpu_s']:.2f}x), optimizer "
            f"state {ratio['optimizer_bytes']:.3f}x, peak RSS {ratio['peak_rss_bytes']:.2f}x"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shape_key = f"rows{args.rows}_prompt{args.prompt}_completion{args.completion}"
    old = json.loads(out.with_suffix(".json").read_text()) if args.append and out.with_suffix(".json").exists() else {}
    with open(out, "a" if args.append else "w") as f:
        f.write(("\n" if args.append else "") + "\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({**old, shape_key: data}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
