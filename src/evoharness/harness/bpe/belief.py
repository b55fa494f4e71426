"""Belief B_t: a rule-based world model of an ALFWorld episode (no LLM).

EvoHarness-RL (arXiv 2608.05446) keeps task-relevant facts in a belief that a
rule-based parser of (action, observation) pairs updates after every
environment step. Capacity: 48 relation edges.

Edges are ``(subject, relation, value)``:

=========  ==================  ===========================================
relation   subject -> value    from
=========  ==================  ===========================================
``in``     object -> recep     "On the X, you see …", "In it, you see …",
                               "You put the o in/on the r.", "You move the o
                               to the r."; removed by "You pick up …"
``holds``  agent -> object     take / put / "You are carrying: …"
``at``     agent -> recep      "go to r" + "You arrive at …", look
``open``   recep -> open|closed  "The r is closed.", "You open/close the r."
``search`` recep -> visited|searched|empty  arriving (visited), seeing its
                               contents (searched / empty)
``state``  object -> hot|cold|clean|on|off  heat / cool / clean / use, examine
``placed`` object -> you       the agent's put / move; removed by its pickup
=========  ==================  ===========================================

Eviction rule (when more than 48 edges): drop the edge of lowest tier, and
within a tier the least recently confirmed (then the oldest inserted).
Tiers: 3 agent edges (``at``, ``holds``); 2 edges about a *focus* type (the
objective's object, target, appliance, light) and all object states;
1 receptacle edges (``open``, ``search``); 0 other objects' locations.
The scene's receptacle list (from the first observation) is kept apart: it
is static and not a relation. So is ``in_view``: the objects the latest
environment observation lists. `describe` (and so ``track``) marks an object
"in view" when it is in ``in_view`` or lies in/on the receptacle the agent is
at (unless that receptacle is closed): it can be taken or used from here, also
after an action whose feedback lists nothing ("You pick up the book 1 from the
desk 1." leaves the desklamp on desk 1 in view).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

BELIEF_CAPACITY = 48
AGENT = "agent"
NEXT_HEADER = "Next to search:"  # the unsearched list's first entry, restated on its own line
GO_BACK_HEADER = "Go back to:"  # where a seen instance waits (`go_back`); replaces NEXT_HEADER's line

_NAME = r"[a-z]+ \d+"
_ITEMS_RE = re.compile(r"\b(?:an?|some) ([a-z]+ \d+)")
_SCENE_RE = re.compile(r"Looking quickly around you, you see (.+?)\.\s*(?:\n|$)", re.S)
_ARRIVE_RE = re.compile(r"You arrive at (.+?)\.")
_ON_RE = re.compile(rf"On the ({_NAME}), you see (.+?)\.(?:\s|$)")
_OPEN_IN_RE = re.compile(rf"The ({_NAME}) is open\. In it, you see (.+?)\.(?:\s|$)")
_NORMAL_IN_RE = re.compile(rf"This is a normal ({_NAME})\. In it, you see (.+?)\.(?:\s|$)")
_CLOSED_RE = re.compile(rf"The ({_NAME}) is closed\.")
_OPENED_RE = re.compile(rf"You open the ({_NAME})\.")
_CLOSE_RE = re.compile(rf"You close the ({_NAME})\.")
_PICK_RE = re.compile(rf"You pick up the ({_NAME})(?: from the ({_NAME}))?\.")
_PUT_RE = re.compile(rf"You (?:put the ({_NAME}) (?:in/on|in|on) the ({_NAME})|move the ({_NAME}) to the ({_NAME}))\.")
_TRANSFORM_RE = re.compile(rf"You (heat|cool|clean) the ({_NAME}) using the ({_NAME})\.")
_TOGGLE_RE = re.compile(rf"You turn (on|off) the ({_NAME})\.")
_CARRY_RE = re.compile(r"You are carrying: (.+?)\.(?:\s|$)")
_EXAMINE_RE = re.compile(rf"This is an? ((?:(?:hot|cool|cold|clean|sliced)(?: and)? )+)({_NAME})\.")
_EXAMINE_TOGGLE_RE = re.compile(rf"This ({_NAME}) is (on|off)\.")
_FACING_RE = re.compile(rf"You are facing the ({_NAME})")
_GOTO_RE = re.compile(r"^go to (.+)$")

_TRANSFORM_STATE = {"heat": "hot", "cool": "cold", "clean": "clean"}
_EXCLUSIVE = {"hot": "cold", "cold": "hot", "on": "off", "off": "on"}
_FUNCTIONAL = {"in", "at", "open", "search", "placed"}  # one value per subject


def type_of(name: str) -> str:
    """``apple 1`` -> ``apple``; a bare type is returned unchanged."""
    return re.sub(r"\s+\d+$", "", name.strip())


def track_subject(query: str) -> str:
    """A ``track`` argument as the belief reads it: lower case, no article or brackets."""
    return re.sub(r"^(the|a|an|some)\s+", "", query.strip().lower().strip("[]").strip())


def natural_key(name: str) -> tuple[str, int]:
    """``drawer 10`` sorts after ``drawer 9``."""
    m = re.match(r"^(.*?)\s*(\d+)$", name.strip())
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def _items(text: str) -> list[str]:
    return [] if text.strip() == "nothing" else _ITEMS_RE.findall(text)


@dataclass
class Edge:
    """One relation ``subject --relation--> value``; ``step`` = last confirmed."""

    subject: str
    relation: str
    value: str
    step: int
    seq: int

    @property
    def key(self) -> tuple[str, ...]:
        if self.relation in _FUNCTIONAL:
            return (self.subject, self.relation)
        return (self.subject, self.relation, self.value)


@dataclass
class StepEvents:
    """What one update observed that other parts of the harness care about."""

    picked: tuple[str, str] | None = None  # (object, receptacle) of a successful pickup
    placed: tuple[str, str] | None = None
    contents_seen: tuple[str, list[str]] | None = None  # (receptacle, objects)


class Belief:
    """Rule-based belief over an ALFWorld episode, bounded to `capacity` edges.

    Args:
        capacity: maximum number of relation edges (48 in EvoHarness-RL).
        focus: type names never evicted before others (see module docstring).
    """

    def __init__(self, capacity: int = BELIEF_CAPACITY, focus: set[str] | frozenset[str] = frozenset()) -> None:
        self.capacity = capacity
        self.focus = set(focus)
        self.receptacles: list[str] = []
        self.step = 0
        self._edges: dict[tuple[str, ...], Edge] = {}
        self._seq = 0
        # objects the latest environment observation lists (a receptacle's contents); `describe`
        # marks them "in view", so a tracked object's line says when it is right here
        self.in_view: set[str] = set()

    # ----- updating -------------------------------------------------------
    def observe_scene(self, observation: str) -> None:
        """Read the receptacle list of the first observation (reset)."""
        m = _SCENE_RE.search(observation)
        if m:
            self.receptacles = sorted(set(_items(m.group(1))), key=natural_key)

    def update(self, action: str, observation: str) -> StepEvents:
        """Apply one environment step (the command and the engine's feedback)."""
        self.step += 1
        ev = StepEvents()
        obs = observation.strip()
        if obs.startswith("Nothing happens") or not obs:
            return ev  # nothing changed: what is in view stays in view
        self.in_view = set()
        goto, arrive = _GOTO_RE.match(action.strip()), _ARRIVE_RE.search(obs)
        if goto and arrive:  # this engine says "You arrive at loc 8."; newer ones name the receptacle
            here = goto.group(1) if arrive.group(1).startswith("loc ") else arrive.group(1)
            self._set(AGENT, "at", here)
            if self.search_status(here) is None:
                self._set(here, "search", "visited")
        if m := _FACING_RE.search(obs):
            self._set(AGENT, "at", m.group(1))
        for pat in (_ON_RE, _OPEN_IN_RE, _NORMAL_IN_RE):
            for m in pat.finditer(obs):
                ev.contents_seen = (m.group(1), _items(m.group(2)))
                self._see_contents(*ev.contents_seen)
                self.in_view.update(ev.contents_seen[1])
        for m in _CLOSED_RE.finditer(obs):
            self._set(m.group(1), "open", "closed")
        for m in _OPENED_RE.finditer(obs):
            self._set(m.group(1), "open", "open")
        for m in _CLOSE_RE.finditer(obs):
            self._set(m.group(1), "open", "closed")
        if m := _PICK_RE.search(obs):
            obj, rec = m.group(1), m.group(2) or self.location_of(m.group(1)) or ""
            self._drop(obj, "in")
            self._drop(obj, "placed")
            self._set(AGENT, "holds", obj)
            ev.picked = (obj, rec)
        if m := _PUT_RE.search(obs):
            obj, rec = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            self._drop(AGENT, "holds", obj)
            self._set(obj, "in", rec)
            self._set(obj, "placed", "you")
            if self.search_status(rec) in (None, "visited", "empty"):
                self._set(rec, "search", "searched")
            ev.placed = (obj, rec)
        if m := _TRANSFORM_RE.search(obs):
            self._set_state(m.group(2), _TRANSFORM_STATE[m.group(1)])
        if m := _TOGGLE_RE.search(obs):
            self._set_state(m.group(2), m.group(1))
        if m := _EXAMINE_RE.search(obs):
            for word in re.findall(r"hot|cool|cold|clean", m.group(1)):
                self._set_state(m.group(2), "cold" if word == "cool" else word)
        if m := _EXAMINE_TOGGLE_RE.search(obs):
            self._set_state(m.group(1), m.group(2))
        if m := _CARRY_RE.search(obs):
            self._drop(AGENT, "holds")
            for obj in _items(m.group(1)):
                self._set(AGENT, "holds", obj)
        elif "You are not carrying anything" in obs:
            self._drop(AGENT, "holds")
        self._evict()
        return ev

    def _see_contents(self, rec: str, objs: list[str]) -> None:
        for e in [e for e in self._edges.values() if e.relation == "in" and e.value == rec and e.subject not in objs]:
            del self._edges[e.key]  # contradicted: no longer there
        for obj in objs:
            self._set(obj, "in", rec)
        self._set(rec, "search", "searched" if objs else "empty")

    def _set(self, subject: str, relation: str, value: str) -> None:
        self._seq += 1
        e = Edge(subject, relation, value, self.step, self._seq)
        old = self._edges.get(e.key)
        if old is not None and old.value == value:
            e.seq = old.seq  # re-confirmed: keep its place, refresh its step
        self._edges[e.key] = e

    def _set_state(self, obj: str, state: str) -> None:
        if state in _EXCLUSIVE:
            self._drop(obj, "state", _EXCLUSIVE[state])
        self._set(obj, "state", state)

    def _drop(self, subject: str, relation: str, value: str | None = None) -> None:
        for k in [
            k
            for k, e in self._edges.items()
            if e.subject == subject and e.relation == relation and value in (None, e.value)
        ]:
            del self._edges[k]

    def _tier(self, e: Edge) -> int:
        if e.subject == AGENT:
            return 3
        if e.relation == "state" or type_of(e.subject) in self.focus:
            return 2
        if e.relation in ("open", "search"):
            return 1
        return 0

    def _evict(self) -> None:
        """Drop lowest-tier, least recently confirmed edges beyond capacity."""
        overflow = len(self._edges) - self.capacity
        if overflow <= 0:
            return
        victims = sorted(self._edges.values(), key=lambda e: (self._tier(e), e.step, e.seq))[:overflow]
        for e in victims:
            del self._edges[e.key]

    # ----- reading (the teacher and `track` use these) --------------------
    @property
    def edges(self) -> list[Edge]:
        return sorted(self._edges.values(), key=lambda e: e.seq)

    def __len__(self) -> int:
        return len(self._edges)

    @property
    def at(self) -> str | None:
        e = self._edges.get((AGENT, "at"))
        return e.value if e else None

    @property
    def holding(self) -> list[str]:
        return [e.value for e in self.edges if e.subject == AGENT and e.relation == "holds"]

    def location_of(self, obj: str) -> str | None:
        """Where the object is believed to be; ``"agent"`` when held."""
        if obj in self.holding:
            return AGENT
        e = self._edges.get((obj, "in"))
        return e.value if e else None

    def states(self, obj: str) -> list[str]:
        return sorted(e.value for e in self._edges.values() if e.subject == obj and e.relation == "state")

    def is_open(self, rec: str) -> bool | None:
        e = self._edges.get((rec, "open"))
        return None if e is None else e.value == "open"

    def search_status(self, rec: str) -> str | None:
        """``visited`` (contents not seen), ``searched``, ``empty`` or None."""
        e = self._edges.get((rec, "search"))
        return e.value if e else None

    def contents(self, rec: str) -> list[str]:
        return sorted(
            (e.subject for e in self._edges.values() if e.relation == "in" and e.value == rec), key=natural_key
        )

    def objects(self) -> list[str]:
        """Every object the belief knows (located, held, or with a state)."""
        names = {e.subject for e in self._edges.values() if e.relation in ("in", "state")} | set(self.holding)
        return sorted(names, key=natural_key)

    def instances(self, obj_type: str) -> list[str]:
        return [o for o in self.objects() if type_of(o) == obj_type]

    def unsearched(self) -> list[str]:
        """Scene receptacles whose contents have not been seen."""
        return [r for r in self.receptacles if self.search_status(r) not in ("searched", "empty")]

    # ----- rendering (meta-action `track`) --------------------------------
    def describe(self, obj: str) -> str:
        """One object's or receptacle's belief as a line."""
        loc = self.location_of(obj)
        parts = []
        if loc == AGENT:
            parts.append("held by you")
        elif loc:  # in view: listed by the latest observation, or on the (not closed) receptacle the agent is at
            at_hand = obj in self.in_view or (loc == self.at and self.is_open(loc) is not False)
            # "placed by you": a pick-two search must not take its first object back out of the target
            placed = (obj, "placed") in self._edges
            parts.append(f"in/on {loc}" + (", in view" if at_hand else "") + (", placed by you" if placed else ""))
        if st := self.states(obj):
            parts.append(", ".join(st))
        if obj in self.receptacles or self.search_status(obj) or self.is_open(obj) is not None:
            if (op := self.is_open(obj)) is not None:
                parts.append("open" if op else "closed")
            status = self.search_status(obj) or "not visited"
            inside = self.contents(obj)
            parts.append(f"{status}" + (f", contains {', '.join(inside)}" if inside else ""))
        return f"{obj}: " + ("; ".join(parts) if parts else "unknown")

    def track(self, query: str = "world", order: Callable[[list[str]], list[str]] | None = None) -> str:
        """The ``track`` meta-action's text for `query`: ``world`` -> `world_summary`; an
        instance (``apple 1``) -> its `describe` line; an object type -> each known
        instance's line, then ``Unsearched (n): ...`` (or ``<type>: not seen yet.
        Unsearched (n): ...`` when none is known); a receptacle type -> each instance's line.
        `order` sorts the unsearched receptacles (the harness: likeliest first,
        `search.search_order`); default natural order. While any is left, a last line
        ``Next to search: <first entry>.`` restates the entry a search goes to: with it five seeds' 1.1M
        students named another receptacle in 6-27% of such turns, against 11-76% when copying the
        list's head (benchmarks/results/student/search_faults_seeds.md). When an instance was seen
        elsewhere and none is held or at hand (`go_back`), the last line is ``Go back to: <receptacle>
        (<instance> is there).`` instead: no search is needed."""
        q = track_subject(query)
        if q in ("", "world", "all", "everything"):
            return self.world_summary()
        if re.search(r"\d$", q):
            return self.describe(q)
        todo = order(self.unsearched()) if order else self.unsearched()
        unsearched = f"Unsearched ({len(todo)}): {', '.join(todo) or 'none'}."
        names = self.instances(q) or self.instances(q.rstrip("s"))
        if back := self.go_back(names):
            unsearched += f"\n{GO_BACK_HEADER} {back[1]} ({back[0]} is there)."
        elif todo:
            unsearched += f"\n{NEXT_HEADER} {todo[0]}."
        if names:
            # where else one may be: what a search for another instance (pick-two) reads
            return "\n".join([*(self.describe(n) for n in names), unsearched])
        if q.rstrip("s") in {type_of(r) for r in self.receptacles}:
            return "\n".join(self.describe(r) for r in self.receptacles if type_of(r) == q.rstrip("s"))
        return f"{q}: not seen yet. {unsearched}"

    def go_back(self, names: list[str]) -> tuple[str, str] | None:
        """(instance, receptacle) of the first of `names` (natural order) seen in a receptacle the
        agent is not at, when none of them is held or at hand (``in view``): the receptacle to go
        back to instead of searching on. Instances in a receptacle of a type the agent put one of
        them in do not count (pick-two: the first one placed, and the target's own, stay). Without
        it the students kept searching while TRACK RESULT showed the second pick-two object or the
        desklamp elsewhere: in 28 of the 38 valid_seen and 27 of the 36 unseen-room games SFT + GRPO
        lost over five seeds (benchmarks/results/student/go_back_faults_sft3000.md)."""
        if not names or any(self.location_of(n) == AGENT for n in names):
            return None
        placed_in = {type_of(self.location_of(n) or "") for n in names if (n, "placed") in self._edges}
        seen = [(n, loc) for n in names if (loc := self.location_of(n)) and type_of(loc) not in placed_in]
        if not seen or any(n in self.in_view or loc == self.at for n, loc in seen):
            return None  # one lies here: take it (or open what it is in) where the agent stands
        return seen[0]

    def world_summary(self) -> str:
        """Compact global summary for ``track world``."""
        held = ", ".join(f"{o} ({', '.join(self.states(o))})" if self.states(o) else o for o in self.holding)
        lines = [f"at: {self.at or 'start'}; holding: {held or 'nothing'}"]
        by_rec: dict[str, list[str]] = {}
        for e in self._edges.values():
            if e.relation == "in":
                by_rec.setdefault(e.value, []).append(e.subject)
        if by_rec:
            lines.append(
                "seen: "
                + "; ".join(
                    f"{r}: {', '.join(sorted(v, key=natural_key))}"
                    for r, v in sorted(by_rec.items(), key=lambda kv: natural_key(kv[0]))
                )
            )
        states = [f"{o} {'/'.join(self.states(o))}" for o in self.objects() if self.states(o) and o not in self.holding]
        if states:
            lines.append("states: " + ", ".join(states))
        opened = sorted(
            (e.subject for e in self._edges.values() if e.relation == "open" and e.value == "open"), key=natural_key
        )
        if opened:
            lines.append("open: " + ", ".join(opened))
        empty = sorted(
            (e.subject for e in self._edges.values() if e.relation == "search" and e.value == "empty"), key=natural_key
        )
        if empty:
            lines.append("empty: " + ", ".join(empty))
        if self.receptacles:
            todo = self.unsearched()
            lines.append(f"unsearched ({len(todo)}/{len(self.receptacles)}): " + (", ".join(todo) or "none"))
        return "\n".join(lines)
