"""`StaticEngine`: the in-process engine at the CPU's limit.

Same interface and contracts as `evoharness.engines.hf.Engine` (``generate``,
``grammar``, ``vocab``, ``stop_ids``), faster:

- the forward is `StaticKVDecoder` (lean Qwen3-family forward over a
  pre-allocated KV cache; shared-prefix prefill kept);
- token choice is batched on tensors (`Sampler`): one log-softmax, one argmax,
  Gumbel noise drawn per request a chunk of steps at a time;
- grammar masks come from `MaskCache` (one bias row per grammar state, not a
  Python-built mask per row per step); rows without a grammar cost nothing;
- tokens and log-probs are written into [B, max_new_tokens] tensors; Python
  touches a row only when it finishes or its grammar advances;
- finished rows stay in the batch until a quarter of it has finished, then the
  batch (KV cache included) is compacted once.

Contracts (tests/engines/test_static_engine.py): greedy output equals HF
``generate`` token for token; seeded sampling does not depend on batch
composition (and draws the same random stream as `Engine`); the behaviour
log-prob is ``log_softmax(logits / T + bias)`` at the chosen id, bias being
-inf on ids beyond the tokenizer and on grammar-disallowed ids (the shared
behaviour log-prob contract); constrained outputs always parse as an
admissible command or meta-action.

Models `StaticKVDecoder` does not support are refused at construction
(`make_engine` then falls back to `Engine`).
"""

from __future__ import annotations

import threading
import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evoharness.engines.decoder import StaticKVDecoder
from evoharness.engines.grammar import GenRequest, GenResult, GrammarMixin, Vocab, default_stop_ids
from evoharness.engines.masks import MaskCache
from evoharness.engines.sampling import Sampler


class StaticEngine(GrammarMixin):
    """Batched decoding with a static KV cache for a Qwen3-family HF causal LM.

    Args:
        model: the HF model (eval mode). Its weights are read in place: an
            optimizer step or ``load_state_dict`` on it is picked up by the next
            `generate` call (weight sync needs nothing more).
        tokenizer: its tokenizer; ids >= len(tokenizer) are never produced.
        stop_ids: ids that end a sequence (default `default_stop_ids`).

    Raises:
        ValueError: a model `StaticKVDecoder` cannot run.
    """

    name = "static"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, stop_ids: list[int] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.decoder = StaticKVDecoder(model)
        self.device = self.decoder.device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.stop_ids = set(default_stop_ids(model, tokenizer) if stop_ids is None else stop_ids)
        self._stop = torch.tensor(sorted(self.stop_ids), dtype=torch.long, device=self.device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        invalid = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        invalid[len(tokenizer) :] = True
        self.masks = MaskCache(invalid)
        self._vocab: Vocab | None = None
        self.min_shared_prefix = 32  # shorter common prefixes are not worth a separate prefill
        self._lock = threading.Lock()  # one call at a time: the KV buffer and mask cache are shared
        # cumulative counters (seconds are wall time): where generation time goes
        self.stats = {"calls": 0, "prompt_tokens": 0, "new_tokens": 0, "prefill_s": 0.0, "decode_s": 0.0}

    @torch.inference_mode()
    def generate(
        self, requests: list[GenRequest], max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0
    ) -> list[GenResult]:
        """Decode every request; one `GenResult` per request, in order.

        Args:
            requests: prompts (any lengths) with seeds and optional grammars.
            max_new_tokens: cap on generated tokens per request (stop token included).
            temperature: 0 for greedy, else the softmax temperature.
            top_p: nucleus mass kept when sampling (1.0 keeps all).

        Raises:
            ValueError: an empty prompt, or ``max_new_tokens < 1``.
        """
        if not requests:
            return []
        if any(not r.prompt_ids for r in requests):
            raise ValueError("every request needs a non-empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        with self._lock:
            return self._generate(requests, max_new_tokens, temperature, top_p)

    def _generate(self, requests: list[GenRequest], N: int, temperature: float, top_p: float) -> list[GenResult]:
        dev, B = self.device, len(requests)
        order = sorted(range(B), key=lambda i: len(requests[i].prompt_ids))  # prefill chunks pad less
        if order != list(range(B)):
            res = self._generate([requests[i] for i in order], N, temperature, top_p)
            out: list[GenResult] = [None] * B  # type: ignore[list-item]
            for k, i in enumerate(order):
                out[i] = res[k]
            return out
        t0 = time.perf_counter()
        self.decoder.refresh()
        logits, st = self.decoder.prefill([r.prompt_ids for r in requests], N, self.min_shared_prefix, self.pad_id)
        t1 = time.perf_counter()
        sampler = Sampler(temperature, top_p, [r.seed for r in requests], self.vocab_size, dev)
        out_tok = torch.zeros((B, N), dtype=torch.long, device=dev)
        out_lp = torch.zeros((B, N), dtype=torch.float32, device=dev)
        length, finish = [N] * B, ["length"] * B
        rows = list(range(B))  # request index of each batch row
        rows_t = torch.arange(B, device=dev)
        alive = [True] * B  # per batch row: still decoding
        grammars = [r.grammar for r in requests]
        constrained = any(g is not None for g in grammars)
        memo: dict[int, tuple] = {}
        n_dead = 0
        for step in range(N):
            if constrained:
                bias = torch.stack(
                    [
                        self.masks.bias(grammars[i], N - step, memo)
                        if alive[row] and grammars[i] is not None
                        else self.masks.base
                        for row, i in enumerate(rows)
                    ]
                )
            else:
                bias = self.masks.base
            tok, lp = sampler.choose(logits, bias, step)
            out_tok[rows_t, step] = tok
            out_lp[rows_t, step] = lp
            done = torch.isin(tok, self._stop)
            if constrained:
                tl = tok.tolist()
                for row, i in enumerate(rows):
                    g = grammars[i]
                    if g is not None and alive[row]:
                        g.advance(tl[row])
                        if g.done:
                            done[row] = True
            if done.any():
                for row in done.nonzero().flatten().tolist():
                    if alive[row]:
                        alive[row] = False
                        n_dead += 1
                        length[rows[row]], finish[rows[row]] = step + 1, "stop"
                if n_dead == len(rows):
                    break
            if step == N - 1:
                break
            if n_dead and 4 * n_dead >= len(rows):  # compact: drop finished rows from batch and cache
                keep = [row for row in range(len(rows)) if alive[row]]
                idx = torch.tensor(keep, device=dev)
                st.select(idx)
                sampler.select(keep)
                tok, rows, rows_t = tok[idx], [rows[r] for r in keep], rows_t[idx]
                alive, n_dead = [True] * len(keep), 0
            logits = self.decoder.decode(tok, st)
        toks, lps = out_tok.tolist(), out_lp.tolist()
        s = self.stats
        s["calls"] += 1
        s["prompt_tokens"] += sum(len(r.prompt_ids) for r in requests)
        s["new_tokens"] += sum(length)
        s["prefill_s"] += t1 - t0
        s["decode_s"] += time.perf_counter() - t1
        return [
            GenResult(token_ids=toks[i][: length[i]], logprobs=lps[i][: length[i]], finish_reason=finish[i])
            for i in range(B)
        ]
