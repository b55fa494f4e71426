"""Stage 1: supervised fine-tuning on (chat messages -> completion) examples.

An example is ``{"messages": [{"role", "content"}, ...], "completion": str}``
(one JSONL line). It becomes one token row::

    input_ids = fit(template(messages, add_generation_prompt=True), max_prompt_tokens)
                + tokens(completion + eos)      (dropped if over max_completion_tokens)
    labels    = -100 on every prompt token, the token ids on the completion

so the loss (mean cross-entropy per completion token over the whole step) is
computed on assistant tokens only. With ``prompt_loss_weight`` w > 0 the step
minimises ``L_completion + w * L_prompt``, L_prompt the mean next-token
cross-entropy over the prompt tokens of the same rows (one forward pass): a
from-scratch student learns to read the observation and copy object names from
the prompt far sooner (benchmarks/results/student/levers.md). A prompt over
`max_prompt_tokens` is fitted exactly as the policies fit theirs at rollout and evaluation time
(`harness.prompt.fit_prompt_ids`: oldest history first, never the system prompt
or OBJECTIVE).

Batches are length-bucketed: each epoch the examples are sorted by length
(random tie-break), cut into batches of at most `batch_tokens` padded tokens,
and the batches shuffled. Rows are right-padded; with causal attention a real
token never sees a later pad, so no attention mask is needed (SDPA's causal
fast path). Only target positions go through the LM head.

The loop: AdamW, linear warm-up then cosine decay to ``min_lr_ratio * lr``,
gradient clipping. Parameters, gradients and optimizer state are always fp32
(master weights, `train.precision`); ``precision`` only picks the forward
compute dtype: fp32 on CPU, bf16 autocast on CUDA by default. Every ``ckpt_every``
steps an atomic checkpoint (model as an HF directory, optimizer, scheduler,
RNG states, step, this epoch's batch order) is written; calling `train_sft`
again with the same `out_dir` resumes from it and reaches the same weights as
an uninterrupted run. ``max_minutes`` stops cleanly after a checkpoint.

Outputs in `out_dir`: ``metrics.jsonl`` (one record per step: step, epoch,
loss, lr, grad_norm, tokens (padded tokens run), target_tokens (tokens with
loss), tok_per_s (tokens / step seconds), elapsed_s; eval records carry
``eval_loss``; a time-budget stop adds ``{"event": "stopped"}``),
``checkpoints/step_NNNNNNN/`` + ``checkpoints/latest``, ``sft_config.json``,
and ``final/`` (an HF model directory, weights in the dtype `model_dir`
declares: checkpoints keep the fp32 master weights).

With ``lora.r > 0`` only LoRA adapters train (`train.lora`: the base frozen in the
compute dtype): a checkpoint holds the adapter files instead of the model, and
``final/`` is the merged model with the adapters in ``final/adapter/``.

Sharded: with ``shard.ranks > 1`` this process becomes rank 0 of that many local
ranks (`train.launch`; under ``torchrun`` the launcher's ranks), the model is
sharded over them (FSDP2, `train.sharded`) and each rank trains its share of
every step's rows with one process's loss normalisation (`train.sft_ranks`):
the same weights as one process, to float summation order. Checkpoints are
then DCP directories, resumable at any number of ranks (one included).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from evoharness.config.sft import SFTConfig, SFTJobConfig
from evoharness.files import append_jsonl, atomic_dir, atomic_write_text, truncate_jsonl
from evoharness.models.init import load_model, load_tokenizer
from evoharness.tracking import Tracker
from evoharness.train.checkpoint import (
    check_resume_config,
    get_rng_state,
    load_checkpoint,
    load_model_weights,
    load_trainer_state,
    set_rng_state,
)
from evoharness.train.distributed import clip_grad_norm
from evoharness.train.launch import current_group, launch_ranks
from evoharness.train.lora import apply_lora
from evoharness.train.packing import packed_sft_micro
from evoharness.train.precision import autocast as precision_autocast
from evoharness.train.precision import check_master_weights, export_dtype, save_exported
from evoharness.train.schedule import lr_lambda
from evoharness.train.sft_ranks import SFTRanks, is_sharded_checkpoint
from evoharness.train.sharded import shard_model
from evoharness.train.sharded_checkpoint import export_hf, load_sharded

IGNORE = -100
# settings a resumed run may change: how long, where and in what memory it runs, not what it trains
RESUME_FREE = (
    "max_minutes",
    "progress",
    "tracking",
    "ckpt_every",
    "keep_checkpoints",
    "eval_every",
    "device",
    "micro_batch_tokens",
    "calibration_steps",
    "shard",  # the number of ranks and their memory settings: a DCP checkpoint resumes at any world size
    "fit_schedule_to_budget",
    # `evoharness sft` (SFTJobConfig): where the run lives and how it runs; the examples' content is
    # checked by the fingerprint, not their path
    "out_dir",
    "threads",
    "examples",
    "eval_examples",
)


# ---------------------------------------------------------------- data


def load_examples(path: str | Path) -> list[dict[str, Any]]:
    """Read SFT examples from a JSONL file (blank lines skipped).

    Raises:
        ValueError: a line that is not an example (names file and line).
    """
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            ex = json.loads(line)
            if not isinstance(ex, dict) or "messages" not in ex or "completion" not in ex:
                raise ValueError(f"{path}:{n}: an SFT example needs 'messages' and 'completion'")
            out.append(ex)
    return out


def tokenize_examples(
    tokenizer,
    examples: list[dict[str, Any]],
    max_prompt_tokens: int,
    max_completion_tokens: int,
    stats: dict[str, int] | None = None,
) -> list[tuple[list[int], int]]:
    """Tokenise examples into rows ``(input_ids, n_prompt)``.

    ``input_ids[:n_prompt]`` is the chat-templated prompt with the generation
    prompt, fitted to `max_prompt_tokens` exactly as the policies fit theirs
    (`harness.prompt.fit_prompt_ids`: oldest history first, never the system
    prompt or OBJECTIVE); the rest is ``completion + eos``. Labels are
    `labels_for` of a row. Examples are dropped whose completion is empty,
    whose protected prompt part alone exceeds the budget, or whose
    ``completion + eos`` exceeds `max_completion_tokens` (cut, it would lose
    its final answer, the ``<action>`` block, and teach a reply that never
    ends). `stats`, if given, receives counts: ``prompts_fitted``,
    ``history_dropped``, ``prompts_cut``, ``too_long_dropped``,
    ``completion_too_long_dropped``.
    """
    from evoharness.harness.prompt import PromptTooLong, fit_prompt_ids

    stats = {} if stats is None else stats
    for k in ("prompts_fitted", "history_dropped", "prompts_cut", "too_long_dropped", "completion_too_long_dropped"):
        stats.setdefault(k, 0)
    if not examples:  # (a tokenizer call on no text raises IndexError)
        return []
    prompts = [
        tokenizer.apply_chat_template(ex["messages"], add_generation_prompt=True, tokenize=False) for ex in examples
    ]
    eos = tokenizer.eos_token or ""
    targets = [ex["completion"] + eos for ex in examples]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(targets, add_special_tokens=False)["input_ids"]
    rows = []
    for p, c, ex in zip(p_ids, c_ids, examples):
        if not ex["completion"]:
            continue
        if len(c) > max_completion_tokens:
            stats["completion_too_long_dropped"] += 1
            continue
        if 0 < max_prompt_tokens < len(p):
            try:
                p, fit = fit_prompt_ids(tokenizer, ex["messages"], max_prompt_tokens)
            except PromptTooLong:
                stats["too_long_dropped"] += 1
                continue
            stats["prompts_fitted"] += 1
            stats["history_dropped"] += fit.history_dropped
            stats["prompts_cut"] += bool(fit.tokens_cut)
        rows.append((p + c, len(p)))
    return rows


def labels_for(row: tuple[list[int], int]) -> list[int]:
    """-100 on exactly the prompt tokens, the token ids on the completion."""
    ids, n_prompt = row
    return [IGNORE] * n_prompt + ids[n_prompt:]


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Length-bucketed batches of example indices for one epoch.

    Sort by length (random tie-break), cut where the padded size
    ``rows * longest`` would exceed `batch_tokens` (a longer example gets a
    batch of its own), shuffle the batches. Deterministic in (seed, epoch).
    """
    rng = random.Random(f"sft:{seed}:{epoch}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur, longest = [], [], 0
    for i in order:
        if cur and (len(cur) + 1) * max(longest, lengths[i]) > batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, lengths[i])
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``labels`` ([b, T] long; labels -100 on prompt and pad)."""
    T = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row[0])] = torch.tensor(row[0])
        labels[i, : len(row[0])] = torch.tensor(labels_for(row))
    return ids, labels


def prompt_labels(ids: torch.Tensor, rows: list[tuple[list[int], int]]) -> torch.Tensor:
    """[b, T] labels of the prompt tokens of `collate`'s ``ids`` (-100 on completion and pad):
    the targets of the auxiliary prompt loss (`SFTConfig.prompt_loss_weight`)."""
    out = torch.full_like(ids, IGNORE)
    for i, (_, n_prompt) in enumerate(rows):
        out[i, :n_prompt] = ids[i, :n_prompt]
    return out


def split_micro(rows: list[tuple[list[int], int]], micro_tokens: int | None) -> list[list[tuple[list[int], int]]]:
    """Split a batch into micro-batches of at most `micro_tokens` padded tokens."""
    if not micro_tokens:
        return [rows]
    out, cur = [], []
    for r in sorted(rows, key=lambda r: len(r[0])):
        if cur and (len(cur) + 1) * len(r[0]) > micro_tokens:
            out.append(cur)
            cur = []
        cur.append(r)
    return out + [cur] if cur else out


# ---------------------------------------------------------------- loss


def completion_loss(model, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over completion tokens.

    Args:
        model: an HF causal LM (``model.base_model`` gives hidden states,
            ``get_output_embeddings()`` the LM head; no logit soft-capping).
        input_ids, labels: [b, T]; right-padded rows, labels -100 where no loss.

    Returns:
        (loss_sum fp32 scalar, number of target tokens). Position t's logits
        predict ``labels[t + 1]``; only positions whose next label is not
        -100 reach the LM head.
    """
    hidden = model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state
    return _ce_sum(model, hidden, labels)


def _ce_sum(model, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    target = labels[:, 1:]
    keep = target != IGNORE
    logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()
    loss = torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")
    return loss, int(keep.sum())


def sft_losses(
    model, input_ids: torch.Tensor, labels: torch.Tensor, p_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One forward pass: (completion loss sum, prompt loss sum, prompt target tokens);
    ``p_labels`` from `prompt_labels`."""
    hidden = model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state
    loss_c, _ = _ce_sum(model, hidden, labels)
    loss_p, n_p = _ce_sum(model, hidden, p_labels)
    return loss_c, loss_p, n_p


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(out_dir: Path, model, tokenizer, opt, sched, state: dict[str, Any], keep: int) -> Path:
    """Atomically write ``checkpoints/step_N`` (HF model dir + optimizer, scheduler,
    RNG, state.json), point ``checkpoints/latest`` at it, prune old ones."""
    ckpts = out_dir / "checkpoints"

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        torch.save(
            {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": get_rng_state()},
            tmp / "trainer_state.pt",
        )
        (tmp / "state.json").write_text(json.dumps(state))

    path = atomic_dir(ckpts / f"step_{state['step']:07d}", write)
    atomic_write_text(ckpts / "latest", path.name)
    for old in sorted(ckpts.glob("step_*"))[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return path


# ---------------------------------------------------------------- loop


def _fingerprint(rows: list[tuple[list[int], int]]) -> str:
    h = hashlib.sha256()
    for ids, n in rows:
        h.update(f"{n}:{','.join(map(str, ids))};".encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def evaluate(
    model, rows: list[tuple[list[int], int]], pad_id: int, batch_tokens: int, autocast, ranks: SFTRanks | None = None
) -> float:
    """Mean per-token completion loss on `rows` (sharded `ranks`: each rank its share of the batches)."""
    ranks = ranks or SFTRanks(None)
    model.eval()
    total, n = 0.0, 0
    with ranks.passes(model, grad=False):
        for batch in plan_epoch([len(r[0]) for r in rows], batch_tokens, 0, 0)[ranks.rank :: ranks.world]:
            ids, labels = collate([rows[i] for i in batch], pad_id)
            with autocast():
                loss, k = completion_loss(model, ids.to(model.device), labels.to(model.device))
            total, n = total + float(loss), n + k
    total, n = ranks.sum([total, n])
    model.train()
    return total / max(1, n)


def _idle_pass(model, grad: bool, prompt_loss: bool) -> None:
    """A zero-weight SFT pass for a sharded rank with no micro-batch left (`sharded.ShardGroup.lockstep`):
    a two-token row through the same calls as a real pass (the prompt loss adds a second head call)."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=model.device)
    labels = torch.tensor([[IGNORE, 0]], device=model.device)
    with torch.set_grad_enabled(grad):
        if prompt_loss:
            loss, loss_p, _ = sft_losses(model, ids, labels, torch.tensor([[0, IGNORE]], device=model.device))
            loss = loss + loss_p
        else:
            loss, _ = completion_loss(model, ids, labels)
        if grad:
            (loss * 0.0).backward()


def train_sft(
    config: SFTConfig,
    examples: str | Path | Iterable[dict[str, Any]],
    model_dir: str | Path,
    out_dir: str | Path,
    eval_examples: str | Path | Iterable[dict[str, Any]] | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> Path:
    """Fine-tune the model in `model_dir` on `examples`; returns ``out_dir/final``.

    Args:
        config: an `SFTConfig`.
        examples: a JSONL path or a list of example dicts.
        model_dir: a local HF model directory (weights + tokenizer).
        out_dir: run directory; if it holds a checkpoint, training resumes
            from it (same config and data required for an exact resume).
        eval_examples: optional held-out examples (path or list) for eval_loss.
        on_step: called as ``on_step(step, record)`` after each logged step
            (an exception raised there interrupts the run like a crash).

    Returns:
        Path of the final HF model directory. When the time budget stops the
        run early it holds the latest weights and ``sft_state.json`` says
        ``"complete": false``; calling again resumes.

    Raises:
        ValueError: no usable examples, or a checkpoint made on other data.
    """
    cfg, out = config, Path(out_dir)
    if cfg.packing and cfg.prompt_loss_weight > 0:
        raise ValueError("sft.packing trains completions only: set prompt_loss_weight=0 or packing=false")
    group = current_group(cfg.device)  # a rank of torchrun or of `launch_ranks`; None: one process
    if cfg.lora.enabled and (group is not None or cfg.shard.ranks > 1):  # the export would hold peft's layer names
        raise ValueError("lora.r > 0 with sharded ranks is not supported yet: use shard.ranks = 1 or lora.r = 0")
    if group is None and cfg.shard.ranks > 1:  # this process becomes rank 0 of shard.ranks local ranks
        listed = [x if x is None or isinstance(x, (str, Path)) else list(x) for x in (examples, eval_examples)]
        args = (config, listed[0], model_dir, out_dir, listed[1])
        return launch_ranks(cfg.shard.ranks, train_sft, args, cfg.device, {"on_step": on_step})
    ranks = SFTRanks(group)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    dev = group.device if group is not None else torch.device(cfg.device)
    precision = cfg.precision if cfg.precision != "auto" else ("bf16_autocast" if dev.type == "cuda" else "fp32")
    amp_dtype = torch.bfloat16 if precision == "bf16_autocast" else torch.float32

    def autocast():
        return precision_autocast(dev, amp_dtype)

    tokenizer = load_tokenizer(model_dir)
    # fp32 master weights whatever the checkpoint's dtype; a checkpoint's weights are loaded below.
    # LoRA: the frozen base in the compute dtype, the (seeded) adapters are the fp32 masters.
    model = load_model(model_dir, dev, amp_dtype if cfg.lora.enabled else torch.float32)
    lora = apply_lora(model, cfg.lora, cfg.seed) if cfg.lora.enabled else None
    check_master_weights(model)
    model.train()
    if group is not None:
        shard_model(model, cfg.shard, group, amp_dtype)

    exs = load_examples(examples) if isinstance(examples, (str, Path)) else list(examples)
    prompt_fit: dict[str, int] = {}
    rows = tokenize_examples(tokenizer, exs, cfg.max_prompt_tokens, cfg.max_completion_tokens, prompt_fit)
    if ranks.main:
        (out / "prompt_fit.json").write_text(json.dumps({"examples": len(exs), **prompt_fit}))  # for reports
    if not rows:
        raise ValueError("no SFT examples with a non-empty completion")
    eval_rows = None
    if eval_examples is not None:
        ev = load_examples(eval_examples) if isinstance(eval_examples, (str, Path)) else list(eval_examples)
        eval_rows = tokenize_examples(tokenizer, ev, cfg.max_prompt_tokens, cfg.max_completion_tokens) or None
    lengths, pad_id = [len(r[0]) for r in rows], tokenizer.pad_token_id
    fingerprint = _fingerprint(rows)
    steps_per_epoch = len(plan_epoch(lengths, cfg.batch_tokens, cfg.seed, 0))
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and p.requires_grad]  # LoRA: adapters only
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 and p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, cfg.warmup_steps, total, cfg.min_lr_ratio))

    step, epoch_batches = 0, {}
    torch.manual_seed(cfg.seed)

    def restore(path: Path) -> tuple[dict, dict]:  # only JSON, safetensors and weights-only tensors are read
        state, ts = json.loads((path / "state.json").read_text()), load_trainer_state(path / "trainer_state.pt")
        if group is not None or is_sharded_checkpoint(path):  # DCP shards, at any number of ranks
            load_sharded(path, model, opt)  # a one-process checkpoint into a sharded run: FileNotFoundError
            sched.load_state_dict(ts["scheduler"])
            return state, ts
        if lora is not None:
            lora.load_adapter(path)
        else:
            load_model_weights(model, path)
        opt.load_state_dict(ts["optimizer"])
        sched.load_state_dict(ts["scheduler"])
        return state, ts

    if any((out / "checkpoints").glob("step_*")):  # a resume continues the same run only (other settings: error)
        check_resume_config(out / "sft_config.json", json.loads(cfg.model_dump_json()), RESUME_FREE)
    found = load_checkpoint(out, restore)  # an unreadable latest checkpoint falls back to the previous one
    if found is not None:
        ckpt, (state, ts) = found
        if state["fingerprint"] != fingerprint:
            raise ValueError(f"{ckpt} was made on other examples or tokenisation; use a new out_dir")
        set_rng_state(ts["rng"])
        step = state["step"]
        total = state.get("total_steps", total)  # a horizon fitted to the budget stays fixed
        epoch_batches[state["epoch"]] = state["epoch_batches"]
        if ranks.main:
            truncate_jsonl(out / "metrics.jsonl", step)
    if ranks.main:
        (out / "sft_config.json").write_text(cfg.model_dump_json(indent=2))

    def batches_of(epoch: int) -> list[list[int]]:
        if epoch not in epoch_batches:
            epoch_batches.clear()
            epoch_batches[epoch] = plan_epoch(lengths, cfg.batch_tokens, cfg.seed, epoch)
        return epoch_batches[epoch]

    def checkpoint() -> None:
        epoch = min(step // steps_per_epoch, (total - 1) // steps_per_epoch) if total else 0
        (save_checkpoint if group is None else ranks.save_checkpoint)(
            out,
            lora if lora is not None else model,  # LoRA: the adapter files (`LoRAModel.save_pretrained`)
            tokenizer,
            opt,
            sched,
            {
                "step": step,
                "epoch": epoch,
                "epoch_batches": batches_of(epoch),
                "total_steps": total,
                "fingerprint": fingerprint,
                "examples": len(rows),
            },
            cfg.keep_checkpoints,
        )

    metrics = out / "metrics.jsonl"
    tracker = Tracker(cfg.tracking if ranks.main else [], out, "sft", json.loads(cfg.model_dump_json()))

    def log(record: dict[str, Any]) -> None:
        if ranks.main:
            append_jsonl(metrics, record)
            tracker.log(record, record["step"])

    def idle(model_, grad: bool) -> None:  # a sharded rank out of micro-batches
        _idle_pass(model_, grad, prompt_loss=cfg.prompt_loss_weight > 0)

    run_start, run_start_step = time.monotonic(), step
    bar = tqdm(total=total, initial=step, desc="sft", disable=not (cfg.progress and ranks.main), dynamic_ncols=True)
    stopped = None
    while step < total:
        epoch, k = divmod(step, steps_per_epoch)
        batch = [rows[i] for i in batches_of(epoch)[k]]
        t0 = time.perf_counter()
        mine = ranks.share(batch)  # sharded: this rank's rows; the token counts are the whole batch's
        micro = split_micro(mine, cfg.micro_batch_tokens) if not cfg.packing else []
        n_target = sum(len(r[0]) - r[1] for r in batch)
        n_prompt = sum(r[1] - 1 for r in batch)  # the first token has no prediction
        opt.zero_grad(set_to_none=True)
        loss_sum, prompt_sum, n_tok = 0.0, 0.0, 0
        with ranks.passes(model, grad=True, idle=idle):
            for mb in micro:
                ids, labels = collate(mb, pad_id)
                n_tok += ids.numel()
                with autocast():
                    if cfg.prompt_loss_weight > 0:
                        p_labels = prompt_labels(ids, mb).to(dev)
                        loss, loss_p, _ = sft_losses(model, ids.to(dev), labels.to(dev), p_labels)
                        total_loss = loss / max(1, n_target) + cfg.prompt_loss_weight * loss_p / max(1, n_prompt)
                        prompt_sum += float(loss_p.detach())
                    else:
                        loss, _ = completion_loss(model, ids.to(dev), labels.to(dev))
                        total_loss = loss / max(1, n_target)
                total_loss.backward()
                loss_sum += float(loss.detach())
            if cfg.packing:  # the step's rows as one tree: shared prompt prefixes run once (train/packing.py)
                for loss, n in packed_sft_micro(model, mine, cfg.micro_batch_tokens, pad_id, autocast):
                    n_tok += n
                    (loss / max(1, n_target)).backward()
                    loss_sum += float(loss.detach())
        loss_sum, prompt_sum, n_tok = ranks.sum([loss_sum, prompt_sum, n_tok])
        grad_norm = clip_grad_norm(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        step += 1
        dt = time.perf_counter() - t0
        rec = {
            "step": step,
            "epoch": epoch,
            "loss": loss_sum / max(1, n_target),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens": int(n_tok),
            "target_tokens": n_target,
            "tok_per_s": n_tok / dt,
            "elapsed_s": round(time.monotonic() - t_start, 3),
        }
        if cfg.prompt_loss_weight > 0:
            rec["prompt_loss"] = prompt_sum / max(1, n_prompt)
        log(rec)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{lr:.2e}", tok_s=f"{rec['tok_per_s']:.0f}")
        if eval_rows and cfg.eval_every and step % cfg.eval_every == 0 and step < total:
            log({"step": step, "eval_loss": evaluate(model, eval_rows, pad_id, cfg.batch_tokens, autocast, ranks)})
        if on_step is not None and ranks.main:
            on_step(step, rec)
        if (
            cfg.fit_schedule_to_budget
            and cfg.max_minutes is not None
            and step == cfg.calibration_steps
            and run_start_step == 0
        ):
            # Decay within the budget instead of stopping at a high lr: the
            # horizon is fitted once, from the first steps' pace, and then
            # checkpointed so a resume keeps it.
            per_step = (time.monotonic() - run_start) / step
            fitted = step + int(0.95 * (cfg.max_minutes * 60 - (time.monotonic() - t_start)) / per_step)
            if fitted < total:
                total = max(step + 1, fitted)
                bar.total = total
                log({"step": step, "event": "schedule_fitted", "total_steps": total})
        over_budget = cfg.max_minutes is not None and time.monotonic() - t_start >= cfg.max_minutes * 60
        total, over_budget = (int(x) for x in ranks.agree([total, over_budget]))  # clock decisions: rank 0's
        if step == total or over_budget or (cfg.ckpt_every and step % cfg.ckpt_every == 0):
            checkpoint()
        if over_budget and step < total:
            stopped = "time_budget"
            break
    bar.close()
    if eval_rows and stopped is None:
        log({"step": step, "eval_loss": evaluate(model, eval_rows, pad_id, cfg.batch_tokens, autocast, ranks)})
    if stopped:
        log({"step": step, "event": "stopped", "reason": stopped})
    tracker.close()

    def write_state(tmp: Path) -> None:
        (tmp / "sft_state.json").write_text(
            json.dumps({"step": step, "total_steps": total, "complete": stopped is None})
        )

    def write_final(tmp: Path) -> None:
        if lora is not None:  # the merged model, its adapters in adapter/
            lora.export(tmp, export_dtype(model_dir))
        else:
            save_exported(model, tmp, export_dtype(model_dir))  # the source's dtype, not the fp32 master weights
        tokenizer.save_pretrained(str(tmp))
        write_state(tmp)

    if group is not None:  # the full weights gathered to rank 0, which writes them
        export_hf(model, tokenizer, out / "final", export_dtype(model_dir), write_state)
        return out / "final"
    return atomic_dir(out / "final", write_final)


def run_sft_job(cfg: SFTJobConfig, log: Callable[[str], None] = print) -> Path:
    """``evoharness sft``: `train_sft` on ``cfg.examples`` from ``cfg.model_path`` into ``cfg.out_dir``,
    then the final model's harness recipe (`config.recipe`): the examples' recipe (``collect`` and
    ``distill`` write one beside them), else the one of the model trained further, with this run's
    prompt budget and completion cap. Returns the final model directory.

    Raises:
        ValueError / FileNotFoundError: as `train_sft`.
    """
    from evoharness.config.harness import HarnessConfig
    from evoharness.config.recipe import ModelRecipe, read_examples_recipe, read_recipe, write_recipe

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    final = train_sft(cfg, cfg.examples, cfg.model_path, cfg.out_dir, cfg.eval_examples)
    made, source = read_examples_recipe(cfg.examples), read_recipe(cfg.model_path)
    if made is not None:
        harness, wording, experience = made.harness, made.wording, made.experience
    elif source is not None:
        harness, wording, experience = source.harness, source.wording, source.harness.experience_path
    else:
        harness, wording, experience = HarnessConfig(), "native", None
        log(f"{cfg.examples} has no recipe beside it: the model's recipe assumes the default BPE harness")
    recipe = ModelRecipe(
        harness=harness,
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_new_tokens=cfg.max_completion_tokens,
        constrained=source.constrained if source is not None else False,
        wording=wording,
    )
    if experience and not Path(experience).is_file():
        log(f"experience store {experience} is gone: the model's recipe has none")
        experience = None
    write_recipe(final, recipe, experience)
    return final
