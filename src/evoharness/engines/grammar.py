"""What every engine shares: requests, results, the behaviour log-prob contract
and the action grammar.

Behaviour log-probs (the engine <-> trainer contract): every produced token
comes with ``log_softmax`` of the distribution it was actually sampled from:
``logits / temperature`` (``temperature == 0`` counts as 1) with the ids
``>= len(tokenizer)`` and, under constrained decoding, every id the grammar
disallows set to ``-inf``. top-p is not part of it (keep ``top_p=1`` for RL).
A forced token (the only allowed id) therefore has log-prob exactly 0. A
trainer rebuilds the same masks with `ActionGrammar.replay` from the request's
constraint (`ActionGrammar.constraint`) and recomputes the same numbers from
the same logits.

Constrained decoding (`ActionGrammar`) restricts a completion to
``<think>free text</think><action>A</action>`` where A is an admissible command
or ``verb free-text`` for an allowed meta verb (see the class docstring).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

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
    grammar: ActionGrammar | None = None


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
        self.terminal = False  # a complete admissible command ends here
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
        self.size, self.free, self.space, self.text = (
            size,
            free.to(device),
            (space & free).to(device),
            (text & free).to(device),
        )
        self.markers = {
            m: tokenizer.encode(m, add_special_tokens=False)
            for m in (THINK_OPEN, THINK_CLOSE, ACTION_OPEN, ACTION_CLOSE)
        }
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

    def __init__(
        self,
        vocab: Vocab,
        commands: list[str],
        meta_verbs: tuple[str, ...] = (),
        empty_arg_verbs: tuple[str, ...] = ("track",),
    ):
        self.v, self.root = vocab, _Node()
        self.commands, self.meta_verbs = list(commands), tuple(meta_verbs)
        tok = vocab.tokenizer
        seqs = (
            tok(list(commands) + list(meta_verbs), add_special_tokens=False)["input_ids"]
            if commands or meta_verbs
            else []
        )
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
        n_meta = max((len(s) for s in seqs[len(commands) :]), default=0) + 2 if meta_verbs else 0
        n_cmd = max((len(s) for s in seqs[: len(commands)]), default=0)
        self.reserve = len(m[THINK_CLOSE]) + len(m[ACTION_OPEN]) + max(n_cmd, n_meta) + len(m[ACTION_CLOSE])
        self.forced: deque[int] = deque(m[THINK_OPEN])
        self.phase = "think"  # think -> action -> done
        self.node: _Node | None = self.root  # None: free text after a meta verb
        self.has_text = False

    def constraint(self, max_new_tokens: int) -> dict:
        """This grammar as a JSON-able record: ``{"commands", "meta_verbs", "max_new_tokens"}``
        (the budget matters: `allowed` closes the think block when it runs short)."""
        return {
            "commands": list(self.commands),
            "meta_verbs": list(self.meta_verbs),
            "max_new_tokens": int(max_new_tokens),
        }

    @classmethod
    def from_constraint(cls, vocab: Vocab, constraint: dict) -> ActionGrammar:
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


def default_stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's and generation config's eos ids, ``<|im_end|>``, and ``</action>``
    when it is a single token."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    for s in ("<|im_end|>", ACTION_CLOSE):
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1:
            ids.add(enc[0])
    return sorted(i for i in ids if i is not None)


class GrammarMixin:
    """What an engine needs for constrained decoding: `vocab` (token classes, built on
    first use: ~1 s for a 150k vocabulary) and a fresh `grammar` per request. The
    engine sets ``tokenizer``, ``vocab_size``, ``device`` and ``_vocab = None``."""

    tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    device: torch.device
    _vocab: Vocab | None

    @property
    def vocab(self) -> Vocab:
        if self._vocab is None:
            self._vocab = Vocab(self.tokenizer, self.vocab_size, self.device)
        return self._vocab

    def grammar(self, commands: list[str], meta_verbs: tuple[str, ...] = ()) -> ActionGrammar | None:
        """An `ActionGrammar` for one request; None (unconstrained) when there is nothing to allow."""
        if not commands and not meta_verbs:
            return None
        return ActionGrammar(self.vocab, commands, meta_verbs)


# ---- on the wire: the gateway's ``action_grammar`` request field, and its regex for vLLM/SGLang


class ActionGrammarSpec(BaseModel):
    """The ``action_grammar`` extension: the constraint a turn was sampled under
    (the shared ``constraint`` record minus ``max_new_tokens``, which is ``max_tokens``)."""

    model_config = ConfigDict(extra="ignore")
    commands: list[str] = Field(default_factory=list)
    meta_verbs: list[str] = Field(default_factory=list)


def action_regex(commands: list[str], meta_verbs: list[str] | tuple[str, ...]) -> str:
    """A regex (vLLM ``structured_outputs.regex``) accepting the strings `engines.grammar.ActionGrammar` accepts:
    ``<think>`` free text without ``<`` ``</think><action>`` then an admissible command, a meta verb
    followed by free text holding a non-space character, or bare ``track``, then ``</action>``."""
    alts = [re.escape(c) for c in commands]
    if meta_verbs:
        verbs = "|".join(re.escape(v) for v in meta_verbs)
        alts.append(rf"(?:{verbs}) [^<]*[^<\s][^<]*")
        if "track" in meta_verbs:
            alts.append("track")
    body = "|".join(alts) if alts else r"[^<]*"
    return rf"<think>[^<]*</think><action>(?:{body})</action>"
