"""Time per GRPO step, split into generation, environment and training.

Usage:
    python benchmarks/bench_grpo_step.py [--config configs/rl_cpu.toml] [--model-path DIR] [--steps 2]
        [--prompts 4] [--group 4] [--max-steps 30] [--engine fast|textworld] [--device cpu|cuda]
        [--threads 1] [--gen-engine auto|static|hf] [--set key=value ...]

Without --model-path a 'mini' Qwen3 model is initialised from scratch with a
tokenizer trained on real BPE-harness prompts (generation then runs to the
token cap every turn: an upper bound on generation time). Prints one row per
RL step and the mean split of wall seconds (generation and environment: the
run's ``timing_s/*`` metrics; training: wall time inside `train.trainer.Trainer`,
the streamed micro-batches' forward/backward and the weight sync's update), then
the same split in CPU seconds of this process (generation = inside the engine's
``generate``, training = inside the Trainer's ``prepare``/``accumulate``/``apply``,
the whole GRPO update): on a shared machine the CPU split is the robust one. The
run is `recipes.rl.train_rl` with the default runtime (one cell in this process);
with ``--set runtime.cells=K`` the cells' time is in their own processes and not
in either split.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from evoharness.config.base import load_config
from evoharness.config.rl import RLConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.models.init import count_params, init_model
from evoharness.models.tokenizer import build_tokenizer
from evoharness.recipes.rl import train_rl


def scratch_model(out: Path, preset: str) -> Path:
    corpus = []
    for task in discover_games("train")[:60]:
        env = make_env(task, engine="fast")
        h = BPEHarness(ExperienceStore())
        h.reset(task, env.reset())
        corpus += [m["content"] for m in h.messages()]
    tok = build_tokenizer(corpus + ["<think>x</think><action>go to countertop 1</action>"], out, vocab_size=2048)
    init_model(preset, tok, out_dir=out, seed=0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None, help="RLConfig TOML (sizes below override it)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="RLConfig key=value")
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gen-engine", default="auto", help="LocalHFPolicy's in-process engine (evoharness.engines)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import evoharness.policies.local as local_policy
    from evoharness.engines import StaticEngine

    local_policy.DEFAULT_ENGINE = args.gen_engine
    engines: list[StaticEngine] = []  # to read their prefill/decode split afterwards
    init = StaticEngine.__init__

    def track(self, *a, **kw):
        init(self, *a, **kw)
        engines.append(self)

    StaticEngine.__init__ = track
    cpu = {"gen": 0.0, "train": 0.0}  # CPU seconds of this process inside generation / the GRPO update

    # wall seconds inside the Trainer, per RL step: the streamed micro-batches' and the sync's alike
    train_wall = {"pending": 0.0, "by_step": {}}

    def cpu_timed(fn, key):
        def run(*a, **kw):
            c, w = time.process_time(), time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                cpu[key] += time.process_time() - c
                if key == "train":
                    train_wall["pending"] += time.perf_counter() - w
                    if fn.__name__ == "apply":  # an update ends: what trained since goes to its step
                        step = kw["step"] + 1  # `apply(lr, step=...)`: 0-based; metrics count from 1
                        train_wall["by_step"][step] = train_wall["by_step"].get(step, 0.0) + train_wall["pending"]
                        train_wall["pending"] = 0.0

        return run

    from evoharness.engines.hf import Engine
    from evoharness.train.trainer import Trainer

    for cls in (StaticEngine, Engine):
        cls.generate = cpu_timed(cls.generate, "gen")
    # the whole policy update: streamed micro-batches' forward/backward (`accumulate`, also called by
    # `train.step.run_updates` at the sync), decoupled PPO's π_prox pass (`prepare`), the anchor, clip
    # and AdamW (`apply`); turn rows or tree-packed alike
    for name in ("prepare", "accumulate", "apply"):
        setattr(Trainer, name, cpu_timed(getattr(Trainer, name), "train"))
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model_path) if args.model_path else scratch_model(Path(tmp) / "model", args.preset)
        sizes = dict(
            model_path=str(model),
            out_dir=str(Path(tmp) / "rl"),
            steps=args.steps,
            engine=args.engine,
            max_steps=args.max_steps,
            max_new_tokens=args.max_new_tokens,
            device=args.device,
            decode_threads=args.threads,
            eval_every=0,
        )
        cfg = load_config(RLConfig, args.config, [f"{k}={json.dumps(v)}" for k, v in sizes.items()] + args.overrides)
        if not args.config:  # the CPU-sized prompt cap and a harmless lr for a scratch model
            cfg.max_prompt_tokens = 1024
            cfg.grpo.lr = 1e-5
        cfg.grpo.prompts_per_step, cfg.grpo.group_size = args.prompts, args.group
        c0 = time.process_time()
        train_rl(cfg, progress=False)
        cpu_total = time.process_time() - c0
        rows = [json.loads(ln) for ln in (Path(tmp) / "rl" / "metrics.jsonl").read_text().splitlines()]
        for r in rows:
            r["train_wall_s"] = train_wall["by_step"].get(r["step"], 0.0)
        from evoharness.models.init import load_model

        n_params = count_params(load_model(model))
    print(
        f"model {model.name} ({n_params / 1e6:.2f}M params), device {args.device}, threads {args.threads}, "
        f"env engine {args.engine}, generation engine {args.gen_engine}; "
        f"config {args.config or 'defaults'} {' '.join(args.overrides)}; "
        f"{args.prompts} games x {args.group} samples, <= {args.max_steps} turns, "
        f"<= {args.max_new_tokens} new tokens/turn, {cfg.grpo.mini_batches} update(s)/step, "
        f"<= {cfg.grpo.max_train_turns or 'all'} trained turns/episode\n"
    )
    print("| step | turns | completion tok | gen s | env s | train s | step s | gen % | env % | train % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    n = args.prompts * args.group
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
    for label, r in [(str(r["step"]), r) for r in rows] + [("mean", mean)]:
        tot = r["timing_s/step"]
        print(
            f"| {label} | {r['steps_per_episode'] * n:.0f} | {r['completion_tokens_per_episode'] * n:.0f} | "
            f"{r['timing_s/gen']:.1f} | {r['timing_s/env']:.2f} | {r['train_wall_s']:.1f} | {tot:.1f} | "
            f"{100 * r['timing_s/gen'] / tot:.0f} | {100 * r['timing_s/env'] / tot:.1f} | "
            f"{100 * r['train_wall_s'] / tot:.0f} |"
        )
    print(
        f"\nCPU seconds of this process (all {args.steps} step(s) of train_rl): total {cpu_total:.1f}, "
        f"generation {cpu['gen']:.1f} ({100 * cpu['gen'] / cpu_total:.0f}%), GRPO update {cpu['train']:.1f} "
        f"({100 * cpu['train'] / cpu_total:.0f}%), other {cpu_total - cpu['gen'] - cpu['train']:.1f}"
    )
    for e in engines:
        st = e.stats
        if st["calls"]:
            print(
                f"\nstatic engine ({st['calls']} calls, all steps and evals): prefill {st['prefill_s']:.1f} s for "
                f"{st['prompt_tokens']} prompt tokens ({st['prompt_tokens'] / st['calls']:.0f}/call), decode "
                f"{st['decode_s']:.1f} s for {st['new_tokens']} new tokens"
            )


if __name__ == "__main__":
    main()
