"""`evoharness rl` on the runtime: the same ALFWorld RL workload under each schedule.

    python benchmarks/rl_runtime.py [steps] [cells]     # default 3 steps, 3 cells: ~3 min on 2 shared cores

A micro Qwen3 model (tokenizer trained on real BPE-harness prompts, as the
tests build it), P=3 games x G=2 samples per step, T_max=10, the BPE harness
with the action grammar, GRPO (KL 0.01). Rows: the in-process loop, then
`--schedule` colocate on 1 cell and each schedule on K cell processes.
Columns: wall seconds per RL step of the whole command (cells loading the
model included), the driver's seconds per step (from the first command to the
last weight sync), the runtime's idle ratios per role, role switches and their mean
latency, aborted turns, max staleness, re-issued calls, and the final step's
success/reward (synchronous schedules must equal the in-process row).
The machine is shared: expect +-30% between runs.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MICRO = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)


def build_model(d: Path) -> None:
    from evoharness.envs.alfworld import make_env
    from evoharness.envs.alfworld.games import discover_games
    from evoharness.harness.bpe import BPEHarness, ExperienceStore
    from evoharness.models.init import init_model
    from evoharness.models.tokenizer import build_tokenizer

    corpus = []
    for task in discover_games("train")[:12]:
        h = BPEHarness(ExperienceStore())
        h.reset(task, make_env(task, engine="fast").reset())
        corpus += [m["content"] for m in h.messages()]
        corpus.append("<think>go</think><action>go to countertop 1</action> track commit recall note")
    init_model(MICRO, build_tokenizer(corpus, d, vocab_size=1024), out_dir=d, seed=0)


def run(model: Path, out: Path, steps: int, schedule: str, cells: int) -> dict:
    from evoharness.train.rl import RLConfig, train_rl

    cfg = RLConfig(model_path=str(model), out_dir=str(out), steps=steps, max_steps=10, max_new_tokens=12,
                   max_prompt_tokens=512, decode_threads=1, seed=3)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 3, 1e-3
    cfg.runtime.schedule, cfg.runtime.cells, cfg.runtime.stall_s = schedule, cells, 300
    t0 = time.perf_counter()
    try:
        train_rl(cfg, progress=False)
    except Exception as e:  # noqa: BLE001 -- a schedule that cannot run this shape is a row, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:80]}"}
    wall = time.perf_counter() - t0
    last = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()][-1]
    rt = json.loads((out / "runtime.json").read_text()) if (out / "runtime.json").exists() else {}
    return {"wall": wall, "step_s": wall / steps, "success": last["success"], "reward": last["reward"], **rt}


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    tmp = Path(tempfile.mkdtemp(prefix="rl_runtime_"))
    try:
        build_model(tmp / "model")
        rows = [("inprocess", 1), ("colocate", 1)] + [(s, k) for s in ("colocate", "async", "elastic", "elastic-async")]
        lines = [f"RL on the runtime: micro Qwen3, 3 games x 2 samples, T_max 10, {steps} steps, K={k}",
                 "| schedule | cells | s/step (command) | s/step (driver) | idle rollout | idle train | switches | switch s (to train/rollout) "
                 "| aborted | max staleness | re-issued calls | success | reward |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, cells in rows:
            r = run(tmp / "model", tmp / f"{name}{cells}", steps, name, cells)
            if "error" in r:
                lines.append(f"| {name} | {cells} | {r['error']} |")
            elif name == "inprocess":
                lines.append(f"| inprocess | - | {r['step_s']:.2f} | - | - | - | - | - | - | - | - | "
                             f"{r['success']:.2f} | {r['reward']:.3f} |")
            else:
                lines.append(
                    f"| {name} | {cells} | {r['step_s']:.2f} | {r['timing_s/step']:.2f} | {r['runtime/idle_rollout']:.2f} | "
                    f"{r['runtime/idle_train']:.2f} | {r['runtime/switches']:.0f} | "
                    f"{r['runtime/switch_to_train_s']:.3f}/{r['runtime/switch_to_rollout_s']:.3f} | "
                    f"{r['runtime/aborted_turns']:.0f} | {r['runtime/staleness_max']:.0f} | "
                    f"{r['runtime/reissued_calls']:.0f} | {r['success']:.2f} | {r['reward']:.3f} |")
            print(lines[-1], flush=True)
        print("\n".join(lines))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
