"""An SFT anchor for GRPO: each update also descends the SFT loss on teacher rows.

InstructGPT's PPO-ptx (Ouyang et al. 2022, Eq. 2) mixes the pre-training
log-likelihood into the RL objective so RL does not unlearn what it was not
rewarded for. Here the data is the SFT stage's own teacher examples: update
``j`` adds the gradient of

    coef · (1/N_j) Σ_{k ∈ batch j} −log π_θ(y_k | context)      (completion tokens only)

to the GRPO gradient before clipping (`train.trainer.Trainer`'s ``anchor``).
``N_j`` is the batch's completion-token count; the batch is `sft.plan_epoch`'s
length-bucketed batch number ``j`` of the SFT examples (``batch_tokens`` padded
tokens), so a resumed run draws the same batches as an uninterrupted one. The
log-likelihood is of the raw model (T = 1, no action grammar), as SFT trained it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from evoharness.config.sft import SFTAnchorConfig
from evoharness.train.sft import collate, completion_loss, load_examples, plan_epoch, tokenize_examples


class SFTAnchor:
    """The anchor batches of one run; `for_step` gives a step's anchor (`train.trainer.Trainer.apply`).

    Raises:
        FileNotFoundError: no file at ``cfg.data_path`` (or none set); ValueError: a malformed example,
            or no example that fits the token budgets.
    """

    def __init__(self, cfg: SFTAnchorConfig, tokenizer: Any, seed: int, updates_per_step: int):
        if not Path(cfg.data_path).is_file():
            raise FileNotFoundError(f"sft_anchor.data_path {cfg.data_path!r} is not a file")
        self.cfg, self.seed, self.updates_per_step, self.tokenizer = cfg, seed, updates_per_step, tokenizer
        self.rows = tokenize_examples(
            tokenizer, load_examples(cfg.data_path), cfg.max_prompt_tokens, cfg.max_completion_tokens
        )
        if not self.rows:
            raise ValueError(f"sft_anchor: no example of {cfg.data_path} fits the token budgets")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._lengths = [len(r[0]) for r in self.rows]
        self._plans = {0: plan_epoch(self._lengths, cfg.batch_tokens, seed, 0)}

    def batch(self, i: int) -> list[tuple[list[int], int]]:
        """Rows of global anchor batch `i`: epochs of `sft.plan_epoch` batches, in order (every
        epoch has as many batches: the cuts depend on the sorted lengths only)."""
        epoch, k = divmod(i, len(self._plans[0]))
        if epoch not in self._plans:
            self._plans[epoch] = plan_epoch(self._lengths, self.cfg.batch_tokens, self.seed, epoch)
        return [self.rows[r] for r in self._plans[epoch][k]]

    def for_step(self, model: Any, step: int, amp: Callable | None = None) -> Callable[[int], dict[str, float]]:
        """The anchor of RL step `step` (0-based), called once per update j: it backpropagates
        ``coef ·`` the mean completion NLL of batch ``step · updates_per_step + j``.
        Returns ``{"anchor_nll": nats per token, "anchor_tokens": N_j}`` per update."""

        def nll_of(rows: list) -> tuple[Any, int]:
            with (amp or nullcontext)():
                ids, labels = collate(rows, self.pad_id)
                return completion_loss(model, ids.to(model.device), labels.to(model.device))

        def anchor(j: int) -> dict[str, float]:
            loss_sum, n = nll_of(self.batch(step * self.updates_per_step + j))
            nll = loss_sum / max(1, n)
            (self.cfg.coef * nll).backward()
            return {"anchor_nll": float(nll.detach()), "anchor_tokens": float(n)}

        return anchor
