"""A cell as a process with a real model: rollout calls, micro-batches, the core's optimizer step.

The process main of `local_backend.LocalModelBackend`. One cell holds one
copy of the policy (a Hugging Face causal LM, fp32 on CPU) and serves jobs
from its inbox, one at a time, in arrival order (policy calls queued back to
back are decoded as one batch):

- ``call``: decode a prompt with the in-process `engines.hf.Engine` (at the payload's
  temperature, default 1) and return the completion ids, their behaviour log-probs and
  the weights' version. With a
  ``policy`` option the cell serves a `policies.local.LocalHFPolicy` instead and
  a call is one `PolicyRequest` (as a dict: ``messages``, ``episode_id``,
  ``turn``, ``admissible_commands``, ``meta_verbs``) answered with the
  `Completion` as a dict: the prompt recipe, the action grammar and the
  per-(episode, turn) sampling seed of the in-process RL loop, so a call
  re-issued on another cell with the same weights returns the same completion.
- ``train``: forward/backward of a micro-batch of turns with the weights of the
  batch's version (loaded from the shared weights directory when this cell
  holds another one); the loss is `train.grpo.microbatch_loss` (on the async
  schedules decoupled PPO: clip against the weights being trained, the recorded
  behaviour log-probs of samples up to η versions stale as a truncated
  importance weight; `alfworld_backend.cell_grpo`), over chunks of ``micro_batch_size`` turns
  (length-sorted, as `train.grpo.accumulate_gradients`), with the KL term to
  the initial weights when ``kl_beta`` > 0. The gradient is written atomically to
  ``grads/v{version}/{token}.pt`` so any cell can train and the core sums
  exactly the micro-batches it is told to.
- ``step`` (the core only; it holds the only optimizer state): sum the named
  gradient files (times an optional ``scale``: the token weights' 1/M when
  the step batch's trainable trajectory count M is known only at the end),
  clip, AdamW step at the version's lr (`train.grpo.lr_at`), write weights
  ``v{version + 1}`` and the optimizer state ``optim/v{version + 1}.pt`` (a
  resumed job's core continues from it).
- ``dp_step`` (colocate/async, with a ``dp`` option): the cell is a replica of a
  fixed data-parallel group (`runtime.replicas`): its ``train`` jobs accumulate
  gradients in memory instead of writing files, and at the sync every member
  all-reduces them and steps its own AdamW replica; the core also writes the
  weights and optimizer state as ``step`` does.
- ``load``: load the weights of a version (a weight sync, or a switch back to
  rollout with a version bump).
- ``switch``: change role; into rollout it loads the newest weights.

A job cancelled while it still waits in the inbox is skipped; one already
running completes and its result is discarded by the driver (a re-issued call).
"""

from __future__ import annotations

import os
import queue
import time
from collections import deque
from pathlib import Path
from typing import Any


def _weights(work: Path, version: int) -> Path:
    return work / "weights" / f"v{version}.safetensors"


MAX_CALL_BATCH = 64    # policy calls one cell decodes together


def _optim(work: Path, version: int) -> Path:
    return work / "optim" / f"v{version}.pt"


def _save_atomic(obj_writer, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    obj_writer(tmp)
    os.replace(tmp, path)


def cell_main(cell: int, model_dir: str, work_dir: str, lr: float, inbox: Any, outbox: Any,
              options: dict[str, Any] | None = None) -> None:
    """Serve jobs until ``("stop",)``; replies ``(cell, pid, kind, token, result)``.

    Args:
        options: ``{"policy": LocalHFPolicy keyword arguments, "grpo": GRPOConfig
            fields, "version": weights version to start from (a resumed job)}``;
            the GRPO config's ``lr`` then replaces `lr`. None: the bare engine
            and ``GRPOConfig(kl_beta=0, lr=lr, grad_clip=1)`` from version 0.
    """
    import dataclasses
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_model as load_weights
    from safetensors.torch import save_model as save_weights

    from evoharness.engines.grammar import GenRequest
    from evoharness.engines.hf import Engine
    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.train.grpo import TokenMasks, TurnSample, lr_at, microbatch_loss, set_lr
    from evoharness.config.rl import GRPOConfig

    torch.set_num_threads(1)
    torch.manual_seed(cell)
    work = Path(work_dir)
    options = options or {}
    policy = None
    if "policy" in options:
        from evoharness.policies.base import PolicyRequest
        from evoharness.policies.local import LocalHFPolicy

        policy = LocalHFPolicy(model_dir, device="cpu", dtype=torch.float32, **options["policy"])
        tok, model, engine = policy.tokenizer, policy.model, policy.engine
    else:
        tok = load_tokenizer(model_dir)
        model = load_model(model_dir)
        engine = Engine(model, tok)
    masks = TokenMasks(tok, model.get_output_embeddings().weight.shape[0])   # the sampler's support
    cfg = (GRPOConfig(**options["grpo"]) if "grpo" in options
           else GRPOConfig(kl_beta=0.0, lr=lr, grad_clip=1.0, temperature=1.0))
    ref = None      # the KL reference (the initial weights), loaded on the first micro-batch that needs it
    version = 0
    optimizer = None
    pid = os.getpid()

    def ensure(v: int) -> None:
        nonlocal version
        if v != version:
            load_weights(model, str(_weights(work, v)))
            version = v

    def make_optimizer(v: int) -> Any:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                weight_decay=cfg.weight_decay)
        if v > 0:        # a resumed job: the moments as of weights v
            opt.load_state_dict(torch.load(_optim(work, v), weights_only=True))
        return opt

    def publish(v: int) -> None:
        """Weights v + 1 and the optimizer state as of them, for any cell and a resumed job."""
        _weights(work, v + 1).parent.mkdir(parents=True, exist_ok=True)
        _save_atomic(lambda p: save_weights(model, str(p)), _weights(work, v + 1))
        _optim(work, v + 1).parent.mkdir(parents=True, exist_ok=True)
        _save_atomic(lambda p: torch.save(optimizer.state_dict(), p), _optim(work, v + 1))
        _optim(work, v - 1).unlink(missing_ok=True)     # a checkpoint at v or v + 1 needs no older one

    replica = None     # a member of the data-parallel train group (colocate/async: `runtime.replicas`)
    if cell in options.get("dp", {}).get("ranks", {}):
        from evoharness.runtime.replicas import ReplicaGroup

        dp = options["dp"]
        replica = ReplicaGroup(dp["ranks"][cell], len(dp["ranks"]), dp["init_method"],
                               "nccl" if next(model.parameters()).is_cuda else "gloo")

    ensure(options.get("version", 0))
    outbox.put((cell, pid, "ready", 0, None))

    pending: deque = deque()
    cancelled: set[int] = set()
    parent = os.getppid()
    while True:
        while not pending:
            if os.getppid() != parent:
                return              # the driver died: do not linger
            try:
                pending.append(inbox.get(timeout=1.0))
            except queue.Empty:
                pass
        while True:   # read what else waits, so cancels catch jobs not yet started
            try:
                pending.append(inbox.get_nowait())
            except queue.Empty:
                break
        msg = pending.popleft()
        kind = msg[0]
        if kind == "stop":
            if replica is not None:
                replica.close()
            return
        if kind == "cancel":
            cancelled.add(msg[1])
            continue
        token, payload = msg[1], msg[2]
        if token in cancelled:
            cancelled.discard(token)
            continue
        result: Any = None
        t0 = time.perf_counter()
        if kind == "call" and isinstance(payload, dict):
            # decode this call with the policy calls queued right behind it (up to the next
            # job of another kind, which may change the weights) as one batch
            batch = [(token, payload)]
            cancelled |= {m[1] for m in pending if m[0] == "cancel"}
            while (pending and len(batch) < MAX_CALL_BATCH and
                   (pending[0][0] == "cancel" or pending[0][0] == "call" and isinstance(pending[0][2], dict))):
                m = pending.popleft()
                if m[0] == "call" and m[1] in cancelled:
                    cancelled.discard(m[1])
                elif m[0] == "call":
                    batch.append((m[1], m[2]))
            policy.policy_version = version
            reqs = [PolicyRequest(p["messages"], p["episode_id"], p["turn"], list(p["admissible_commands"]),
                                  harness=SimpleNamespace(meta_verbs=tuple(p["meta_verbs"]))) for _, p in batch]
            comps = policy.act(reqs)
            share = (time.perf_counter() - t0) / len(batch)      # cell-seconds per call
            for (tok_i, _), comp in zip(batch[1:], comps[1:]):
                outbox.put((cell, pid, kind, tok_i, {**dataclasses.asdict(comp), "seconds": share}))
            result = {**dataclasses.asdict(comps[0]), "seconds": share}
        elif kind == "call":
            prompt_ids, max_new, seed, *temp = payload     # temp: a workload's sampling temperature (default 1)
            r = engine.generate([GenRequest(list(prompt_ids), seed=seed)], max_new_tokens=max_new,
                                temperature=temp[0] if temp else 1.0)[0]
            result = (r.token_ids, r.logprobs, version)
        elif kind == "train":
            v, samples = payload
            ensure(v)
            model.zero_grad(set_to_none=True)
            if cfg.kl_beta > 0 and ref is None:
                ref = load_model(model_dir).eval().requires_grad_(False)
            turns = sorted((TurnSample(**s) for s in samples), key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
            stats: dict[str, float] = {}
            with torch.enable_grad():
                for k in range(0, len(turns), cfg.micro_batch_size):
                    loss, st = microbatch_loss(model, turns[k:k + cfg.micro_batch_size], cfg, ref, masks)
                    loss.backward()
                    for key, x in st.items():
                        stats[key] = max(stats.get(key, 0.0), x) if key == "ratio_max" else stats.get(key, 0) + x
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            model.zero_grad(set_to_none=True)
            if replica is not None:      # all-reduced at the sync (`runtime.replicas`)
                replica.accumulate(grads)
            else:
                d = work / "grads" / f"v{v}"
                d.mkdir(parents=True, exist_ok=True)
                _save_atomic(lambda p: torch.save(grads, p), d / f"{token}.pt")
            result = {"version": v, **stats, "seconds": time.perf_counter() - t0}
        elif kind == "dp_step":     # a data-parallel replica's step: all-reduce, AdamW (`runtime.replicas`)
            v, scale = payload
            ensure(v)
            optimizer = optimizer or make_optimizer(v)
            lr = lr_at(cfg, v, cfg.lr_decay_steps or 1)
            set_lr(optimizer, lr)
            n_mb = replica.micro_batches
            norm = replica.step(model, optimizer, scale, cfg.grad_clip)
            if replica.rank == 0:    # the core publishes the weights (rollout cells, job checkpoints)
                publish(v)
            version = v + 1
            result = {"grad_norm": norm, "micro_batches": n_mb, "rank": replica.rank, "lr": lr,
                      "seconds": time.perf_counter() - t0}
        elif kind == "step":
            v, tokens, *rest = payload
            scale = rest[0] if rest else 1.0
            ensure(v)
            optimizer = optimizer or make_optimizer(v)
            lr = lr_at(cfg, v, cfg.lr_decay_steps or 1)
            set_lr(optimizer, lr)
            params = dict(model.named_parameters())
            total: dict[str, torch.Tensor] = {}
            for t in tokens:   # exactly the micro-batches of this version, each once
                for n, g in torch.load(work / "grads" / f"v{v}" / f"{t}.pt").items():
                    total[n] = total[n] + g if n in total else g
            for n, p in params.items():
                p.grad = total[n] * scale if n in total else None
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            optimizer.step()
            model.zero_grad(set_to_none=True)
            publish(v)
            version = v + 1
            result = {"grad_norm": norm, "micro_batches": len(tokens), "lr": lr, "seconds": time.perf_counter() - t0}
        elif kind == "load":
            ensure(payload)
            result = version
        elif kind == "switch":
            role, newest = payload
            if role == 0:      # Role.ROLLOUT: serve with the newest weights
                ensure(newest)
            result = role
        outbox.put((cell, pid, kind, token, result))
