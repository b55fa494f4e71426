"""One prompt recipe: chat-template token ids that fit a budget without losing the task.

Every path that turns harness messages into model tokens -- SFT examples
(``train/sft.py``), the local policy in RL and evaluation
(``policies/local.py``) -- calls `fit_prompt_ids`, so the same state gives the
same prompt tokens in training and at test time (issue 10, fault 4).

A prompt over the budget is shortened in this order:

1. PREVIOUS ACTIONS loses its oldest entry, one at a time (`drop_oldest_history`):
   the result is exactly what the harness renders with a window one shorter;
2. last resort, still too long with no history left: tokens are cut from just
   after the protected head (the earlier messages, i.e. the system prompt, and
   the last message's OBJECTIVE line) so the end of the prompt (latest
   observation, commands, views, the generation prompt) is kept;
3. the protected head and the template's tail alone do not fit: `PromptTooLong`.

The system prompt and the OBJECTIVE are never cut. What was done is returned
as a `PromptFit`, for metrics and reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

HISTORY_HEADER = "PREVIOUS ACTIONS:"
NO_HISTORY = "(none)"
_SECTION_RE = re.compile(rf"(^|\n){re.escape(HISTORY_HEADER)}\n(.*?)(?=\n\n|$)", re.S)
_OBJECTIVE_RE = re.compile(r"^OBJECTIVE:[^\n]*", re.M)


def history_entry(action: str, feedback: str) -> str:
    """One PREVIOUS ACTIONS entry, ``> action\\nfeedback``.

    Blank lines are squeezed and a feedback line starting with ``>`` gets a
    leading space, so an entry never looks like the start of the next one and
    the section never contains the blank line that ends it (`drop_oldest_history`
    relies on both).
    """
    body = re.sub(r"\n\s*\n+", "\n", feedback.strip())
    body = re.sub(r"(?m)^>", " >", body)
    return f"> {' '.join(action.split())}\n{body}"


def render_history(entries: list[str]) -> str:
    """The PREVIOUS ACTIONS section body: entries oldest first, or ``(none)``."""
    return "\n".join(entries) if entries else NO_HISTORY


def drop_oldest_history(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The messages with the oldest PREVIOUS ACTIONS entry removed.

    Returns:
        New messages (the input is not changed), or None when the last message
        has no history entry left to drop.
    """
    if not messages:
        return None
    content = messages[-1].get("content") or ""
    m = _SECTION_RE.search(content)
    if m is None or m.group(2).strip() == NO_HISTORY:
        return None
    entries = re.split(r"\n(?=> )", m.group(2))
    body = render_history(entries[1:])
    new = content[: m.start(2)] + body + content[m.end(2) :]
    return [*messages[:-1], {**messages[-1], "content": new}]


class PromptTooLong(ValueError):
    """The protected part of a prompt (system prompt, OBJECTIVE, template tail) exceeds the budget."""


@dataclass
class PromptFit:
    """How a prompt was fitted: history entries dropped and tokens cut (step 2)."""

    history_dropped: int = 0
    tokens_cut: int = 0

    @property
    def fitted(self) -> bool:
        return bool(self.history_dropped or self.tokens_cut)

    def as_dict(self) -> dict[str, int]:
        return {"history_dropped": self.history_dropped, "tokens_cut": self.tokens_cut}


def chat_text(tokenizer, messages: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat-templated prompt with the generation prompt (what a server renders);
    `template_kwargs` go to the template (e.g. Qwen3's ``enable_thinking``)."""
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
    )


def chat_ids(tokenizer, messages: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `chat_text` (no extra special tokens: the template has them)."""
    return tokenizer(chat_text(tokenizer, messages, template_kwargs), add_special_tokens=False)["input_ids"]


def fit_prompt_ids(
    tokenizer, messages: list[dict[str, str]], max_tokens: int, template_kwargs: dict[str, Any] | None = None
) -> tuple[list[int], PromptFit]:
    """Prompt token ids of `messages` within `max_tokens` (module docstring for the order).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (fast: offsets needed).
        messages: chat messages as a harness renders them.
        max_tokens: the budget; <= 0 means no limit.
        template_kwargs: chat-template arguments (`chat_text`).

    Returns:
        ``(ids, PromptFit)``; ``len(ids) <= max_tokens``.

    Raises:
        PromptTooLong: the system prompt, the OBJECTIVE line and the template's
            tail need more than `max_tokens`.
    """
    fit = PromptFit()
    ids = chat_ids(tokenizer, messages, template_kwargs)
    if max_tokens <= 0:
        return ids, fit
    while len(ids) > max_tokens and (shorter := drop_oldest_history(messages)) is not None:
        messages, fit.history_dropped = shorter, fit.history_dropped + 1
        ids = chat_ids(tokenizer, messages, template_kwargs)
    if len(ids) <= max_tokens:
        return ids, fit
    text = chat_text(tokenizer, messages, template_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    head_end, tail_start = _protected_spans(text, messages)
    head = sum(1 for s, _ in offsets if s < head_end)  # tokens that start inside the head
    tail = sum(1 for _, e in offsets if e > tail_start)  # tokens that end inside the tail
    if head + tail + 1 > max_tokens:
        raise PromptTooLong(
            f"the prompt's system prompt and OBJECTIVE ({head} tokens) and template tail ({tail}) "
            f"do not fit max_prompt_tokens={max_tokens}"
        )
    fit.tokens_cut = len(ids) - max_tokens
    return ids[:head] + ids[head + fit.tokens_cut :], fit


def _protected_spans(text: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    """(end of the protected head, start of the template tail) as character offsets in `text`.

    The head is every earlier message (the system prompt) and the last
    message up to the end of its OBJECTIVE line (up to its start when it has
    none); the tail is what the template adds after the last message's content.
    """
    last = messages[-1].get("content") or ""
    last_at = text.rfind(last) if last else len(text)
    m = _OBJECTIVE_RE.search(last)
    return last_at + (m.end() if m is not None else 0), last_at + len(last)
