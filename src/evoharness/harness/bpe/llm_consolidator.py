"""LLM consolidator: an OpenAI-compatible chat model decides what the
batch's notes do to the experience store (EvoHarness-RL §3.3, "LLM or rule
consolidator"); the rule consolidator stays the default.

Counters are bookkeeping, not language: retrieval counts, pickups, misses
and location notes go through `RuleConsolidator`. The free-text notes
(general / task / mistakes) are sent with the current entries of their
category, and the reply must be a JSON list of operations::

    [{"op": "ADD", "category": "mistakes", "text": "...", "reason": "..."},
     {"op": "UPDATE", "entry_id": 12, "text": "merged wording", "reason": "..."},
     {"op": "REMOVE", "entry_id": 7, "reason": "contradicted"},
     {"op": "SKIP", "reason": "duplicate"}]

Operations naming an unknown id or category are turned into SKIPs (with the
reason). An endpoint error or a reply that is not such a list falls back to
the rules for those notes, and every resulting op says so in its reason:
consolidation never fails an RL step.
"""

from __future__ import annotations

import json
import os
import re

from evoharness.harness.bpe.experience import CATEGORIES, TITLES, ExperienceStore, Op, Pending, RuleConsolidator

_TEXT_CATEGORIES = tuple(c for c in CATEGORIES if c != "locations")
SYSTEM = (
    "You maintain an agent's experience memory for household tasks. Given the current entries and new "
    "notes, reply with a JSON list of operations only (no prose). Each operation: op (ADD, UPDATE, "
    "REMOVE or SKIP), category (one of " + ", ".join(_TEXT_CATEGORIES) + "), entry_id (for UPDATE/REMOVE), "
    "text (for ADD; optional new wording for UPDATE), reason. ADD a note only if it is new and useful; "
    "UPDATE an entry a note repeats (its use count grows); REMOVE an entry a note shows is wrong; SKIP otherwise."
)


def render_prompt(store: ExperienceStore, notes: list[Pending]) -> str:
    """The user message: each involved category's entries (``[id] text``), then the notes."""
    lines = []
    for cat in dict.fromkeys(p.category for p in notes):
        lines.append(f"{TITLES[cat]} ({cat}):")
        lines += [f"[{e.id}] {e.text}" for e in store.entries(cat)] or ["(none)"]
        lines.append("")
    lines.append("New notes:")
    lines += [f"- ({p.category}) {p.text}" for p in notes]
    return "\n".join(lines)


def parse_ops(reply: str, store: ExperienceStore) -> list[Op]:
    """A JSON list of operations from `reply` (a fenced or bare array).

    Raises:
        ValueError: no JSON array, or an element that is not an object with a known ``op``.
    """
    m = re.search(r"\[.*\]", reply, re.S)
    if not m:
        raise ValueError("reply holds no JSON list")
    items = json.loads(m.group(0))
    ops = []
    for it in items:
        if not isinstance(it, dict) or it.get("op") not in ("ADD", "UPDATE", "REMOVE", "SKIP"):
            raise ValueError(f"not an operation: {it!r}"[:200])
        reason = f"llm: {it.get('reason', '')}".strip()
        kind, text = it["op"], str(it.get("text") or "").strip()
        if kind == "ADD":
            cat = it.get("category")
            if cat not in _TEXT_CATEGORIES or not text:
                ops.append(Op("SKIP", str(cat or ""), reason=f"{reason} (ADD needs a text category and text)"))
            else:
                ops.append(Op("ADD", cat, text=text, reason=reason))
        elif kind in ("UPDATE", "REMOVE"):
            e = store.get(it["entry_id"]) if isinstance(it.get("entry_id"), int) else None
            if e is None or e.category == "locations":
                ops.append(
                    Op("SKIP", str(it.get("category") or ""), reason=f"{reason} (unknown entry {it.get('entry_id')!r})")
                )
            elif kind == "UPDATE":
                ops.append(Op("UPDATE", e.category, e.id, text=text, uses=1, reason=reason))
            else:
                ops.append(Op("REMOVE", e.category, e.id, reason=reason))
        else:
            ops.append(Op("SKIP", str(it.get("category") or ""), reason=reason))
    return ops


class LLMConsolidator:
    """`Consolidator` backed by an OpenAI-compatible endpoint (official client).

    Args:
        base_url: e.g. ``http://localhost:8000/v1``.
        model: model name at the endpoint.
        api_key_env: environment variable holding the key ("EMPTY" when unset).
        timeout_s / max_retries: per request.
        rules: the consolidator for counters and the fallback (default rules).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        rules: RuleConsolidator | None = None,
    ) -> None:
        import openai

        self.model = model
        self.rules = rules or RuleConsolidator()
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=os.environ.get(api_key_env) or "EMPTY",
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self.last_error = ""

    def __call__(self, store: ExperienceStore, pending: list[Pending]) -> list[Op]:
        notes = [p for p in pending if p.kind == "note" and p.category in _TEXT_CATEGORIES]
        ops = self.rules(store, [p for p in pending if not (p.kind == "note" and p.category in _TEXT_CATEGORIES)])
        if not notes:
            return ops
        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                temperature=0.0,
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": render_prompt(store, notes)},
                ],
            )
            self.last_error = ""
            return ops + parse_ops(resp.choices[0].message.content or "", store)
        except Exception as e:  # endpoint down, HTTP error, garbage reply: the rules decide, and say why
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            fallback = self.rules(store, notes)
            for op in fallback:
                op.reason = f"{op.reason} (rules: llm failed, {type(e).__name__})"
            return ops + fallback
