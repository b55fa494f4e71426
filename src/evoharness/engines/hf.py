"""The module-forward engine (``hf``): batched decoding of any Hugging Face causal
LM with a transformers `DynamicCache` (`engines.static.StaticEngine` is the fast
one for Qwen/Llama-family models; both keep the contracts of `engines.grammar`).

`Engine.generate` takes a batch of tokenised prompts and decodes them together:

1. prefill: the prompts' longest common prefix (a harness's system message)
   runs once and its cache is repeated per row; the rest of each prompt,
   left-padded to one length, runs as one batch (2D attention mask, per-row
   ``position_ids``), filling a transformers `DynamicCache`; only the last
   position's logits are computed;
2. decode: one token per live sequence per step, fed back with the cache.
   Sequences that stop are dropped from the batch (and from the cache), so the
   cost of a step follows the number of sequences still running.

Sampling is greedy (``temperature == 0``) or temperature + top-p. Each request
owns a `torch.Generator` seeded from its ``seed`` and draws one Gumbel vector
per step from it, so a request's output does not depend on which other
requests share its batch. Log-probs follow `engines.grammar`'s contract.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from evoharness.engines.grammar import GenRequest, GenResult, GrammarMixin, Vocab, default_stop_ids


class Engine(GrammarMixin):
    """Batched KV-cache decoding for a Hugging Face causal LM.

    Args:
        model: any HF causal LM (eval mode; its device and dtype are used).
        tokenizer: its tokenizer; ids >= len(tokenizer) (embedding padding)
            are never produced.
        stop_ids: token ids that end a sequence; default: the tokenizer's and
            generation config's eos ids, ``<|im_end|>``, and ``</action>`` when
            it is a single token.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, stop_ids: list[int] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        if stop_ids is None:
            stop_ids = default_stop_ids(model, tokenizer)
        self.stop_ids = set(stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        self.invalid = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        self.invalid[len(tokenizer) :] = True
        self._vocab: Vocab | None = None
        self.min_shared_prefix = 32  # shorter common prefixes are not worth a separate prefill

    @torch.inference_mode()
    def generate(
        self, requests: list[GenRequest], max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0
    ) -> list[GenResult]:
        """Decode every request; returns one `GenResult` per request, in order.

        Args:
            requests: prompts (any lengths) with seeds and optional grammars.
            max_new_tokens: cap on generated tokens per request (stop token included).
            temperature: 0 for greedy, else the softmax temperature.
            top_p: nucleus mass kept when sampling (1.0 keeps all).

        Raises:
            ValueError: an empty prompt.
        """
        if not requests:
            return []
        if any(not r.prompt_ids for r in requests):
            raise ValueError("every request needs a non-empty prompt")
        dev, B = self.device, len(requests)
        results = [GenResult() for _ in requests]
        gens = [torch.Generator(device=dev).manual_seed(int(r.seed)) for r in requests] if temperature > 0 else None

        cache = DynamicCache(config=self.model.config)
        logits, attn, next_pos = self._prefill([r.prompt_ids for r in requests], cache)
        live = list(range(B))  # request index of each batch row

        for step in range(max_new_tokens):
            masks = None
            if any(requests[i].grammar is not None for i in live):
                masks = torch.ones((len(live), self.vocab_size), dtype=torch.bool, device=dev)
                for row, i in enumerate(live):
                    g = requests[i].grammar
                    if g is not None:
                        masks[row] = g.allowed(max_new_tokens - step)
            tok, lp = self._choose(logits.float(), temperature, top_p, [gens[i] for i in live] if gens else None, masks)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            keep = []
            for row, i in enumerate(live):
                t, res, g = tok_l[row], results[i], requests[i].grammar
                res.token_ids.append(t)
                res.logprobs.append(lp_l[row])
                if g is not None:
                    g.advance(t)
                if t in self.stop_ids or (g is not None and g.done):
                    res.finish_reason = "stop"
                else:
                    keep.append(row)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows from the batch and the cache
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                attn, next_pos, tok = attn[idx], next_pos[idx], tok[idx]
                live = [live[row] for row in keep]
            attn = torch.cat([attn, attn.new_ones((len(live), 1))], dim=1)
            logits = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            next_pos = next_pos + 1
        return results

    def _prefill(
        self, prompts: list[list[int]], cache: DynamicCache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the prompts into `cache`; returns (last logits [B, V], 2D mask [B, T], next positions [B]).

        The longest common prefix of the prompts (e.g. a harness's system
        message) is computed once and its cache rows repeated; the rest,
        left-padded, follows it: row layout ``[prefix][pad…][suffix]``, with
        the 2D mask hiding the pads and positions counting real tokens only.
        """
        dev, B = self.device, len(prompts)
        shared = 0
        if B > 1:
            shortest = min(map(len, prompts))
            while shared < shortest - 1 and all(p[shared] == prompts[0][shared] for p in prompts):
                shared += 1
            if shared < self.min_shared_prefix:
                shared = 0
        if shared:
            self.model(
                input_ids=torch.tensor([prompts[0][:shared]], device=dev),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache.batch_repeat_interleave(B)
        rest = [p[shared:] for p in prompts]
        L = max(map(len, rest))
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, shared + L), dtype=torch.long)
        attn[:, :shared] = 1
        for i, r in enumerate(rest):
            ids[i, L - len(r) :] = torch.tensor(r)
            attn[i, shared + L - len(r) :] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        logits = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        return logits, attn, pos[:, -1] + 1

    def _choose(
        self,
        logits: torch.Tensor,
        temperature: float,
        top_p: float,
        gens: list[torch.Generator] | None,
        allowed: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row. logits: [b, V] fp32; allowed: [b, V] bool or None.

        Returns ([b] ids, [b] log-probs of the sampled distribution: invalid ids and
        disallowed ids masked, before top-p; see the module docstring)."""
        scaled = logits / temperature if temperature > 0 else logits
        masked = scaled.masked_fill(self.invalid, float("-inf"))
        if allowed is not None:
            masked = masked.masked_fill(~allowed, float("-inf"))
        logp = torch.log_softmax(masked, dim=-1)
        if temperature <= 0:
            tok = masked.argmax(dim=-1)
        else:
            if top_p < 1.0:
                probs, order = torch.softmax(masked, dim=-1).sort(dim=-1, descending=True)
                drop_sorted = probs.cumsum(-1) - probs >= top_p  # keep the smallest prefix reaching top_p
                masked = masked.masked_fill(
                    torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf")
                )
            u = torch.stack([torch.rand(masked.shape[-1], generator=g, device=masked.device) for g in gens])
            gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
            tok = (masked + gumbel).argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
