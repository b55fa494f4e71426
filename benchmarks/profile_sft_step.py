"""Where one SFT step of the main job goes on this CPU (issue 11's 45-minute goal).

Usage: python benchmarks/profile_sft_step.py --run runs/main [--threads 2] [--steps 6]
       [--out benchmarks/results/profile_sft_step.txt]

Takes a finished main job's initial model and SFT examples (``--run``: ``model_init``,
``sft_examples.jsonl``) and its SFT config (4K-token batches, completion + prompt-token loss,
AdamW), times ``--steps`` optimizer steps after 2 warm-up steps (median s/step), then profiles 4
more with ``torch.profiler`` and prints the operators by self CPU time, plus the matmul FLOP rate:
how far the step is from the CPU's arithmetic limit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/main")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/profile_sft_step.txt")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from evoharness.models.init import count_params, load_model, load_tokenizer
    from evoharness.pipeline import RunConfig
    from evoharness.train.sft import collate, load_examples, plan_epoch, prompt_labels, sft_losses, tokenize_examples

    torch.set_num_threads(args.threads)
    run = Path(args.run)
    cfg = RunConfig.model_validate_json((run / "run_config.json").read_text()).sft
    tok = load_tokenizer(run / "model_init")
    model = load_model(run / "model_init", torch.device("cpu"), torch.float32)
    model.train()
    rows = tokenize_examples(
        tok, load_examples(run / "sft_examples.jsonl"), cfg.max_prompt_tokens, cfg.max_completion_tokens
    )
    batches = plan_epoch([len(r[0]) for r in rows], cfg.batch_tokens, cfg.seed, 0)[: args.steps + 6]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def step(b: list[int]) -> int:
        batch = [rows[i] for i in b]
        ids, labels = collate(batch, tok.pad_token_id)
        n_t, n_p = int((labels != -100).sum()), sum(r[1] - 1 for r in batch)
        loss, loss_p, _ = sft_losses(model, ids, labels, prompt_labels(ids, batch))
        (loss / max(1, n_t) + cfg.prompt_loss_weight * loss_p / max(1, n_p)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ids.numel()

    for b in batches[:2]:
        step(b)
    times, tokens = [], []
    for b in batches[2 : 2 + args.steps]:
        t = time.perf_counter()
        tokens.append(step(b))
        times.append(time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for b in batches[2 + args.steps : 6 + args.steps]:
            step(b)
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev)
    mm = [e for e in ev if e.key in ("aten::mm", "aten::addmm", "aten::bmm")]
    mm_us, mm_flops = sum(e.self_cpu_time_total for e in mm), sum(e.flops for e in mm)
    c = model.config
    lines = [
        f"$ python benchmarks/profile_sft_step.py --run {args.run} --threads {args.threads} --steps {args.steps}",
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; torch "
        f"{torch.__version__}, {args.threads} threads, fp32; model {count_params(model) / 1e6:.2f}M params "
        f"({c.num_hidden_layers} layers, hidden {c.hidden_size}, MLP {c.intermediate_size}, vocab {c.vocab_size}, "
        f"attention {c._attn_implementation}); SFT batches of {cfg.batch_tokens} tokens, prompt loss weight "
        f"{cfg.prompt_loss_weight:g}; {len(rows)} rows, mean {statistics.mean(len(r[0]) for r in rows):.0f} tokens",
        f"median s/step over {args.steps} steps: {statistics.median(times):.3f} "
        f"({statistics.median(tokens) / statistics.median(times):,.0f} tokens/s); "
        f"x {cfg.max_steps} steps = {statistics.median(times) * cfg.max_steps / 60:.1f} min",
        f"matmuls: {mm_flops / 1e9 / (mm_us / 1e6) if mm_us else 0:.1f} GFLOP/s over their own time "
        f"({100 * mm_us / total:.0f}% of the profiled CPU time)",
        "",
        f"{'operator (4 profiled steps)':<60} {'self CPU %':>10} {'self CPU ms':>12} {'calls':>7}",
    ]
    for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:14]:
        lines.append(
            f"{e.key[:60]:<60} {100 * e.self_cpu_time_total / total:>10.1f} "
            f"{e.self_cpu_time_total / 1e3:>12.1f} {e.count:>7}"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
