"""A byte-level BPE tokenizer trained locally on environment text.

No model hub is reachable, so the tiny models get their own tokenizer: the
`tokenizers` library trains a byte-level BPE (Qwen2/3-style pre-tokenizer:
words and numbers keep their leading space) and `transformers` wraps it as
a `PreTrainedTokenizerFast` with a Qwen-style chat template::

    <|im_start|>system\\n{content}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n            <- add_generation_prompt=True

Added tokens (each a single id, never split or merged): the special tokens
``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos), and the harness
markers ``<think>``, ``</think>``, ``<action>``, ``</action>`` as added but
*non-special* tokens, as Qwen3's tokenizer keeps ``<think>``: OpenAI-compatible
servers (vLLM, SGLang) detokenise with ``skip_special_tokens=True``, which
would otherwise erase the markers from every served completion (issue 10).

Vocabulary size: ALFWorld text supports only ~750 merges, so the trainer stops
early; the tokenizer then has ~1,000 ids whatever `vocab_size` asks for. The
model's embedding is padded up to a multiple of 64 (`models.init`); the engine
never samples the padding ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MARKERS = ("<think>", "</think>", "<action>", "</action>")  # added, not special
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
ADDED_TOKENS = [*SPECIAL_TOKENS, *MARKERS]  # ids 0..6, in this order

# Qwen2/Qwen3 pre-tokenizer pattern (contractions, words with one leading
# non-letter, punctuation runs, newlines, spaces), except that numbers keep
# their leading space and up to 3 digits (" 12"): ALFWorld names every
# receptacle "cabinet 12", and one id per " 12" saves a token per mention.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it for `transformers`.

    Args:
        corpus: strings of environment text (observations, commands, prompts).
            Any iterable; it is read once.
        vocab_size: upper bound on ids, specials and the 256 byte symbols
            included. Must be >= 256 + len(SPECIAL_TOKENS). The result is smaller
            when the corpus has fewer pairs seen `min_frequency` times.
        min_frequency: a pair must occur this often to be merged.

    Returns:
        A fast tokenizer with ``eos_token=<|im_end|>``, ``pad_token=<|endoftext|>``,
        the harness `MARKERS` as added non-special tokens, and `CHAT_TEMPLATE`.
        Any byte string round-trips (byte-level).

    Raises:
        ValueError: `vocab_size` too small.
    """
    floor = 256 + len(ADDED_TOKENS)
    if vocab_size < floor:
        raise ValueError(
            f"vocab_size must be >= {floor} (256 bytes + {len(ADDED_TOKENS)} added tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=ADDED_TOKENS,  # reserves ids 0..6; the markers are made non-special below
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_segments(corpus), trainer)
    return wrap(_markers_not_special(tok))


def _markers_not_special(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer with `MARKERS` flagged ``special: false`` (ids unchanged)."""
    data = json.loads(tok.to_str())
    for added in data["added_tokens"]:
        if added["content"] in MARKERS:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(data))


_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in ADDED_TOKENS))


def _segments(corpus: Iterable[str]) -> Iterator[str]:
    """The text between added tokens, as encoding will see it (an added token
    is split out before pre-tokenisation), so no merge is spent on "<think"."""
    for text in corpus:
        yield from (seg for seg in _SPECIAL_RE.split(text) if seg)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` holding `ADDED_TOKENS` for `transformers`."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tokenizer(
    corpus: Iterable[str], out_dir: str | Path, vocab_size: int = 2048, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train (see `train_tokenizer`) and `save_pretrained` into `out_dir`."""
    tok = train_tokenizer(corpus, vocab_size=vocab_size, min_frequency=min_frequency)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok


def estimate_tokens(text: str) -> int:
    """Rough token count for text-only policies (~4 characters per token)."""
    return max(1, (len(text) + 3) // 4) if text else 0
