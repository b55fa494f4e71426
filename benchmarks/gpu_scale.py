"""Real scale on one GPU: decode engines, SFT MFU, a GRPO step on the sharded trainer with its
weight sync, and an 8B-layout LoRA GRPO step's peak memory against the planner (issue 47).

For a lent GPU (written for one H200, 8 minutes). Random-initialised Qwen3 layouts (the public
0.6B / 1.7B / 4B / 8B configs, `plan.layouts`), no weights or hub needed. Four tables:

1. decode: new tok/s of vLLM (``load_format="dummy"``, when vllm is installed), the project's
   `StaticEngine` and HF ``generate`` at batch 64 and 256 (~1024-token prompts + 128 new, greedy, bf16);
2. SFT: tok/s and MFU (6 x params x tokens / 989 TFLOP/s dense bf16) of the SFT step
   (`benchmarks/gpu_throughput.train_tok_s`: fp32 masters, bf16 autocast, fused AdamW);
3. GRPO 0.6B: one `train.trainer.Trainer` update over `train.sharded.shard_model` (FSDP2, one rank)
   on rows sampled by the rollout engine (vLLM when installed, else the static engine), and the
   seconds to hand the new weights to that engine (the weight sync);
4. LoRA 8B: one GRPO update of the 8B layout with r = 16 adapters (bf16 base, fp32 adapters, KL
   reference = the base with adapters off): ``torch.cuda.max_memory_allocated`` against the
   planner's trainer peak (`plan.planner.plan_rl` with the same sizes) minus its CUDA context.

Run from the repository root:

    python benchmarks/gpu_scale.py        # one H200, ~8 min (benchmarks/results/gpu_scale.txt)

Without CUDA it prints "no CUDA" and exits 0; ``--cpu-smoke`` runs every table on a micro layout
on CPU (fp32) so that an API change that would break the GPU run fails in CI first.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
from gpu_throughput import PEAK_BF16, sync, train_tok_s  # noqa: E402

from evoharness.config.rl import GRPOConfig, RLConfig  # noqa: E402
from evoharness.config.scale import LoRAConfig, ShardConfig  # noqa: E402
from evoharness.engines.grammar import GenRequest  # noqa: E402
from evoharness.engines.static import StaticEngine  # noqa: E402
from evoharness.models.tokenizer import train_tokenizer  # noqa: E402
from evoharness.plan.layouts import LAYOUTS  # noqa: E402
from evoharness.train.grpo import TurnSample  # noqa: E402
from evoharness.train.step import set_token_weights  # noqa: E402
from evoharness.train.trainer import Trainer  # noqa: E402

DEADLINE_S = 420  # stop starting new measurements after this (the whole script: ~8 minutes)
MICRO = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def qwen3_config(size: str, vocab: int):
    """A Qwen3Config of a named layout (`plan.layouts`), or the micro one for ``--cpu-smoke``."""
    from transformers import Qwen3Config

    if size == "micro":
        kw = dict(MICRO, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
    else:
        lay = LAYOUTS[f"qwen3-{size}"]
        kw = dict(
            hidden_size=lay.hidden,
            num_hidden_layers=lay.layers,
            num_attention_heads=lay.heads,
            num_key_value_heads=lay.kv_heads,
            head_dim=lay.head_dim,
            intermediate_size=lay.intermediate,
            tie_word_embeddings=lay.tied,
        )
    cfg = Qwen3Config(vocab_size=vocab, max_position_embeddings=8192, eos_token_id=2, pad_token_id=0, **kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(size: str, vocab: int, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(qwen3_config(size, vocab)).to(dtype)


def prompts(tok, n: int, length: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(7, len(tok), (length - 32 + (i * 64) // n,), generator=g).tolist() for i in range(n)]


def model_dir(size: str, vocab: int, tok, root: Path) -> Path:
    """A config-only model directory (vLLM's ``load_format="dummy"`` needs no weights)."""
    d = root / size
    qwen3_config(size, vocab).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def vllm_engine(size: str, vocab: int, tok, root: Path, max_len: int, seqs: int):
    """A `VLLMEngine` with random weights, or None when vllm is not installed."""
    from evoharness.engines.vllm_engine import VLLMEngine, vllm_available

    if not vllm_available():
        return None
    return VLLMEngine(
        model_dir(size, vocab, tok, root),
        stop_ids=[],
        max_model_len=max_len,
        max_num_seqs=seqs,
        load_format="dummy",
        gpu_memory_utilization=0.5,
    )


def decode_row(size, vocab, device, tok, batches, prompt_len, new, root) -> list[str]:
    """new tok/s per engine and batch (table 1)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(size, vocab, device, dtype).eval()
    static = StaticEngine(model, tok, stop_ids=[])
    out = []
    for n in batches:
        ps = prompts(tok, n, prompt_len)
        pad = tok.pad({"input_ids": ps}, return_tensors="pt", padding_side="left").to(device)

        def static_run(ps=ps, static=static):
            static.generate([GenRequest(p) for p in ps], max_new_tokens=new)

        def generate(pad=pad, model=model):
            model.generate(**pad, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

        with torch.inference_mode():
            for fn in (static_run, generate):
                fn()
                sync(device)
                t = time.perf_counter()
                fn()
                sync(device)
                out.append(f"{n * new / (time.perf_counter() - t):>9.0f}")
    del model, static
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    eng = vllm_engine(size, vocab, tok, root, prompt_len + new + 64, max(batches)) if device.type == "cuda" else None
    for n in batches:
        if eng is None:
            out.append(f"{'n/a':>9}")
            continue
        reqs = [GenRequest(p) for p in prompts(tok, n, prompt_len)]
        eng.generate(reqs[:4], max_new_tokens=4)
        t = time.perf_counter()
        eng.generate(reqs, max_new_tokens=new)
        out.append(f"{n * new / (time.perf_counter() - t):>9.0f}")
    if eng is not None:
        eng.close()
    return out


def grpo_rows(ps: list[list[int]], completions: list[list[int]], logprobs: list[list[float]]) -> list[TurnSample]:
    """GRPO rows of one group: advantages alternate +1 / -1 (a real group's spread)."""
    rows = [
        TurnSample(p, c, lp, advantage=1.0 if i % 2 else -1.0, episode_id=f"e{i}", group=0)
        for i, (p, c, lp) in enumerate(zip(ps, completions, logprobs))
    ]
    set_token_weights(rows)
    return rows


def grpo_step(size, vocab, device, tok, n, prompt_len, new, root) -> dict[str, float]:
    """One sharded (FSDP2, one rank) GRPO update on sampled rows, and the weight sync (table 3)."""
    from evoharness.train.sharded import init_group, shard_model

    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    group = init_group(0, 1, f"file://{tempfile.mktemp(prefix='gpu_scale_rdzv')}", device=device.type)
    try:
        model = build(size, vocab, group.device, torch.float32)
        eng = vllm_engine(size, vocab, tok, root, prompt_len + new + 64, n) if device.type == "cuda" else None
        engine = eng or StaticEngine(build(size, vocab, group.device, compute).eval(), tok, stop_ids=[])
        ps = prompts(tok, n, prompt_len)
        sync(device)
        t = time.perf_counter()
        res = engine.generate([GenRequest(p, seed=i) for i, p in enumerate(ps)], max_new_tokens=new, temperature=1.0)
        sync(device)
        gen_s = time.perf_counter() - t
        rows = grpo_rows(ps, [r.token_ids for r in res], [r.logprobs for r in res])
        shard_model(model, ShardConfig(activation_checkpointing=True), group, compute)
        cfg = GRPOConfig(kl_beta=0.0, micro_batch_size=4, lr=1e-6)
        amp = (lambda: torch.autocast("cuda", dtype=compute)) if device.type == "cuda" else None
        trainer = Trainer(model, tok, cfg, **({"amp": amp} if amp else {}), reducer=group)
        sync(device)
        t = time.perf_counter()
        trainer.accumulate(rows)  # a sharded trainer runs its passes in lockstep itself
        trainer.apply(cfg.lr, step=0)
        sync(device)
        train_s = time.perf_counter() - t
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sync(device)
        t = time.perf_counter()
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        if eng is not None:
            eng.update_weights(full)
        else:
            engine.model.load_state_dict({k: v.to(compute) for k, v in full.items()}, strict=False)
        sync(device)
        sync_s = time.perf_counter() - t
        if eng is not None:
            eng.close()
        tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        return {
            "rollout": "vllm" if eng else "static",
            "gen_s": gen_s,
            "train_s": train_s,
            "sync_s": sync_s,
            "tokens": tokens,
        }
    finally:
        group.close()


def lora_peak(size, vocab, device, tok, n, prompt_len, new) -> dict[str, float]:
    """Peak memory of one LoRA GRPO update with KL against the planner's trainer peak (table 4)."""
    from evoharness.plan.memory import CUDA_CONTEXT_BYTES
    from evoharness.plan.planner import plan_rl
    from evoharness.train.lora import apply_lora

    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    lora_cfg = LoRAConfig(r=16)
    grpo = GRPOConfig(kl_beta=0.01, micro_batch_size=n, lr=1e-5)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build(size, vocab, device, compute)
    lora = apply_lora(model, lora_cfg)
    g = torch.Generator().manual_seed(2)
    ps = prompts(tok, n, prompt_len)
    comps = [torch.randint(7, len(tok), (new,), generator=g).tolist() for _ in ps]
    rows = grpo_rows(ps, comps, [[-2.0] * new for _ in ps])
    amp = (lambda: torch.autocast("cuda", dtype=compute)) if device.type == "cuda" else None
    trainer = Trainer(model, tok, grpo, ref_model=lora.reference(), **({"amp": amp} if amp else {}))
    sync(device)
    t = time.perf_counter()
    trainer.accumulate(rows)
    trainer.apply(grpo.lr, step=0)
    sync(device)
    step_s = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else float("nan")
    with tempfile.TemporaryDirectory() as d:
        qwen3_config(size, vocab).save_pretrained(d)
        cfg = RLConfig(
            model_path=d,
            device=device.type,
            lora=lora_cfg,
            max_prompt_tokens=prompt_len,
            max_new_tokens=new,
            grpo=grpo,
            constrained=False,
        )
        plan = plan_rl(cfg, 141.0 if device.type == "cuda" else 24.0, devices=1)
    owner = plan.devices[0].owners["cell 0"]
    trainer_terms = [t for t in owner.terms if t.role in ("trainer", "KL reference")]
    predicted = sum(t.bytes for t in trainer_terms) - (CUDA_CONTEXT_BYTES if device.type == "cuda" else 0)
    del trainer, lora, model
    gc.collect()
    return {"step_s": step_s, "peak": peak, "predicted": predicted, "fits": plan.fits}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b", "4b", "8b"])
    ap.add_argument("--cpu-smoke", action="store_true", help="every table on a micro layout on CPU")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    if a.cpu_smoke:
        device, sizes, batches, plen, new, vocab = torch.device("cpu"), ["micro"], [4, 8], 64, 8, 1024
        sft_shape, grpo_size, lora_size = (2, 128, 1), "micro", "micro"
    elif not torch.cuda.is_available():
        print("no CUDA: this script measures GPU scale; nothing to do here (CPU figures: benchmarks/bench_*.py)")
        return
    else:
        device, sizes, batches, plen, new, vocab = torch.device("cuda"), a.sizes, [64, 256], 1024, 128, 151936
        sft_shape, grpo_size, lora_size = (8, 2048, 3), "0.6b", "8b"
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    t0 = time.perf_counter()
    tok = train_tokenizer(["go to fridge 1. You arrive at cabinet 12. take apple 1 from countertop 2."] * 50)
    figures: dict = {"decode": {}, "sft": {}}
    root = Path(tempfile.mkdtemp(prefix="gpu_scale"))

    def late() -> bool:
        return time.perf_counter() - t0 > DEADLINE_S

    print(f"\n1. decode new tok/s: ~{plen}-token prompts + {new} new, greedy")
    heads = [f"{e} b{b}" for e in ("static", "generate") for b in batches] + [f"vllm b{b}" for b in batches]
    print(f"{'size':<6} " + " ".join(f"{h:>9}" for h in heads))
    for size in sizes:
        if late():
            print(f"{size:<6} skipped (time budget)")
            continue
        try:
            row = decode_row(size, vocab, device, tok, batches, plen, new, root)
        except torch.OutOfMemoryError:
            row = [f"{'OOM':>9}"] * len(heads)
        figures["decode"][size] = dict(zip(heads, row))
        print(f"{size:<6} " + " ".join(row), flush=True)

    rows_, length, steps = sft_shape
    print(f"\n2. SFT: {rows_} x {length} tokens/step, fp32 masters + bf16 autocast, fused AdamW")
    print(f"{'size':<6} {'tok/s':>8} {'MFU':>6}")
    for size in [s for s in sizes if s != "8b"]:
        if late():
            print(f"{size:<6} skipped (time budget)")
            continue
        try:
            tps, mfu, _ = train_tok_s(size if size != "micro" else "micro", vocab, device, rows_, length, steps)
            figures["sft"][size] = {"tok_s": tps, "mfu": mfu}
            print(f"{size:<6} {tps:>8.0f} {100 * mfu:>5.1f}%", flush=True)
        except torch.OutOfMemoryError:
            print(f"{size:<6} {'OOM':>8}")
        gc.collect()

    print(f"\n3. GRPO step, {grpo_size}: {batches[0]} rollouts, FSDP2 trainer (1 rank), weight sync to the engine")
    if not late():
        g = grpo_step(grpo_size, vocab, device, tok, batches[0], plen, new, root)
        figures["grpo"] = g
        print(
            f"rollout {g['rollout']}: {g['gen_s']:.2f} s | update {g['train_s']:.2f} s ({g['tokens']} tokens) | "
            f"weight sync {g['sync_s']:.3f} s"
        )
    gc.collect()

    print(f"\n4. LoRA r=16 GRPO update (KL on), {lora_size} layout: peak memory vs the planner")
    if not late():
        n_rows = 4 if device.type == "cuda" else 2
        r = lora_peak(lora_size, vocab, device, tok, n_rows, plen, new)
        figures["lora"] = r
        peak = f"{r['peak'] / 2**30:.1f} GiB" if r["peak"] == r["peak"] else "n/a (CPU)"
        print(
            f"update {r['step_s']:.2f} s | measured peak {peak} | planned trainer + reference "
            f"{r['predicted'] / 2**30:.2f} GiB | planner says {'fits' if r['fits'] else 'does not fit'}"
        )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (peak bf16 {PEAK_BF16 / 1e12:.0f} TFLOP/s for MFU)")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
