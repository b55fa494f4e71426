"""A cell as a process with a real model: rollout calls, micro-batches, the core's optimizer step.

The process main of `local_backend.LocalModelBackend`. One cell holds one
copy of the policy (a Hugging Face causal LM, fp32 on CPU) and serves jobs
from its inbox, one at a time, in arrival order:

- ``call``: decode a prompt with the in-process `engine.Engine` and return the
  completion ids, their behaviour log-probs and the weights' version.
- ``train``: forward/backward of a micro-batch of turns with the weights of the
  batch's version (loaded from the shared weights directory when this cell
  holds another one); the loss is `train.grpo.microbatch_loss` (PPO clip on
  the ratio to the recorded behaviour log-probs, which bounds the update of
  samples up to η versions stale). The gradient is written atomically to
  ``grads/v{version}/{token}.pt`` so any cell can train and the core sums
  exactly the micro-batches it is told to.
- ``step`` (the core only; it holds the only optimizer state): sum the named
  gradient files, clip, AdamW step, write weights ``v{version + 1}``.
- ``load``: load the weights of a version (a weight sync, or a switch back to
  rollout with a version bump).
- ``switch``: change role; into rollout it loads the newest weights.

A job cancelled while it still waits in the inbox is skipped; one already
running completes and its result is discarded by the driver (a re-issued call).
"""

from __future__ import annotations

import os
import queue
from collections import deque
from pathlib import Path
from typing import Any


def _weights(work: Path, version: int) -> Path:
    return work / "weights" / f"v{version}.safetensors"


def _save_atomic(obj_writer, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    obj_writer(tmp)
    os.replace(tmp, path)


def cell_main(cell: int, model_dir: str, work_dir: str, lr: float, inbox: Any, outbox: Any) -> None:
    """Serve jobs until ``("stop",)``; replies ``(cell, pid, kind, token, result)``."""
    import torch
    from safetensors.torch import load_model as load_weights
    from safetensors.torch import save_model as save_weights

    from evoharness.engine import Engine, GenRequest
    from evoharness.models.init import load_model, load_tokenizer
    from evoharness.train.grpo import GRPOConfig, TokenMasks, TurnSample, microbatch_loss

    torch.set_num_threads(1)
    torch.manual_seed(cell)
    work = Path(work_dir)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    engine = Engine(model, tok)
    masks = TokenMasks(tok, engine.vocab_size)   # the sampler's support: ids < len(tokenizer)
    cfg = GRPOConfig(kl_beta=0.0, lr=lr, grad_clip=1.0, temperature=1.0)
    version = 0
    optimizer = None
    pid = os.getpid()
    outbox.put((cell, pid, "ready", 0, None))

    def ensure(v: int) -> None:
        nonlocal version
        if v != version:
            load_weights(model, str(_weights(work, v)))
            version = v

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
            return
        if kind == "cancel":
            cancelled.add(msg[1])
            continue
        token, payload = msg[1], msg[2]
        if token in cancelled:
            cancelled.discard(token)
            continue
        result: Any = None
        if kind == "call":
            prompt_ids, max_new, seed = payload
            r = engine.generate([GenRequest(list(prompt_ids), seed=seed)], max_new_tokens=max_new,
                                temperature=1.0)[0]
            result = (r.token_ids, r.logprobs, version)
        elif kind == "train":
            v, samples = payload
            ensure(v)
            model.zero_grad(set_to_none=True)
            turns = [TurnSample(**s) for s in samples]
            with torch.enable_grad():
                loss, stats = microbatch_loss(model, turns, cfg, masks=masks)
                loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            model.zero_grad(set_to_none=True)
            d = work / "grads" / f"v{v}"
            d.mkdir(parents=True, exist_ok=True)
            _save_atomic(lambda p: torch.save(grads, p), d / f"{token}.pt")
            result = {"loss": stats["loss"], "n_tokens": stats["n_tokens"], "ratio_max": stats["ratio_max"]}
        elif kind == "step":
            v, tokens = payload
            ensure(v)
            if optimizer is None:
                optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                              weight_decay=0.0)
            params = dict(model.named_parameters())
            total: dict[str, torch.Tensor] = {}
            for t in tokens:   # exactly the micro-batches of this version, each once
                for n, g in torch.load(work / "grads" / f"v{v}" / f"{t}.pt").items():
                    total[n] = total[n] + g if n in total else g
            for n, p in params.items():
                p.grad = total.get(n)
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            optimizer.step()
            model.zero_grad(set_to_none=True)
            _weights(work, v + 1).parent.mkdir(parents=True, exist_ok=True)
            _save_atomic(lambda p: save_weights(model, str(p)), _weights(work, v + 1))
            version = v + 1
            result = {"grad_norm": norm, "micro_batches": len(tokens)}
        elif kind == "load":
            ensure(payload)
            result = version
        elif kind == "switch":
            role, newest = payload
            if role == 0:      # Role.ROLLOUT: serve with the newest weights
                ensure(newest)
            result = role
        outbox.put((cell, pid, kind, token, result))
