"""The scripted BPE teacher: a non-privileged ALFWorld player for stage-1 SFT traces.

It reads **only the rendered user message** of the BPE harness, the text the
student sees: OBJECTIVE, OBSERVATION, ADMISSIBLE COMMANDS, PREVIOUS ACTIONS,
PLAN, RECALLED HINTS, TRACK RESULT, RECALL RESULT. It never reads the
environment (``request.env``) nor the harness objects (``request.harness``):
whatever the belief or the experience store know reaches it only through a
``track`` or ``recall`` whose result the harness renders. Every decision is
therefore a deterministic function of the prompt (`decide(parse_prompt(text))`),
which is what a student can imitate (design.md, "Known pitfalls").

Decision rules (the current subgoal decides which apply; rule 0, then event rules 2-5 first):

0. **Recover** (states only a student reaches: the teacher's own traces never fire it,
   so it changes no SFT example; it makes DAgger's labels right where the student
   errs). The hand is read off ADMISSIBLE COMMANDS (``put``/``heat``/``examine`` of the
   held object; ``take`` commands only for an empty hand). A held object that is not an
   X -> put it down here (no put offered: carry it back where it was taken, else on
   along the search order). A phase after "find X" with an empty hand -> ``commit find
   X: active`` (the student marked it done too early). An X in hand during "find X",
   not just taken -> the subgoal switch.
1. **Plan.** Empty PLAN -> ``commit plan: …`` with the task type's subgoals:
   pick ``find X; put X in Y``; pick-two ``find first X; put first X in Y;
   find second X; put second X in Y``; heat/cool/clean ``find X; heat X with
   microwave; put X in Y``; look ``find X; use desklamp while holding X``.
   The current phase is the first PLAN item not ``done``.
2. **Subgoal switch.** Right after the action that completes the phase (a take
   of an X, a heat/cool/clean of it, the first put of pick-two) ->
   ``commit <phase>: done; <next>: active``.
3. **Note.** Right after taking an X from a receptacle type that RECALLED HINTS
   did not list (or finding the lamp where RECALL RESULT did not point) ->
   ``note X is sometimes found in/on T`` first, then the commit.
4. **Recall.** Entering a heat/cool/clean phase -> ``recall how: heat X``;
   entering "find second X" -> ``recall mistakes: pick two``; the lamp not
   seen yet (TRACK RESULT says so) -> ``recall where: desklamp``.
5. **Track.** A "find X" phase while TRACK RESULT does not track X (after
   the recall in "find second X") -> ``track X``: the live TRACK RESULT then
   says "in view" the step an X is seen, the line a student reads to decide
   "There is an X here" (the harness module docstring), and lists every X
   seen so far and the unsearched receptacles. Pick-two tracks X from its
   first phase on, so its second search reads the same live view. Entering
   "use desklamp" -> ``track desklamp``, also with the lamp at hand: the
   student then always reads the lamp's line ("in view" -> use it, else go).
6. **Find X.** ``take X n from R`` admissible -> take it (in "find second X"
   never from a Y-type receptacle: that is the first one). At a receptacle the
   OBSERVATION calls closed -> open it. Else go to the first of TRACK
   RESULT's unsearched receptacles, which the harness lists likeliest first
   (`harness.bpe.search`: the types RECALLED HINTS lists, then a fixed
   prior). Pick and pick-two skip Y-type receptacles (the objective is not
   met yet, so no X lies there; the harness lists them last). A receptacle
   sharing the agent's place has no ``go to``: it is opened or examined.
   For "find second X" a receptacle (not Y-type) TRACK RESULT shows an X in
   comes first. Nothing left -> ``look``.
7. **Transform.** ``heat X n with microwave 1`` (cool/fridge, clean/sinkbasin)
   admissible -> do it; else go to the appliance (first instance).
8. **Place.** A put of an X into a Y-type receptacle admissible -> put it; at a
   closed target -> open it; else go to the first Y instance in natural order.
9. **Look.** After the track of rule 5: ``use desklamp n`` admissible -> use
   it; a lamp TRACK RESULT located -> go there; else search (rule 6) TRACK
   RESULT's unsearched receptacles (the harness lists the lamp's recalled
   types first).

Each completion is ``<think>reason</think><action>command</action>``; the
reason names the rule that fired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from evoharness.envs.alfworld.wording import parse_place
from evoharness.harness.bpe.belief import GO_BACK_HEADER, natural_key, type_of
from evoharness.harness.bpe.goal import Goal, parse_goal
from evoharness.harness.bpe.search import GENERIC_ORDER, receptacle_type, search_order
from evoharness.models.tokenizer import estimate_tokens
from evoharness.policies.base import Completion, PolicyRequest, format_action

_SECTION_RE = re.compile(
    r"(?:^|\n\n)(OBJECTIVE|OBSERVATION|ADMISSIBLE COMMANDS|PREVIOUS ACTIONS|PLAN|RECALLED HINTS|TRACK RESULT|"
    r"RECALL RESULT):[ \n]"
)
_PLAN_LINE_RE = re.compile(r"^\d+\. \[.\] (.*) \((pending|active|done|failed)\)$")
_HINT_RE = re.compile(r"^- ([a-z]+): look in ([a-z]+)")
_VIEW_HEAD_RE = re.compile(r"^\((track|recall) (.*), (?:live|last step|\d+ steps ago)\)$")
_PICK_RE = re.compile(r"You pick up the ([a-z]+ \d+) from the ([a-z]+ \d+)\.")
_PUT_RE = re.compile(r"You (?:put the ([a-z]+ \d+) in/on the|move the ([a-z]+ \d+) to the) ([a-z]+ \d+)\.")
_TAKE_CMD_RE = re.compile(r"^take ([a-z]+ \d+) from ([a-z]+ \d+)$")
_TRANSFORM_CMD_RE = re.compile(r"^(?:heat|cool|clean) ([a-z]+ \d+) with ([a-z]+ \d+)$")
_GO_BACK_RE = re.compile(rf"^{GO_BACK_HEADER} ([a-z]+ \d+) \(([a-z]+ \d+) is there\)\.$")
_UNSEARCHED_RE = re.compile(r"[Uu]nsearched \((?:\d+/)?\d+\): (.*?)\.?$")


_rtype = receptacle_type


# ----------------------------------------------------------------- the prompt


@dataclass
class PromptView:
    """What the BPE harness's user message shows, parsed.

    Attributes:
        goal: the parsed OBJECTIVE.
        observation: the latest environment observation.
        admissible: the admissible commands.
        history: PREVIOUS ACTIONS as (action, feedback), oldest first.
        plan: PLAN as (subgoal, status).
        hints: receptacle types RECALLED HINTS lists for the objective's object, in order.
        track: (query, result text) of TRACK RESULT, or None.
        recall: (query, result text) of RECALL RESULT, or None.
    """

    goal: Goal
    observation: str = ""
    admissible: list[str] = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)
    plan: list[tuple[str, str]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    track: tuple[str, str] | None = None
    recall: tuple[str, str] | None = None


def _sections(text: str) -> dict[str, str]:
    marks = list(_SECTION_RE.finditer(text))
    return {
        m.group(1): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip("\n")
        for i, m in enumerate(marks)
    }


def _history(text: str) -> list[tuple[str, str]]:
    if text.strip() == "(none)":
        return []
    out: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        if line.startswith("> "):
            out.append((line[2:].strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(a, "\n".join(f).strip()) for a, f in out]


def _view(text: str | None) -> tuple[str, str] | None:
    if not text:
        return None
    head, _, body = text.partition("\n")
    m = _VIEW_HEAD_RE.match(head.strip())
    return (m.group(2).strip(), body.strip()) if m else None


def parse_prompt(user_text: str) -> PromptView:
    """Parse the BPE harness's user message (see `harness.bpe.harness.BPEHarness.messages`)."""
    s = _sections(user_text)
    plan = [(m.group(1), m.group(2)) for ln in s.get("PLAN", "").split("\n") if (m := _PLAN_LINE_RE.match(ln.strip()))]
    goal = parse_goal(s.get("OBJECTIVE", ""))
    hints = []
    for ln in s.get("RECALLED HINTS", "").split("\n"):
        if (m := _HINT_RE.match(ln.strip())) and m.group(1) == goal.obj and _rtype(m.group(2)) not in hints:
            hints.append(_rtype(m.group(2)))
    adm = s.get("ADMISSIBLE COMMANDS", "").strip()
    return PromptView(
        goal=goal,
        observation=s.get("OBSERVATION", ""),
        admissible=[c.strip() for c in adm.split(", ") if c.strip()] if adm else [],
        history=_history(s.get("PREVIOUS ACTIONS", "(none)")),
        plan=plan,
        hints=hints,
        track=_view(s.get("TRACK RESULT")),
        recall=_view(s.get("RECALL RESULT")),
    )


# ----------------------------------------------------------------- the plan


def plan_for(goal: Goal) -> list[str]:
    """The subgoals the teacher commits at the start of an episode."""
    o, y = goal.obj, goal.target
    if goal.count == 2:
        return [f"find first {o}", f"put first {o} in {y}", f"find second {o}", f"put second {o} in {y}"]
    if goal.transform:
        return [f"find {o}", f"{goal.transform} {o} with {goal.appliance}", f"put {o} in {y}"]
    if goal.light:
        return [f"find {o}", f"use {goal.light} while holding {o}"]
    return [f"find {o}", f"put {o} in {y}"]


def _phase(v: PromptView) -> tuple[int, str]:
    """(index, text) of the first PLAN item not done; (-1, "") when all are done."""
    for i, (text, status) in enumerate(v.plan):
        if status != "done":
            return i, text
    return -1, ""


def current_subgoal(v: PromptView) -> str:
    """The PLAN item being worked on (the first not done), "" if none."""
    return _phase(v)[1]


# ----------------------------------------------------------------- the scene


def location(v: PromptView) -> str | None:
    """The receptacle the agent is at: the latest ``go to R`` (arrived), ``open R``
    or ``examine R`` in PREVIOUS ACTIONS (receptacles sharing a location are
    opened or examined where the agent stands: they have no ``go to``)."""
    for a, f in reversed(v.history):
        if a.startswith("go to ") and f.startswith("You arrive"):
            return a[len("go to ") :]
        for verb in ("open ", "examine "):
            if a.startswith(verb) and type_of(a[len(verb) :]) != v.goal.obj and not f.startswith("Nothing happens"):
                return a[len(verb) :]
    return None


def _receptacles(v: PromptView) -> list[str]:
    """The scene's receptacles: ``go to`` targets, those sharing the agent's
    location (``open``/``examine`` targets other than a held X), the current one."""
    out = set()
    for c in v.admissible:
        for verb in ("go to ", "open ", "examine "):
            if c.startswith(verb) and (verb == "go to " or type_of(c[len(verb) :]) != v.goal.obj):
                out.add(c[len(verb) :])
    if here := location(v):
        out.add(here)
    return sorted(out, key=natural_key)


def _closed_here(v: PromptView, here: str | None) -> str | None:
    """``open R`` when the agent stands at R and the observation says R is closed."""
    if here and f"The {here} is closed." in v.observation and f"open {here}" in v.admissible:
        return f"open {here}"
    return None


def _next_after(order: list[str], here: str | None) -> str | None:
    if not order:
        return None
    if here in order:
        i = order.index(here)
        return order[i + 1] if i + 1 < len(order) else None
    return order[0]


def _go(v: PromptView, recep: str, why: str) -> tuple[str, str] | None:
    """``go to R``; for an R sharing the agent's location (no ``go to``): ``open R``
    if closed, else ``examine R`` to see what is on it."""
    for cmd in (f"go to {recep}", f"open {recep}", f"examine {recep}"):
        if cmd in v.admissible:
            return cmd, why
    return None


def _first_of_type(v: PromptView, rtype: str) -> str | None:
    return next((r for r in _receptacles(v) if _rtype(r) == rtype), None)


def _recalled_types(v: PromptView, obj: str) -> list[str]:
    """Receptacle types a ``recall where: obj`` result lists (RECALL RESULT)."""
    if not v.recall or v.recall[0] != f"where: {obj}":
        return []
    out = []
    for ln in v.recall[1].split("\n"):
        if (m := _HINT_RE.match(ln.strip())) and m.group(1) == obj and _rtype(m.group(2)) not in out:
            out.append(_rtype(m.group(2)))
    return out


def _unsearched(track_text: str) -> list[str]:
    for ln in track_text.split("\n"):
        if m := _UNSEARCHED_RE.search(ln.strip()):
            return [r.strip() for r in m.group(1).split(",") if r.strip() and r.strip() != "none"]
    return []


def _go_back(track_text: str) -> tuple[str, str] | None:
    """(receptacle, instance) of a ``track`` result's ``Go back to:`` line (`Belief.go_back`)."""
    for ln in track_text.split("\n"):
        if m := _GO_BACK_RE.match(ln.strip()):
            return m.group(1), m.group(2)
    return None


# ----------------------------------------------------------------- decisions


def _last(v: PromptView) -> tuple[str, str]:
    return v.history[-1] if v.history else ("", "")


def _switch(v: PromptView, k: int, why: str) -> tuple[str, str]:
    items = [t for t, _ in v.plan]
    update = f"{items[k]}: done" + (f"; {items[k + 1]}: active" if k + 1 < len(items) else "")
    return f"commit {update}", why


def _find(v: PromptView, k: int, second: bool) -> tuple[str, str]:
    g = v.goal
    o, y = g.obj, g.target
    last_a, last_f = _last(v)
    if last_a.startswith("take ") and (m := _PICK_RE.search(last_f)) and type_of(m.group(1)) == o:
        rtype = _rtype(m.group(2))
        if rtype not in v.hints:
            return (
                f"note {o} is sometimes found in/on {rtype}",
                f"I found the {o} in a {rtype}, which my recalled hints did not list; I note it for later episodes.",
            )
        return _switch(v, k, f"I hold the {m.group(1)}; this subgoal is done, so I update the plan.")
    if last_a.startswith(f"note {o} is "):
        return _switch(v, k, f"I hold the {o} and noted where it was; I mark the subgoal done.")
    if second and last_a.startswith("commit "):
        return (
            "recall mistakes: pick two",
            f"The first {o} is placed; before searching again I check the known mistakes of pick-two tasks.",
        )
    if not (v.track and v.track[0] == o):
        return f"track {o}", f"I track the {o}: TRACK RESULT will show where I see one."
    for c in v.admissible:
        m = _TAKE_CMD_RE.match(c)
        if m and type_of(m.group(1)) == o and not (second and _rtype(m.group(2)) == y):
            return c, f"There is a {m.group(1)} here; I take it."
    here = location(v)
    if cmd := _closed_here(v, here):
        return cmd, f"The {here} is closed; I open it to see inside."
    track = v.track[1]  # the live ``track X``: every X seen so far, then the unsearched receptacles, likeliest first
    # one seen elsewhere (pick-two: the second; never the placed one): the harness's Go back line
    if (back := _go_back(track)) and (step := _go(v, back[0], f"I saw another {o} in {back[0]}; I go get it.")):
        return step
    skip = y if y and (second or not g.transform) else None
    for r in _unsearched(track):
        if _rtype(r) != skip and (step := _go(v, r, f"No {o} here; the next receptacle to search is {r}.")):
            return step
    return _exhausted(v, o)


def _exhausted(v: PromptView, obj: str) -> tuple[str, str]:
    return "look", f"I have searched everywhere I know for the {obj}."


def _transform(v: PromptView, k: int) -> tuple[str, str]:
    g = v.goal
    verb, o = g.transform, g.obj
    last_a, last_f = _last(v)
    if last_a.startswith("commit "):
        return f"recall how: {verb} {o}", f"Before I {verb} the {o} I recall how it is done."
    if re.search(rf"You {verb} the {o} \d+ using the", last_f):
        return _switch(v, k, f"The {o} is done ({verb}); I update the plan.")
    for c in v.admissible:
        if c.startswith(f"{verb} ") and type_of(c[len(verb) + 1 :].split(" with ")[0]) == o:
            return c, f"I am at the {g.appliance} holding the {o}; I {verb} it."
    app = _first_of_type(v, g.appliance) or (_first_of_type(v, "bathtubbasin") if verb == "clean" else None)
    if app and f"go to {app}" in v.admissible:
        return f"go to {app}", f"To {verb} the {o} I go to the {app}."
    return "look", f"I cannot reach a {g.appliance}."


def _place(v: PromptView, k: int, first_of_two: bool) -> tuple[str, str]:
    g = v.goal
    o, y = g.obj, g.target
    last_a, last_f = _last(v)
    if first_of_two and (m := _PUT_RE.search(last_f)) and type_of(m.group(1) or m.group(2)) == o:
        return _switch(v, k, f"The first {o} is in the {m.group(3)}; I mark it done and move on to the second.")
    for c in v.admissible:
        p = parse_place(c)
        if p and type_of(p[0]) == o and _rtype(p[1]) == y:
            return c, f"I hold the {p[0]} at the {p[1]}; I put it there."
    target = _first_of_type(v, y)
    if target and f"open {target}" in v.admissible:
        return f"open {target}", f"The {target} is closed; I open it to put the {o} in."
    if target and f"go to {target}" in v.admissible:
        return f"go to {target}", f"I carry the {o} to the {target}."
    return "look", f"I cannot reach a {y}."


def _use_light(v: PromptView, k: int) -> tuple[str, str]:
    g = v.goal
    lamp, o = g.light, g.obj
    last_a, _ = _last(v)
    track = v.track[1] if v.track and v.track[0] == lamp else None
    unseen = track is not None and "not seen yet" in track
    # the lamp had to be searched for: it was not seen when tracked, so its whereabouts were recalled
    searched = unseen or bool(v.recall and v.recall[0] == f"where: {lamp}")
    if last_a.startswith("commit ") or track is None:
        return f"track {lamp}", f"I hold the {o}; I check whether I have already seen a {lamp}."
    for c in v.admissible:
        if c.startswith(f"use {lamp} "):
            here = location(v)
            rtype = _rtype(here) if here else ""
            noted = last_a.startswith(f"note {lamp} is ")
            if searched and rtype and rtype not in _recalled_types(v, lamp) and not noted:
                return (
                    f"note {lamp} is sometimes found in/on {rtype}",
                    f"The {lamp} was in a {rtype}, which I did not recall; I note it for later episodes.",
                )
            return c, f"I hold the {o} next to the {c[4:]}; I turn it on to look at the {o}."
    here = location(v)
    if (back := _go_back(track)) and (step := _go(v, back[0], f"I saw the {back[1]} on the {back[0]}; I go there.")):
        return step
    if unseen and not (v.recall and v.recall[0] == f"where: {lamp}"):
        return f"recall where: {lamp}", f"I have not seen a {lamp} yet; I recall where one is usually found."
    if cmd := _closed_here(v, here):
        return cmd, f"The {here} is closed; I open it to see inside."
    for r in _unsearched(track):
        if step := _go(v, r, f"No {lamp} here; the next receptacle to search is {r}."):
            return step
    return "look", f"I have searched everywhere I know for the {lamp}."


def _held(v: PromptView) -> str | None:
    """The object in hand, read off ADMISSIBLE COMMANDS: ALFWorld offers ``put P in/on R``,
    ``heat/cool/clean P with R`` and ``examine P`` for a non-receptacle P only for the held
    P; None when none is offered (an empty hand)."""
    for c in v.admissible:
        if p := parse_place(c):
            return p[0]
        if m := _TRANSFORM_CMD_RE.match(c):
            return m.group(1)
    for c in v.admissible:
        if c.startswith("examine ") and (t := _rtype(c[len("examine ") :])) not in GENERIC_ORDER and "lamp" not in t:
            return c[len("examine ") :]
    return None


def _hands_empty(v: PromptView) -> bool:
    """ALFWorld offers ``take`` commands only to an empty hand."""
    return any(_TAKE_CMD_RE.match(c) for c in v.admissible)


def _recover(v: PromptView, k: int, item: str) -> tuple[str, str] | None:
    """Rule 0 (states only a student reaches, for DAgger labels): a held object that is not
    an X is put down where the agent stands; a phase after "find X" with an empty hand (a
    subgoal committed done too early, or its X put down) reopens that find subgoal; an X
    already in hand during its find phase closes it."""
    o, (last_a, last_f) = v.goal.obj, _last(v)
    held = _held(v)
    if held and type_of(held) != o and v.goal.light != type_of(held):
        if put := next((c for c in v.admissible if (p := parse_place(c)) and p[0] == held), None):
            return put, f"I hold the {held}, not a {o}; I put it down before searching on."
        # back where it came from (it fits there), else on along the search order
        here = location(v)
        came = [
            r for a, _ in v.history if a.startswith(f"take {held} from ") and (r := a.rsplit(" from ", 1)[1]) != here
        ]
        nxt = came[-1] if came else _next_after(search_order(_receptacles(v), v.hints), here)
        if nxt and (step := _go(v, nxt, f"I hold the {held}, not a {o}, and cannot put it here; I go to {nxt}.")):
            return step
    if item.startswith("find "):
        just_found = last_a.startswith(("take ", f"note {o} is "))  # rule 2/3 handle these turns
        if (
            held
            and type_of(held) == o
            and not just_found
            and not (item.startswith("find second") and _first_placed_in_hand(v, held))
        ):
            return _switch(v, k, f"I already hold the {held}; this subgoal is done, so I update the plan.")
        return None
    if _hands_empty(v) and not ((m := _PUT_RE.search(last_f)) and type_of(m.group(1) or m.group(2)) == o):
        finds = [i for i, (t, _) in enumerate(v.plan[:k]) if t.startswith("find ")]
        if finds:
            return (
                f"commit {v.plan[finds[-1]][0]}: active",
                f"My hand is empty, so I do not hold the {o} yet; I reopen the search.",
            )
    return None


def _first_placed_in_hand(v: PromptView, held: str) -> bool:
    """Pick-two: the held X is the one already placed (taken back from a Y-type receptacle)."""
    return any(
        a.startswith(f"take {held} from ") and _rtype(a.rsplit(" from ", 1)[1]) == v.goal.target for a, _ in v.history
    )


def decide(v: PromptView) -> tuple[str, str]:
    """The teacher's (action, reason) for a parsed prompt (rules in the module docstring)."""
    g = v.goal
    if not g.parsed:
        return "look", "I cannot read the objective; I look around."
    if not v.plan:
        return "commit plan: " + "; ".join(plan_for(g)), "New task: I write my plan as subgoals before acting."
    k, item = _phase(v)
    if k < 0:
        return "look", "Every subgoal of my plan is done."
    if fix := _recover(v, k, item):
        return fix
    if item.startswith("find "):
        return _find(v, k, second=item.startswith("find second"))
    if g.transform and item.startswith(f"{g.transform} "):
        return _transform(v, k)
    if item.startswith("use "):
        return _use_light(v, k)
    return _place(v, k, first_of_two=item.startswith("put first"))


def teacher_completion(user_text: str) -> str:
    """The teacher's completion for a rendered BPE user message."""
    action, think = decide(parse_prompt(user_text))
    return format_action(action, think)


class TeacherPolicy:
    """Scripted, non-privileged BPE teacher (rules in the module docstring).

    Only the requests' rendered messages are read (the last user message);
    ``request.env`` and ``request.harness`` are ignored. Deterministic: `seed`
    is accepted for the factory's signature and unused.
    """

    name = "teacher"
    privileged = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, req: PolicyRequest) -> Completion:
        user = next((m["content"] for m in reversed(req.messages) if m.get("role") == "user"), "")
        prompt_tokens = sum(estimate_tokens(m["content"]) for m in req.messages)
        if "\n\nPLAN:" not in user:
            return Completion(
                text="",
                finish_reason="error",
                prompt_tokens=prompt_tokens,
                error="the teacher plays the BPE harness only (no PLAN view in the prompt)",
            )
        text = teacher_completion(user)
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=estimate_tokens(text))

    def close(self) -> None:
        pass
