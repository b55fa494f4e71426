"""Sharded (FSDP2, `train.sharded`) vs one-process training steps on this CPU, side by side.

One step = the same global batch (`--rows` rows of `--seq` random tokens, every position a target,
one row per forward/backward), `train.sft.completion_loss` normalised over the batch, global-norm
clipping and AdamW, as `train_sft` runs it. Configurations, each in fresh processes (so peak RSS
is its own):

- one process with all cores' threads, and with one thread;
- 2 gloo ranks x 1 thread (each rank half of the rows; ``reshard_after_forward`` on and off; with
  activation checkpointing).

Reported: the median step time over steps 2..N (rank 0's: ranks run in lockstep), the
parameter + gradient + AdamW bytes one process or rank holds (its shards), and peak RSS per
process (``ru_maxrss``; Python, torch and gloo buffers included).

    python benchmarks/bench_sharded.py [--sizes tiny small] [--steps 5] [--rows 4] [--seq 512]

Writes benchmarks/results/bench_sharded.txt.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from evoharness.config.scale import ShardConfig  # noqa: E402
from evoharness.models.init import count_params, init_model, load_model  # noqa: E402
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402
from evoharness.train.distributed import clip_grad_norm  # noqa: E402
from evoharness.train.launch import current_group, launch_ranks  # noqa: E402
from evoharness.train.sft import completion_loss  # noqa: E402
from evoharness.train.sharded import shard_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import corpus  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "bench_sharded.txt"
# (label, ranks, threads per process, ShardConfig fields)
CONFIGS = [
    ("1 process", 1, 0, {}),
    ("1 process", 1, 1, {}),
    ("2 ranks FSDP2", 2, 1, {}),
    ("2 ranks FSDP2 no reshard", 2, 1, {"reshard_after_forward": False}),
    ("2 ranks FSDP2 + act. ckpt", 2, 1, {"activation_checkpointing": True}),
]


def _state_mb(model, opt) -> float:
    """This process's parameter, gradient and AdamW moment bytes (a sharded rank: its shards)."""

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    n = sum(local(p).numel() * local(p).element_size() * 2 for p in model.parameters())  # + the gradient
    n += sum(
        local(v).numel() * local(v).element_size()
        for st in opt.state.values()
        for k, v in st.items()
        if k != "step" and torch.is_tensor(v)
    )
    return n / 2**20


def train_steps(model_dir: str, rows: list[torch.Tensor], steps: int, shard: dict, out: str) -> None:
    """`steps` optimizer steps on this process's share of `rows`; writes its timings and memory."""
    group = current_group()
    rank, world = (group.rank, group.world) if group is not None else (0, 1)
    model = load_model(model_dir).train()
    if group is not None:
        shard_model(model, ShardConfig(ranks=world, **shard), group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_target = sum(r.shape[1] - 1 for r in rows)
    mine = rows[rank::world]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        ctx = group.lockstep(model, grad=True) if group is not None else torch.enable_grad()
        with ctx:
            for ids in mine:
                loss, _ = completion_loss(model, ids, ids)
                (loss / n_target).backward()
        clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(f"{out}.{rank}.json").write_text(
        json.dumps({"times": times, "rss_mb": rss_mb, "state_mb": _state_mb(model, opt)})
    )


def _driver(model_dir: str, rows: list[torch.Tensor], steps: int, ranks: int, threads: int, shard: dict, out: str):
    """A fresh process for one configuration (peak RSS of its own)."""
    if ranks == 1:
        torch.set_num_threads(threads or os.cpu_count() or 1)
        train_steps(model_dir, rows, steps, shard, out)
    else:  # launch_ranks gives each rank cpus // ranks threads
        launch_ranks(ranks, train_steps, (model_dir, rows, steps, shard, out))


def run_config(model_dir: str, rows, steps: int, ranks: int, threads: int, shard: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "r")
        p = mp.get_context("spawn").Process(target=_driver, args=(model_dir, rows, steps, ranks, threads, shard, out))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"configuration failed (exit {p.exitcode})")
        return [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    tok = train_tokenizer(corpus())
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, len(tok), (1, a.seq), generator=g) for _ in range(a.rows)]
    load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"$ python benchmarks/bench_sharded.py --sizes {' '.join(a.sizes)} --steps {a.steps} "
        f"--rows {a.rows} --seq {a.seq}",
        f"uptime before: {load0}",
        f"{os.cpu_count()} cores (shared machine), torch {torch.__version__}, fp32 CPU; one step = {a.rows} rows x "
        f"{a.seq} tokens, one row per forward/backward, clip + AdamW; median of steps 2..{a.steps}",
        "",
        f"{'size':<6} {'params':>7}  {'configuration':<27} {'threads':>7} {'s/step':>7} {'tok/s':>7} "
        f"{'state MB/proc':>13} {'peak RSS MB/proc':>17}",
    ]
    print("\n".join(lines))
    for size in a.sizes:
        with tempfile.TemporaryDirectory() as d:
            params = count_params(init_model(size, tok, Path(d), seed=0))
            for label, ranks, threads, shard in CONFIGS:
                res = run_config(d, rows, a.steps, ranks, threads, shard)
                step_s = statistics.median(res[0]["times"][1:])
                thr = threads or (os.cpu_count() or 1) // ranks
                state = " / ".join(f"{r['state_mb']:.0f}" for r in res)
                rss = " / ".join(f"{r['rss_mb']:.0f}" for r in res)
                line = (
                    f"{size:<6} {params / 1e6:>6.1f}M  {label:<27} {f'{ranks}x{thr}':>7} {step_s:>7.2f} "
                    f"{a.rows * a.seq / step_s:>7.0f} {state:>13} {rss:>17}"
                )
                print(line)
                lines.append(line)
    load1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines += ["", f"uptime after: {load1}"]
    print(lines[-1])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
