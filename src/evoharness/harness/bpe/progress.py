"""Progress P_t: the agent's own plan, changed only by the ``commit`` meta-action.

EvoHarness-RL (arXiv 2608.05446): a bounded list (max 8) of (subgoal, status)
records, rendered every turn as the PLAN view. Nothing but `commit` changes it.

``commit`` argument grammar (case-insensitive; ``[``/``]`` are ignored):

    commit <subgoal>                  add <subgoal> as pending (no-op if present)
    commit <subgoal>: <status>        set its status (adds it if absent)
    commit <n>: <status>              set the status of plan item n (1-based)
    commit plan: <s1>; <s2>; ...      replace the whole plan with pending items
    commit <update>; <update>; ...    several updates in one step

``:``, ``=`` and ``->`` all separate a subgoal from its status; a status
word right after a subgoal already in the plan works too (``commit find
apple done``). Statuses:
``pending`` (todo, next), ``active`` (doing, current, in progress),
``done`` (complete, completed, finished), ``failed`` (blocked),
``drop`` (remove, delete: removes the item).

Capacity 8: adding to a full plan first removes the oldest ``done`` item; if
none is done, the update is refused with feedback. Bad arguments never raise:
`Progress.commit` returns feedback text starting with ``Error:``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLAN_CAPACITY = 8
MAX_SUBGOAL_CHARS = 80
STATUSES = ("pending", "active", "done", "failed")
_STATUS_WORDS = {
    **{w: "pending" for w in ("pending", "todo", "to do", "next", "planned")},
    **{w: "active" for w in ("active", "doing", "current", "in progress", "in-progress", "started", "now")},
    **{w: "done" for w in ("done", "complete", "completed", "finished", "ok", "achieved", "success")},
    **{w: "failed" for w in ("failed", "fail", "blocked", "impossible")},
    **{w: "drop" for w in ("drop", "dropped", "remove", "removed", "delete", "deleted", "cancel", "cancelled")},
}
_SEP_RE = re.compile(r"\s*(?::|=|->)\s*")
_MARK = {"pending": " ", "active": ">", "done": "x", "failed": "!"}


@dataclass
class Subgoal:
    text: str
    status: str = "pending"


def _clean(text: str) -> str:
    text = re.sub(r"[\[\]]", "", text)
    return re.sub(r"\s+", " ", text).strip().strip(".,;").strip().lower()


class Progress:
    """Bounded plan of (subgoal, status) records (capacity 8)."""

    def __init__(self, capacity: int = PLAN_CAPACITY) -> None:
        self.capacity = capacity
        self.items: list[Subgoal] = []

    def status_of(self, subgoal: str) -> str | None:
        i = self._find(_clean(subgoal))
        return None if i is None else self.items[i].status

    @property
    def active(self) -> list[str]:
        return [s.text for s in self.items if s.status == "active"]

    def _find(self, text: str) -> int | None:
        return next((i for i, s in enumerate(self.items) if s.text == text), None)

    def commit(self, argument: str) -> str:
        """Apply a ``commit`` argument (grammar in the module docstring).

        Returns feedback text; ``Error: …`` when (part of) the argument was
        rejected. Valid updates before an invalid one in a ``;`` list are kept.
        """
        arg = _clean(argument)
        if not arg:
            return "Error: commit needs a subgoal, e.g. commit find apple: done."
        head, _, rest = arg.partition(":")
        if head.strip() == "plan" and rest.strip():
            return self._replace([_clean(s) for s in rest.split(";") if _clean(s)])
        done: list[str] = []
        for part in (p for p in (_clean(x) for x in arg.split(";")) if p):
            msg = self._one(part)
            if msg.startswith("Error"):
                return " ".join(done + [msg]) if done else msg
            done.append(msg)
        return " ".join(done)

    def _replace(self, subgoals: list[str]) -> str:
        if len(subgoals) > self.capacity:
            return f"Error: a plan holds at most {self.capacity} subgoals ({len(subgoals)} given)."
        if bad := [s for s in subgoals if len(s) > MAX_SUBGOAL_CHARS]:
            return f"Error: subgoal too long (max {MAX_SUBGOAL_CHARS} chars): {bad[0][:40]}…"
        self.items = [Subgoal(s) for s in dict.fromkeys(subgoals)]
        return f"Plan set ({len(self.items)} subgoals)."

    def _one(self, part: str) -> str:
        pieces = _SEP_RE.split(part, maxsplit=1)
        text, status_word = (pieces[0], pieces[1]) if len(pieces) == 2 else (part, "")
        text = _clean(text)
        if not status_word:  # "find apple done": a trailing status word on a known subgoal
            words = text.rsplit(" ", 1)
            if len(words) == 2 and words[1] in _STATUS_WORDS and self._find(words[0]) is not None:
                text, status_word = words
        status = _STATUS_WORDS.get(status_word.strip()) if status_word else "pending"
        if status is None:
            return f"Error: unknown status '{status_word}' (use pending, active, done, failed or drop)."
        if not text:
            return "Error: empty subgoal."
        if len(text) > MAX_SUBGOAL_CHARS:
            return f"Error: subgoal too long (max {MAX_SUBGOAL_CHARS} chars)."
        idx = self._find(text)
        if idx is None and text.isdigit():
            n = int(text)
            if not 1 <= n <= len(self.items):
                return f"Error: no plan item {n} (plan has {len(self.items)})."
            idx = n - 1
        if status == "drop":
            if idx is None:
                return f"Error: '{text}' is not in the plan."
            removed = self.items.pop(idx)
            return f"Dropped '{removed.text}'."
        if idx is not None:
            item = self.items[idx]
            if not status_word:
                return f"'{item.text}' is already in the plan ({item.status})."
            item.status = status
            return f"'{item.text}' -> {status}."
        if len(self.items) >= self.capacity:
            old_done = next((i for i, s in enumerate(self.items) if s.status == "done"), None)
            if old_done is None:
                return f"Error: the plan is full ({self.capacity}); mark a subgoal done or drop one."
            self.items.pop(old_done)
        self.items.append(Subgoal(text, status))
        return f"Added '{text}' ({status})."

    def render(self) -> str:
        """The PLAN view: one ``n. [mark] subgoal (status)`` line per item."""
        if not self.items:
            return "(empty; add subgoals with commit <subgoal>)"
        return "\n".join(f"{i}. [{_MARK[s.status]}] {s.text} ({s.status})" for i, s in enumerate(self.items, 1))

    def to_list(self) -> list[tuple[str, str]]:
        return [(s.text, s.status) for s in self.items]
