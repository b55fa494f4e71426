"""The policy update on one device: GRPO rows in, gradients, the SFT anchor, clipping, AdamW.

A `Trainer` holds the weights being trained (fp32 master weights, `train.precision`), the
AdamW state, the frozen KL reference (None when ``kl_beta = 0``) and the token masks that
rebuild the sampler's distribution (`train.grpo.TokenMasks`). It knows nothing of cells or
schedules: the runtime hands it rows (`accumulate`) and asks it to apply an update (`apply`);
`train.step.run_updates` is the loop of a step's updates. A trainer in a data-parallel group
(`reducer`, `train.distributed.AllReduce`) sums its gradient with the other ranks' before
clipping, so every rank applies the same update to its replica.

Sharded (FSDP2, `train.sharded`: the model from `shard_model`, ``reducer`` its `ShardGroup`):
each rank holds a shard of the weights and AdamW state and trains its own share of every
update's rows (token weights set over the whole update); the backward sums the ranks'
gradients. Forwards are collectives there, so every rank calls `prepare`, `accumulate` and
`apply` for the same updates (a share may be empty; `apply` then idles along the other ranks'
passes) and the passes of each call run in lockstep (`ShardGroup.lockstep`); every rank runs
the SFT anchor, its gradient averaged over the ranks (the one-rank anchor gradient). The KL
reference stays an unsharded module on each rank.

Rows are trained as turn rows (length-sorted micro-batches of ``micro_batch_size`` rows) or,
with ``grpo.packing``, tree-packed: each execution's rows folded into one prefix-shared tree, a
shared prefix run once, every row's tokens still weighted and advantaged as its own
(`rollout.tree.TreeNode.claims`). Both are the same objective (tested to 1e-5); packing only
saves forward/backward work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig
from evoharness.train.distributed import clip_grad_norm
from evoharness.train.grpo import TokenMasks, TurnSample, microbatch_loss, proximal_logprobs
from evoharness.train.precision import check_master_weights
from evoharness.train.step import sum_stats


class Trainer:
    """GRPO updates of `model` (module docstring).

    Args:
        model: the policy (a Hugging Face causal LM) with fp32 trainable parameters.
        tokenizer: its tokenizer (the sampler's vocabulary, for `TokenMasks`).
        cfg: the loss, optimizer and batching settings.
        ref_model: the frozen KL reference (required when ``cfg.kl_beta > 0``).
        amp: wraps forward passes (autocast for bf16 compute); backward runs outside it.
        anchor: the SFT anchor (`train.sft_anchor.SFTAnchor`) whose gradient each update adds on
            rank 0 (sharded: on every rank, averaged); None: GRPO alone.
        reducer: the data-parallel group (`train.distributed.DataParallelGroup`: `AllReduce` for
            replicas, `train.sharded.ShardGroup` for a sharded model); None: one rank.

    Raises:
        ValueError: bf16 master weights; ``kl_beta > 0`` without a reference model.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: GRPOConfig,
        *,
        ref_model: Any = None,
        amp: Callable[[], AbstractContextManager] = nullcontext,
        anchor: Any = None,
        reducer: Any = None,
    ):
        if cfg.kl_beta > 0 and ref_model is None:
            raise ValueError("kl_beta > 0 needs the reference model")
        check_master_weights(model)
        self.model, self.cfg, self.ref, self.amp, self.anchor, self.reducer = (
            model,
            cfg,
            ref_model,
            amp,
            anchor,
            reducer,
        )
        self.masks = TokenMasks(tokenizer, model.get_output_embeddings().weight.shape[0])
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self._accumulated = False  # since the last apply (sharded: a rank with no rows idles along in apply)

    @property
    def rank(self) -> int:
        return self.reducer.rank if self.reducer is not None else 0

    @property
    def sharded(self) -> bool:
        return bool(getattr(self.reducer, "sharded", False))

    def _passes(self, grad: bool) -> AbstractContextManager:
        """A block of forward passes: in lockstep with the other ranks when sharded (module docstring)."""
        return self.reducer.lockstep(self.model, grad) if self.sharded else nullcontext()

    def prepare(self, updates: Sequence[Sequence[TurnSample]]) -> None:
        """Before a step's updates: decoupled PPO with several updates records π_prox, the log-probs
        under the weights the step starts from, for every row (no gradient); with one update the
        weights the gradient is taken at are π_prox (`grpo.token_terms`)."""
        if self.cfg.off_policy == "decoupled" and len(updates) > 1:
            seen: set[int] = set()
            rows = [r for u in updates for r in u if id(r) not in seen and not seen.add(id(r))]
            self.model.train()
            with torch.no_grad(), self._passes(grad=False):
                for k in range(0, len(rows), self.cfg.micro_batch_size):
                    chunk = rows[k : k + self.cfg.micro_batch_size]
                    with self.amp():
                        lps = proximal_logprobs(self.model, chunk, self.cfg, self.masks)
                    for r, lp in zip(chunk, lps):
                        r.prox_logprobs = lp

    def accumulate(self, rows: Sequence[TurnSample]) -> dict[str, float]:
        """Forward/backward of `rows` (weights already set); their gradient adds to ``.grad``.
        Returns the micro-batches' summed statistics (`grpo.microbatch_loss`)."""
        self.model.train()
        self._accumulated = True
        with self._passes(grad=True):
            if self.cfg.packing:
                from evoharness.train.tree_loss import packed_rows_accumulate

                return packed_rows_accumulate(self.model, rows, self.cfg, self.ref, self.masks, self.amp)
            order = sorted(rows, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
            parts = []
            for k in range(0, len(order), self.cfg.micro_batch_size):
                with self.amp():
                    loss, st = microbatch_loss(
                        self.model, order[k : k + self.cfg.micro_batch_size], self.cfg, self.ref, self.masks
                    )
                loss.backward()
                parts.append(st)
            return sum_stats(parts)

    def apply(self, lr: float, step: int, update: int = 0, scale: float = 1.0) -> dict[str, float]:
        """One optimizer update with the accumulated gradient: times `scale`, plus (rank 0) the SFT
        anchor's gradient for update `update` of RL step `step`, summed over the data-parallel
        group, clipped to ``grad_clip``, AdamW at `lr`; the gradient is cleared. Returns
        ``grad_norm`` (before clipping) and the anchor's metrics."""
        if self.sharded and not self._accumulated:  # no rows here (run_updates skipped accumulate)
            with self._passes(grad=True):
                pass
        self._accumulated = False
        params = [p for p in self.model.parameters() if p.requires_grad]
        if scale != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        out: dict[str, float] = {}
        if self.anchor is not None and self.sharded:  # a forward on every rank: the gradient averaged
            with self.reducer.averaged(self.model):
                out.update(self.anchor.for_step(self.model, step, self.amp)(update))
        elif self.anchor is not None and self.rank == 0:
            out.update(self.anchor.for_step(self.model, step, self.amp)(update))
        if self.reducer is not None:
            self.reducer.reduce(self.model)
        with_grad = [p for p in params if p.grad is not None]
        out["grad_norm"] = clip_grad_norm(with_grad, self.cfg.grad_clip) if with_grad else 0.0
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def gradients(self) -> dict[str, torch.Tensor]:
        """The accumulated gradient by parameter name (cleared here): what a satellite hands the core."""
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.model.zero_grad(set_to_none=True)
        return grads

    def add_gradients(self, grads: dict[str, torch.Tensor]) -> None:
        """Add another rank's `gradients` to this one's."""
        params = dict(self.model.named_parameters())
        for n, g in grads.items():
            p = params[n]
            p.grad = g.to(p.device) if p.grad is None else p.grad + g.to(p.device)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
