"""Batched token choice on tensors, with per-request random streams.

`Sampler.choose` picks one token per row and returns its behaviour log-prob
under the project's contract (shared contracts, issue 10 fault 2): the
log-prob is ``log_softmax(logits / T + bias)`` at the chosen id, where ``T`` is
the temperature (``T == 0``, greedy, counts as 1) and ``bias`` is 0 or -inf
per id -- -inf for ids the tokenizer cannot produce and, under constrained
decoding, for every grammar-disallowed id. top-p is not part of it.

Sampling is the Gumbel-max trick: ``argmax(logits / T + bias + g)`` with
``g = -log(-log(u))``, ``u ~ U(0, 1)`` drawn from the request's own
`torch.Generator` (seeded with the request's seed), one vocabulary-sized
vector per step. A request's samples therefore do not depend on which other
requests share its batch. The uniforms are drawn ``chunk`` steps at a time
(one generator call per request per chunk instead of per step); torch's CPU
generator yields the same numbers either way, so the stream equals the
per-step one of `evoharness.engines.hf.Engine`.
"""

from __future__ import annotations

import torch


class Sampler:
    """Token choice for one batch of requests decoded in lock-step.

    Args:
        temperature: 0 for greedy, else the softmax temperature.
        top_p: nucleus mass kept when sampling (1.0 keeps all).
        seeds: one seed per request (ignored when greedy).
        vocab_size: logits width V.
        device: where the logits live.
        max_noise_bytes: cap on the buffered Gumbel noise ([B, chunk, V] fp32).
    """

    def __init__(
        self,
        temperature: float,
        top_p: float,
        seeds: list[int],
        vocab_size: int,
        device: torch.device,
        max_noise_bytes: int = 64 << 20,
    ):
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.greedy = self.temperature <= 0
        self.V, self.device = vocab_size, device
        self.gens = None if self.greedy else [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.chunk = max(1, min(16, max_noise_bytes // max(1, 4 * len(seeds) * vocab_size)))
        self._noise: torch.Tensor | None = None  # [B, chunk, V] Gumbel noise of the current chunk

    def select(self, rows: list[int]) -> None:
        """Keep the streams (and buffered noise) of `rows` only, in that order."""
        if self.gens is not None:
            self.gens = [self.gens[r] for r in rows]
            if self._noise is not None:
                self._noise = self._noise[torch.tensor(rows, device=self.device)]

    def _gumbel(self, step: int) -> torch.Tensor:
        k = step % self.chunk
        if k == 0 or self._noise is None:
            u = torch.empty(len(self.gens), self.chunk, self.V, device=self.device)
            for row, g in enumerate(self.gens):
                torch.rand(self.chunk, self.V, generator=g, device=self.device, out=u[row])
            self._noise = u.clamp_min_(1e-20).log_().neg_().log_().neg_()
        return self._noise[:, k]

    def choose(self, logits: torch.Tensor, bias: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick a token per row.

        Args:
            logits: [B, V] model logits (any float dtype).
            bias: [V] or [B, V] fp32 of 0 / -inf (ids never to produce).
            step: index of this decode step (selects the noise of the step).

        Returns:
            ([B] token ids, [B] fp32 behaviour log-probs).
        """
        scaled = logits.float()
        if not self.greedy and self.temperature != 1.0:
            scaled = scaled / self.temperature
        scaled = scaled + bias
        logp = torch.log_softmax(scaled, dim=-1)
        if self.greedy:
            tok = scaled.argmax(dim=-1)
        else:
            pick = scaled
            if self.top_p < 1.0:
                probs, order = logp.exp().sort(dim=-1, descending=True)
                drop_sorted = probs.cumsum(-1) - probs >= self.top_p  # keep the smallest prefix reaching top_p
                pick = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
            tok = (pick + self._gumbel(step)).argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
