"""The RL loop's periodic greedy evaluation (`recipes.rl.quick_eval`) for any
model directory, e.g. the SFT checkpoint as the step-0 point of an RL run.

Usage:
    python benchmarks/rl_quick_eval.py --config configs/rl_cpu.toml --model-path runs/sft/final \\
        [--set harness.experience_path=runs/main/experience.json ...]
"""

from __future__ import annotations

import argparse
import json

from evoharness.config.base import load_config
from evoharness.config.rl import RLConfig
from evoharness.policies.local import LocalHFPolicy
from evoharness.recipes.alfworld import load_experience_fresh, quick_eval


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(RLConfig, args.config, [f"model_path={json.dumps(args.model_path)}"] + args.overrides)
    policy = LocalHFPolicy(
        cfg.model_path,
        device=cfg.device,
        dtype=cfg.dtype,
        max_new_tokens=cfg.max_new_tokens,
        max_prompt_tokens=cfg.max_prompt_tokens,
        constrained=cfg.constrained,
        seed=cfg.seed,
        num_threads=cfg.decode_threads,
    )
    print(
        json.dumps(
            {"model": args.model_path, **quick_eval(cfg, policy, load_experience_fresh(cfg.harness.experience_path))}
        )
    )


if __name__ == "__main__":
    main()
