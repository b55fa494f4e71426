"""The same RL runtime on each transport: cell processes or Ray actors, calls direct or through the gateway.

    python benchmarks/rl_transport.py [steps] [cells] [schedule] [repeats]   # default 3, 3, elastic, 3: ~10 min

The workload of `benchmarks/rl_runtime.py` (micro Qwen3, 4 games x 2 samples,
T_max mix 3/3/3/12, BPE harness with the action grammar, seed 3, one torch thread
per cell), run by `recipes.rl.train_rl` under one schedule, on ``runtime.backend``
local | ray and ``runtime.via_gateway`` off | on. Per row (the run's ``runtime.json``): the driver's seconds per
step, idle ratio per role, role switches, migrations, calls re-issued, drains
through the gateway and their latency (drain start until the last call that
was in flight on the cell has its answer from another cell), aborted turns,
and the last step's success and reward (equal on every row: same episodes,
same updates). Each transport runs `repeats` times, the four interleaved; the
row is the run with the median s/step, with the range over the repeats. The
machine is shared: the load is printed with the table.
Results: benchmarks/results/rl_transport.txt.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def run(model: Path, out: Path, steps: int, schedule: str, cells: int, backend: str, via_gateway: bool) -> dict:
    """`recipes.rl.train_rl` on `rl_runtime.run`'s workload with these ``runtime`` settings."""
    from rl_runtime import run as run_rl

    return run_rl(model, out, steps, schedule, cells, backend=backend, via_gateway=via_gateway)


def main() -> None:
    from rl_runtime import build_model

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    schedule = sys.argv[3] if len(sys.argv) > 3 else "elastic"
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    tmp = Path(tempfile.mkdtemp(prefix="rl_transport_"))
    try:
        build_model(tmp / "model")
        lines = [
            f"RL runtime per transport: {schedule}, K={k}, {steps} steps, micro Qwen3, 4 games x 2 samples, "
            f"T_max mix 3/3/3/12; median of {repeats} interleaved runs (range)",
            "| backend | calls | s/step | idle R/T | switches | migrations | re-issued calls | drains | "
            "drain s mean/max | aborted | success | reward |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        rows = [(b, gw) for b in ("local", "ray") for gw in (False, True)]
        runs: dict[tuple, list[dict]] = {row: [] for row in rows}
        for i in range(repeats):
            for backend, gw in rows:
                out = tmp / f"{backend}{int(gw)}_{i}"
                runs[(backend, gw)].append(run(tmp / "model", out, steps, schedule, k, backend, gw))
                shutil.rmtree(out, ignore_errors=True)
                r = runs[(backend, gw)][-1]
                print(backend, gw, i, r.get("timing_s/step", r.get("error")), flush=True)
        for backend, gw in rows:
            via = "gateway" if gw else "direct"
            ok = sorted((r for r in runs[(backend, gw)] if "error" not in r), key=lambda r: r["timing_s/step"])
            if not ok:
                lines.append(f"| {backend} | {via} | {runs[(backend, gw)][0]['error']} |")
                continue
            r = ok[len(ok) // 2]
            drains = r.get("runtime/drains", 0)
            mean = r.get("runtime/drain_s_total", 0.0) / drains if drains else 0.0
            lines.append(
                f"| {backend} | {via} | {r['timing_s/step']:.2f} ({ok[0]['timing_s/step']:.2f}-"
                f"{ok[-1]['timing_s/step']:.2f}) | "
                f"{r['runtime/idle_rollout']:.2f}/{r['runtime/idle_train']:.2f} | "
                f"{r['runtime/switches']:.0f} | {r['runtime/migrations']:.0f} | "
                f"{r['runtime/reissued_calls']:.0f} | {drains:.0f} | "
                f"{mean:.3f}/{r.get('runtime/drain_s_max', 0.0):.3f} | {r['runtime/aborted_turns']:.0f} | "
                f"{r['success']:.2f} | {r['reward']:.3f} |"
            )
        lines.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        print("\n".join(lines))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
