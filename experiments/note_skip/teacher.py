"""The scripted teacher leaving out a fraction of its notes (issue 50's note-skip lever, kept here after its
confirmatory study failed its rule: experiments/note_skip/JOURNAL.md).

Where `policies.teacher.decide` answers ``note X is sometimes found in/on T`` (rule 3), `skips_note` draws a
uniform number from a SHA-256 of the prompt's OBJECTIVE and PREVIOUS ACTIONS sections and the note; below
`rate` the note is left out and the teacher's next move comes at once (its decision with the note added to
PREVIOUS ACTIONS), so the choice stays a function of the prompt (design.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from evoharness.models.tokenizer import estimate_tokens
from evoharness.policies.base import Completion, PolicyRequest, format_action
from evoharness.policies.teacher import TeacherPolicy, decide, parse_prompt

_HASHED = ("OBJECTIVE:", "PREVIOUS ACTIONS:")


def skips_note(user_text: str, note: str, rate: float) -> bool:
    """Whether the teacher leaves out `note` at this prompt: a uniform draw in [0, 1) from a SHA-256 of the
    prompt's OBJECTIVE and PREVIOUS ACTIONS sections and the note, below `rate`."""
    if rate <= 0.0:
        return False
    parts = [p for p in user_text.split("\n\n") if p.startswith(_HASHED)]
    digest = hashlib.sha256("\n\n".join([*parts, note]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def decide_text(user_text: str, rate: float) -> tuple[str, str]:
    """`policies.teacher.decide` on a rendered BPE user message, a note `skips_note` leaves out replaced by
    the move the teacher makes once the note is done. Returns ``(action, reason)``."""
    v = parse_prompt(user_text)
    action, reason = decide(v)
    if not action.startswith("note ") or not skips_note(user_text, action, rate):
        return action, reason
    action, reason = decide(replace(v, history=[*v.history, (action, "")]))
    if action.startswith("commit "):  # the find's subgoal switch: its reason would mention the note
        last = v.history[-1][0] if v.history else ""
        held = last[5:].split(" from ")[0] if last.startswith("take ") else v.goal.obj
        reason = f"I hold the {held}; this subgoal is done, so I update the plan."
    return action, reason


class NoteSkipTeacher(TeacherPolicy):
    """`TeacherPolicy` leaving out about `rate` of its notes (`decide_text`).

    Raises:
        ValueError: `rate` outside [0, 1].
    """

    def __init__(self, seed: int = 0, rate: float = 0.5) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"NoteSkipTeacher: rate must be in [0, 1] (got {rate})")
        super().__init__(seed)
        self.rate = rate

    def _one(self, req: PolicyRequest) -> Completion:
        comp = super()._one(req)
        if comp.error or "<action>note " not in comp.text:
            return comp
        user = next(m["content"] for m in reversed(req.messages) if m.get("role") == "user")
        text = format_action(*decide_text(user, self.rate))
        return replace(comp, text=text, completion_tokens=estimate_tokens(text))
