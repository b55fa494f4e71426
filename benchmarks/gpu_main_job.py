"""The main job at GPU scale on one lent GPU (issue 50): the same pipeline, report and paired tests
as ``make run``, with a ~10M-parameter student ('small' preset), four times the SFT steps and 100
GRPO steps.

Usage: python benchmarks/gpu_main_job.py [--out runs/gpu_main_job] [--results benchmarks/results/gpu_main_job]
                                        [--set KEY=VALUE ...]
       python benchmarks/gpu_main_job.py --cpu-smoke --out DIR --results DIR   (CI: the same code path on CPU)

Written for one H100 / H200 and about 8 minutes of device time: ``device=cuda`` moves SFT, GRPO
(trainer, rollouts, reference) and the student's evaluations onto the GPU (`RunConfig.device`);
wall-clock caps on SFT (``sft.max_minutes``, its cosine fitted to the steps the cap allows) and GRPO
(``rl.max_minutes``) end those stages early where the step budgets (`GPU_SETS`) would not fit, and
the report's Notes say the steps done. A
rerun with the same ``--out`` resumes the job, so a run cut off by the device's time limit is
finished by the next call. The report (``report.md`` and its figures, `main_job.publish`) shows the
paired success tests on valid_seen, the development games and the unseen-room panel, and the cost
test on the games both systems won; ``machine.txt`` names the GPU.

Without CUDA it prints "not run: no CUDA device" and exits 0 (no file written). ``--cpu-smoke`` runs
the smoke preset (configs/smoke.toml) with this script's settings that fit it, on CPU, so that a
change breaking the GPU run fails in CI first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
from main_job import load_average, publish  # noqa: E402

from evoharness.config.run import load_run_config, preset_path  # noqa: E402
from evoharness.pipeline import run_pipeline  # noqa: E402

# over configs/main_job.toml: a 10M model on the GPU, 4x SFT steps, 100 GRPO steps (one seed, no soup),
# each capped in minutes; the 16 host cores play the episodes (teacher traces, evaluations)
GPU_SETS = [
    "device=cuda",
    "model_preset=small",
    "sft.max_steps=8000",
    "sft.max_minutes=2.5",
    "sft.fit_schedule_to_budget=true",
    "sft.ckpt_every=2000",
    "rl.steps=100",
    "rl.max_minutes=2.0",
    "rl.soup_seeds=1",
    "rl.ckpt_every=50",
    "curve_games=0",
    "eval_workers=8",
    "threads=8",
]
# the same on CPU over configs/smoke.toml: its model and steps, this script's stage caps and checkpoints
SMOKE_SETS = [
    "device=cpu",
    "sft.max_minutes=2.5",
    "sft.fit_schedule_to_budget=true",
    "rl.max_minutes=2.0",
    "rl.soup_seeds=1",
    "curve_games=0",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_main_job")
    ap.add_argument("--results", default="benchmarks/results/gpu_main_job")
    ap.add_argument("--cpu-smoke", action="store_true", help="the smoke preset on CPU (CI)")
    ap.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE", help="more overrides")
    args = ap.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("not run: no CUDA device")
        return
    config, sets = (preset_path("smoke"), SMOKE_SETS) if args.cpu_smoke else (None, GPU_SETS)
    cfg = load_run_config(config, [f'out_dir="{args.out}"', *sets, *args.set])
    device = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    start = load_average()
    publish(run_pipeline(cfg), Path(args.results), start, device=f"{device}; settings: {' '.join(sets + args.set)}")


if __name__ == "__main__":
    main()
