"""The inference engine: batched decoding with a KV cache for many sequences.

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
requests share its batch.

Behaviour log-probs (the project's engine <-> trainer contract): every
produced token comes with ``log_softmax`` of the distribution it was actually
sampled from: ``logits / temperature`` (``temperature == 0`` counts as 1) with
the ids ``>= len(tokenizer)`` and, under constrained decoding, every id the
grammar disallows set to ``-inf``. top-p is not part of it (keep ``top_p=1``
for RL). A forced token (the only allowed id) therefore has log-prob exactly 0.
A trainer rebuilds the same masks with `ActionGrammar.replay` from the
request's constraint (`ActionGrammar.constraint`) and recomputes the same
numbers from the same logits.

Constrained decoding (`ActionGrammar`) restricts a completion to
``<think>free text</think><action>A</action>`` where A is an admissible command
or ``verb free-text`` for an allowed meta verb (see the class docstring).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

THINK_OPEN, THINK_CLOSE, ACTION_OPEN, ACTION_CLOSE = "<think>", "</think>", "<action>", "</action>"


@dataclass
class GenRequest:
    """One sequence to decode.

    Attributes:
        prompt_ids: the prompt's token ids (non-empty).
        seed: seeds this request's sampling generator (ignored when greedy).
        grammar: an `ActionGrammar` restricting the output, or None. A grammar
            holds decoding state: use a fresh one per request and call.
    """

    prompt_ids: list[int]
    seed: int = 0
    grammar: "ActionGrammar | None" = None


@dataclass
class GenResult:
    """A decoded sequence: new token ids (a final stop token included), their
    behaviour log-probs (natural log, same length), and ``stop``/``length``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


class _Node:
    __slots__ = ("children", "terminal", "meta_verb")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.terminal = False          # a complete admissible command ends here
        self.meta_verb: str | None = None  # a meta verb ends here: free text may follow


class Vocab:
    """Per-tokenizer token classes the grammar needs (built once per engine).

    Attributes:
        size: model vocabulary rows (>= len(tokenizer)).
        free: [size] bool, ordinary tokens (not special, not added, not padding,
            no ``<``: free text cannot spell ``<action>`` and fool the parser).
        space: [size] bool, free tokens whose text starts with a space.
        text: [size] bool, free tokens holding a non-whitespace character.
        markers: marker string -> its token ids (one id for the project tokenizer).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, size: int, device: torch.device):
        n = len(tokenizer)
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        free = torch.zeros(size, dtype=torch.bool)
        space = torch.zeros(size, dtype=torch.bool)
        text = torch.zeros(size, dtype=torch.bool)
        for i in range(n):
            if i in special or pieces[i] is None:
                continue
            s = tokenizer.convert_tokens_to_string([pieces[i]])
            free[i] = bool(s) and "<" not in s  # free text can never spell a marker like "<action>"
            space[i] = s.startswith(" ")
            text[i] = bool(s.strip())
        self.size, self.free, self.space, self.text = size, free.to(device), (space & free).to(device), (text & free).to(device)
        self.markers = {m: tokenizer.encode(m, add_special_tokens=False)
                        for m in (THINK_OPEN, THINK_CLOSE, ACTION_OPEN, ACTION_CLOSE)}
        self.tokenizer = tokenizer


class ActionGrammar:
    """Constrained decoding of ``<think>…</think><action>A</action>``.

    How it works: the admissible commands and the allowed meta verbs are
    tokenised (canonical tokenisation, as SFT targets are) into a token-prefix
    trie. Decoding walks a small state machine, and at every step the engine
    masks the logits to the tokens `allowed` returns:

    - ``<think>`` is forced first; then any ordinary token or the first token of
      ``</think>`` (only ``</think>`` once the remaining budget is just enough
      for the longest action); ``</think><action>`` is then forced;
    - inside the action only the trie children of the current node are allowed,
      so the text stays a prefix of some candidate; at a node ending a full
      command ``</action>`` is allowed too;
    - at a node ending a meta verb (``track|commit|recall|note``) a token
      starting with a space switches to free text (any ordinary token);
      ``</action>`` is allowed after free text with a non-space character, or
      directly after ``track`` (``track`` alone means ``track world``);
    - after ``</action>`` the request is done.

    Markers that the tokenizer splits into several tokens (a real Qwen
    tokenizer's ``<action>``) are handled by forcing the rest of the marker
    once its first token is chosen. Log-probs are those of the masked
    distribution (see module docstring). If ``max_new_tokens`` is below the
    shortest complete output, the request ends with ``length``.

    Replay (for a trainer): ``constraint`` is the JSON-able description of
    this grammar; `from_constraint` rebuilds it and `replay` returns the mask
    it applied before each token of a completion.
    """

    def __init__(self, vocab: Vocab, commands: list[str], meta_verbs: tuple[str, ...] = (),
                 empty_arg_verbs: tuple[str, ...] = ("track",)):
        self.v, self.root = vocab, _Node()
        self.commands, self.meta_verbs = list(commands), tuple(meta_verbs)
        tok = vocab.tokenizer
        seqs = tok(list(commands) + list(meta_verbs), add_special_tokens=False)["input_ids"] if commands or meta_verbs else []
        for k, ids in enumerate(seqs):
            node = self.root
            for t in ids:
                node = node.children.setdefault(t, _Node())
            if k < len(commands):
                node.terminal = True
            else:
                node.meta_verb = meta_verbs[k - len(commands)]
        self.empty_arg_verbs = empty_arg_verbs
        m = vocab.markers
        n_meta = max((len(s) for s in seqs[len(commands):]), default=0) + 2 if meta_verbs else 0
        n_cmd = max((len(s) for s in seqs[:len(commands)]), default=0)
        self.reserve = len(m[THINK_CLOSE]) + len(m[ACTION_OPEN]) + max(n_cmd, n_meta) + len(m[ACTION_CLOSE])
        self.forced: deque[int] = deque(m[THINK_OPEN])
        self.phase = "think"            # think -> action -> done
        self.node: _Node | None = self.root  # None: free text after a meta verb
        self.has_text = False

    def constraint(self, max_new_tokens: int) -> dict:
        """This grammar as a JSON-able record: ``{"commands", "meta_verbs", "max_new_tokens"}``
        (the budget matters: `allowed` closes the think block when it runs short)."""
        return {"commands": list(self.commands), "meta_verbs": list(self.meta_verbs),
                "max_new_tokens": int(max_new_tokens)}

    @classmethod
    def from_constraint(cls, vocab: Vocab, constraint: dict) -> "ActionGrammar":
        """A fresh grammar from a `constraint` record (same vocabulary classes as the sampler's)."""
        return cls(vocab, list(constraint["commands"]), tuple(constraint.get("meta_verbs", ())))

    def replay(self, token_ids: list[int], max_new_tokens: int) -> torch.Tensor:
        """Walk a fresh grammar over a completion; returns [len(token_ids), vocab.size] bool,
        row k = the mask applied when token k was sampled (`allowed` at ``remaining =
        max_new_tokens - k``). Advances this grammar.

        Raises:
            ValueError: a token the grammar did not allow at its position (the
                completion was not sampled under this constraint).
        """
        rows = []
        for k, t in enumerate(token_ids):
            if self.done:
                raise ValueError(f"token {k} ({t}) follows a complete action")
            mask = self.allowed(max_new_tokens - k)
            if not bool(mask[t]):
                raise ValueError(f"token {k} ({t}) is not allowed by the constraint at that position")
            rows.append(mask)
            self.advance(t)
        return torch.stack(rows) if rows else torch.zeros((0, self.v.size), dtype=torch.bool, device=self.v.free.device)

    @property
    def done(self) -> bool:
        return self.phase == "done" and not self.forced

    def allowed(self, remaining: int) -> torch.Tensor:
        """[vocab] bool mask of the tokens allowed now; `remaining` counts this step."""
        v, m = self.v, self.v.markers
        mask = torch.zeros(v.size, dtype=torch.bool, device=v.free.device)
        if self.forced:
            mask[self.forced[0]] = True
        elif self.phase == "think":
            if remaining > self.reserve:
                mask |= v.free
            mask[m[THINK_CLOSE][0]] = True
        elif self.node is None:  # free text after a meta verb
            close = len(m[ACTION_CLOSE])
            if not self.has_text:
                mask |= v.text if remaining <= close + 1 else v.free
            else:
                if remaining > close:
                    mask |= v.free
                mask[m[ACTION_CLOSE][0]] = True
        else:
            node = self.node
            if node.children:
                mask[list(node.children)] = True
            if node.meta_verb is not None:
                mask |= v.space
            if node.terminal or node.meta_verb in self.empty_arg_verbs:
                mask[m[ACTION_CLOSE][0]] = True
        return mask

    def advance(self, token: int) -> None:
        """Move the state machine past the chosen `token` (one of `allowed`)."""
        m = self.v.markers
        if self.forced:
            self.forced.popleft()
            return
        if self.phase == "think":
            if token == m[THINK_CLOSE][0]:
                self.forced.extend(m[THINK_CLOSE][1:] + m[ACTION_OPEN])
                self.phase = "action"
            return
        if token == m[ACTION_CLOSE][0]:
            self.forced.extend(m[ACTION_CLOSE][1:])
            self.phase = "done"
        elif self.node is not None and token in self.node.children:
            self.node = self.node.children[token]
        else:  # free text (entered from a meta-verb node with a space token)
            self.node = None
            self.has_text = self.has_text or bool(self.v.text[token])


class Engine:
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
            ids = {tokenizer.eos_token_id}
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
            for s in ("<|im_end|>", ACTION_CLOSE):
                enc = tokenizer.encode(s, add_special_tokens=False)
                if len(enc) == 1:
                    ids.add(enc[0])
            stop_ids = sorted(i for i in ids if i is not None)
        self.stop_ids = set(stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        self.invalid = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        self.invalid[len(tokenizer):] = True
        self._vocab: Vocab | None = None
        self.min_shared_prefix = 32  # shorter common prefixes are not worth a separate prefill

    @property
    def vocab(self) -> Vocab:
        """Token classes for `ActionGrammar` (built on first use: ~1 s for a 150k vocabulary)."""
        if self._vocab is None:
            self._vocab = Vocab(self.tokenizer, self.vocab_size, self.device)
        return self._vocab

    def grammar(self, commands: list[str], meta_verbs: tuple[str, ...] = ()) -> ActionGrammar | None:
        """An `ActionGrammar` for one request; None (unconstrained) when there is nothing to allow."""
        if not commands and not meta_verbs:
            return None
        return ActionGrammar(self.vocab, commands, meta_verbs)

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0) -> list[GenResult]:
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
            logits = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        return results

    def _prefill(self, prompts: list[list[int]], cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
            self.model(input_ids=torch.tensor([prompts[0][:shared]], device=dev), past_key_values=cache,
                       use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(B)
        rest = [p[shared:] for p in prompts]
        L = max(map(len, rest))
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, shared + L), dtype=torch.long)
        attn[:, :shared] = 1
        for i, r in enumerate(rest):
            ids[i, L - len(r):] = torch.tensor(r)
            attn[i, shared + L - len(r):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1]
        return logits, attn, pos[:, -1] + 1

    def _choose(self, logits: torch.Tensor, temperature: float, top_p: float,
                gens: list[torch.Generator] | None, allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
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
                masked = masked.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
            u = torch.stack([torch.rand(masked.shape[-1], generator=g, device=masked.device) for g in gens])
            gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
            tok = (masked + gumbel).argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
