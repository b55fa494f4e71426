"""Publishing and loading a weights version: files (`FileExchange`) vs Ray's object store (`RayExchange`).

    python benchmarks/bench_weight_sync.py [repeats]   # default 5: ~1 min

For a micro Qwen3 (tests/micro_model.py's shape, vocab 1024) and a ~30M one (hidden 512, 8
layers, vocab 4096), both fp32 with tied embeddings, built from scratch: `WeightStore.publish`
(what the core does after each update) and `WeightStore.load` into a second copy (what another
cell does at a sync), in this process, median of `repeats` (range). Files go to a temporary
directory on local disk; Ray runs a local head (the keeper actor on this node, so a load is a
same-node object store read: a cell on another node adds the network transfer). One torch thread.
The machine is shared: `uptime` is printed with the table. Results:
benchmarks/results/bench_weight_sync.txt.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from evoharness.runtime.cell import WeightStore  # noqa: E402
from evoharness.runtime.exchange import FileExchange, unique_tensors  # noqa: E402

SIZES = {
    "micro": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
    ),
    "30M": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=4096,
    ),
}


def build(shape: dict) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=True, **shape)).eval()


def time_sync(store: WeightStore, a: torch.nn.Module, b: torch.nn.Module, repeats: int) -> tuple[list, list]:
    """Seconds of each publish of `a` and each load into `b` (a new version each time)."""
    pub, load = [], []
    for v in range(1, repeats + 1):
        t0 = time.perf_counter()
        store.publish(a, v)
        pub.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.load(b, v)
        load.append(time.perf_counter() - t0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    return pub, load


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"


def main() -> None:
    import ray

    from evoharness.runtime.ray_exchange import RayExchange

    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench_weight_sync_"))
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2, log_to_driver=False)
    ray_ex = RayExchange()
    lines = [
        f"Weights sync per exchange: WeightStore.publish then .load into a second copy, fp32, median of {repeats} "
        "(range), seconds; Ray: local head, same-node reads",
        f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}",
        "",
        "| model | params | MB | exchange | publish s | load s |",
        "|---|---|---|---|---|---|",
    ]
    try:
        for name, shape in SIZES.items():
            a, b = build(shape), build(shape)
            with torch.no_grad():
                for p in a.parameters():
                    p.add_(0.01)
            n = sum(p.numel() for p in a.parameters())
            mb = sum(t.numel() * t.element_size() for t in unique_tensors(a.state_dict()).values()) / 2**20
            for label, ex in (("files", FileExchange(tmp / name)), ("ray", ray_ex)):
                pub, load = time_sync(WeightStore(tmp / name, ex), a, b, repeats)
                lines.append(f"| {name} | {n / 1e6:.2f}M | {mb:.1f} | {label} | {fmt(pub)} | {fmt(load)} |")
                print(lines[-1], flush=True)
    finally:
        ray_ex.shutdown()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out = ROOT / "benchmarks" / "results" / "bench_weight_sync.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
