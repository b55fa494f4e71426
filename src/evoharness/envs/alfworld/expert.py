"""A privileged planner expert for ALFWorld: reads the PDDL state, walks straight there.

It recomputes its next command from the current facts every step (no memory),
so it recovers from any detour a noisy policy takes. It knows where hidden
objects are, which no model can: it is an upper bound and a correctness check
of the environment, never an imitation teacher (the SFT teacher is the
non-privileged one that searches; see design.md "Known pitfalls").
"""

from __future__ import annotations

from collections import defaultdict

from evoharness.envs.alfworld.task_info import APPLIANCES, STATE_PREDICATE, TaskInfo
from evoharness.envs.alfworld.wording import parse_place


class WorldView:
    """Indexed view of a list of (predicate, args) facts with demangled names."""

    def __init__(self, facts: list[tuple[str, tuple[str, ...]]]) -> None:
        self.unary: dict[str, set[str]] = defaultdict(set)
        self.type_of: dict[str, str] = {}
        self.in_recep: dict[str, str] = {}
        self.recep_loc: dict[str, str] = {}
        self.obj_loc: dict[str, str] = {}
        self.agent_loc = ""
        self.held: set[str] = set()
        # Sorted: engines may list facts in any order (set iteration varies
        # with the process's hash seed), and an object can be in two
        # receptacles at once (a mug in a coffee machine on a countertop).
        for pred, args in sorted(facts, key=lambda f: (f[0], [_natural(a) for a in f[1]])):
            if len(args) == 1:
                self.unary[pred].add(args[0])
            elif pred in ("objecttype", "receptacletype"):
                self.type_of[args[0]] = args[1].removesuffix("type").strip()
            elif pred == "inreceptacle":
                self.in_recep.setdefault(args[0], args[1])
            elif pred == "receptacleatlocation":
                self.recep_loc[args[0]] = args[1]
            elif pred == "objectatlocation":
                self.obj_loc[args[0]] = args[1]
            elif pred == "atlocation":
                self.agent_loc = args[1]
            elif pred == "holds":
                self.held.add(args[1])

    def of_type(self, kind: str, receptacles: bool = False) -> list[str]:
        pool = self.recep_loc if receptacles else self.obj_loc.keys() | self.in_recep.keys() | self.held
        return sorted((x for x in pool if self.type_of.get(x) == kind), key=_natural)

    def at(self, recep: str) -> bool:
        """The agent stands at `recep` (several receptacles can share a location)."""
        return bool(self.agent_loc) and self.recep_loc.get(recep) == self.agent_loc

    def where(self, obj: str) -> str:
        """Receptacle holding `obj` ("" when none). Objects with a location but
        no receptacle are never shown by the engine and cannot be taken."""
        return self.in_recep.get(obj, "")


def _natural(name: str) -> tuple[str, int]:
    base, _, num = name.rpartition(" ")
    return (base, int(num)) if num.isdigit() else (name, 0)


def _find(admissible: list[str], *prefixes: str) -> str | None:
    """First admissible command equal to a prefix, or starting with it when the
    prefix ends in a space (so ``go to cabinet 1`` never matches ``cabinet 10``)."""
    for p in prefixes:
        for c in admissible:
            if c == p or (p.endswith(" ") and c.startswith(p)):
                return c
    return None


class PlannerExpert:
    """Next command from the full PDDL state: ``next_action(facts, admissible) -> (command, reason)``."""

    def __init__(self, info: TaskInfo) -> None:
        self.info = info

    def _done_ok(self, w: WorldView, obj: str) -> bool:
        t = self.info.transform
        return not t or obj in w.unary[STATE_PREDICATE[t]]

    def _target(self, w: WorldView) -> str:
        """The receptacle instance to fill: one already holding a finished
        object, else one that needs no opening, else the first."""
        cands = w.of_type(self.info.receptacle_type, receptacles=True)
        if not cands:
            return ""
        for r in cands:
            if any(w.in_recep.get(o) == r and self._done_ok(w, o) for o in w.of_type(self.info.object_type)):
                return r
        return next((r for r in cands if r not in w.unary["openable"]), cands[0])

    def _go(self, w: WorldView, recep: str, admissible: list[str], why: str) -> tuple[str, str]:
        if not w.at(recep):
            cmd = _find(admissible, f"go to {recep}")
            if cmd:
                return cmd, why
        if recep in w.unary["openable"] and recep not in w.unary["opened"]:
            cmd = _find(admissible, f"open {recep}")
            if cmd:
                return cmd, f"{recep} is closed"
        return "", why

    def next_action(self, facts: list[tuple[str, tuple[str, ...]]], admissible: list[str]) -> tuple[str, str]:
        w = WorldView(facts)
        info = self.info
        objs = w.of_type(info.object_type)
        held = next(iter(w.held), "")
        if info.task_type == "look_at_obj_in_light":
            if held and w.type_of.get(held) != info.object_type:
                return self._put_back(w, held, admissible)
            if not held:
                return self._fetch(w, objs, admissible)
            lamp = next(iter(w.of_type(info.lamp_type)), "")
            cmd, why = self._go(w, w.where(lamp), admissible, f"the {lamp} is at {w.where(lamp)}")
            return (cmd, why) if cmd else (_find(admissible, f"use {lamp}") or "look", f"turn on the {lamp}")
        target = self._target(w)
        placed = [o for o in objs if w.in_recep.get(o) == target and self._done_ok(w, o)]
        if held and (w.type_of.get(held) != info.object_type or held in placed):
            return self._put_back(w, held, admissible)
        if held:
            if not self._done_ok(w, held):
                return self._transform(w, held, admissible)
            cmd, why = self._go(w, target, admissible, f"put the {held} in {target}")
            if cmd:
                return cmd, why
            for c in admissible:
                p = parse_place(c)
                if p and p == (held, target):
                    return c, f"place the {held}"
            return "look", "cannot place yet"
        todo = [o for o in objs if o not in placed]
        return self._fetch(w, todo, admissible)

    def _fetch(self, w: WorldView, objs: list[str], admissible: list[str]) -> tuple[str, str]:
        # Prefer objects lying in the open: no open/close steps.
        objs = sorted(objs, key=lambda o: (w.where(o) in w.unary["openable"], _natural(o)))
        for obj in objs:
            recep = w.where(obj)
            if not recep:
                continue
            cmd, why = self._go(w, recep, admissible, f"the {obj} is in {recep}")
            if cmd:
                return cmd, why
            take = _find(admissible, f"take {obj} from ")
            if take:
                return take, f"pick up the {obj}"
        return "look", "no reachable object"

    def _transform(self, w: WorldView, held: str, admissible: list[str]) -> tuple[str, str]:
        verb = self.info.transform
        cmd = _find(admissible, f"{verb} {held} with ")
        if cmd:
            return cmd, f"{verb} the {held}"
        for kind in APPLIANCES[verb]:
            for app in w.of_type(kind, receptacles=True):
                cmd, why = self._go(w, app, admissible, f"{verb} the {held} with {app}")
                if cmd:
                    return cmd, why
        return "look", f"cannot {verb} yet"

    def _put_back(self, w: WorldView, held: str, admissible: list[str]) -> tuple[str, str]:
        for c in admissible:
            p = parse_place(c)
            if p and p[0] == held:
                return c, f"put down the {held}"
        return (admissible[0] if admissible else "look"), "free my hands"
