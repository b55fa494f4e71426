"""`ActionGrammarLogitsProcessor`: `evoharness.engine.ActionGrammar` inside vLLM.

Imports vllm: load it only where vllm is installed. A vLLM (v1) logits
processor, so it also plugs into an OpenAI-compatible server:

    vllm serve MODEL_DIR --logits-processors evoharness.engines.vllm_grammar:ActionGrammarLogitsProcessor \\
        --logprobs-mode processed_logprobs --enable-prefix-caching

For every row it adds -inf to ids beyond the tokenizer; for a row whose
``SamplingParams.extra_args["action_grammar"]`` is
``{"commands": [...], "meta_verbs": [...], "max_new_tokens": N}`` (the shared
constraint record) it also adds -inf to every id the grammar disallows -- the
masks the trainer rebuilds by replaying the grammar -- and once the grammar is
done it allows only end-of-sequence. Masks are cached per grammar state
(`evoharness.engines.masks.MaskCache`).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from evoharness.engine import ActionGrammar, Vocab
from evoharness.engines.masks import MaskCache
from evoharness.engines.vllm_engine import ACTION_GRAMMAR_KEY
from evoharness.models.init import load_tokenizer


class ActionGrammarLogitsProcessor(LogitsProcessor):
    """See the module docstring. Not argmax-invariant: it also applies to greedy rows."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        mc = vllm_config.model_config
        tok = load_tokenizer(mc.tokenizer or mc.model)
        size = mc.get_vocab_size()
        self.vocab = Vocab(tok, size, device)
        invalid = torch.zeros(size, dtype=torch.bool, device=device)
        invalid[len(tok):] = True
        self.masks = MaskCache(invalid)
        self.eos_only = torch.full((size,), float("-inf"), device=device)
        self.eos_only[tok.eos_token_id] = 0.0
        self.rows: dict[int, list] = {}  # batch index -> [grammar, output ids (live list), consumed, max_tokens]

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for i, params, _prompt, out in batch_update.added:
            spec = (params.extra_args or {}).get(ACTION_GRAMMAR_KEY)
            if spec is None:
                self.rows.pop(i, None)
                continue
            g = ActionGrammar(self.vocab, list(spec["commands"]), tuple(spec.get("meta_verbs") or ()))
            self.rows[i] = [g, out, 0, int(spec.get("max_new_tokens") or params.max_tokens)]
        for a, b, kind in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if kind == MoveDirectionality.SWAP and rb is not None:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits.add_(self.masks.base)
        memo: dict[int, tuple] = {}  # per call: grammars may be dropped between calls (ids reused)
        bias = []
        for i in range(logits.shape[0]):
            row = self.rows.get(i)
            if row is None:
                bias.append(self.masks.base)
                continue
            g, out, seen, max_tokens = row
            for t in out[seen:]:
                g.advance(t)
            row[2] = len(out)
            bias.append(self.eos_only if g.done else self.masks.bias(g, max_tokens - len(out), memo))
        return logits.add_(torch.stack(bias))
