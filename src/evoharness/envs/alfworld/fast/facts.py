"""Indexed fact sets: the planner's state and the text generator's fact view.

Two views of the state are kept, because the stock engine keeps two:

- `FactStore` holds atoms ``(pred, arg, ...)`` (Fast Downward's state: what
  decides which actions apply and whether the goal holds), with lazily built
  hash indexes on any set of argument positions, updated incrementally.
- `TextFacts` is textworld's Python-side ``State`` that the grammar queries and
  ``facts()`` report. The stock engine updates it by adding *every* effect
  atom an operator lists, unconditional or not, in the operator's sorted
  effect order: ``NegatedAtom p`` adds a fact ``not_p`` and removes ``p``,
  ``Atom p`` adds ``p`` and removes ``not_p``. So it holds ``not_`` facts
  (e.g. ``not_inreceptacle(o, r)`` after taking ``o`` from ``r``) and can
  disagree with the planner's state (a toggled lamp's ``ison``). Matched as is.
"""

from __future__ import annotations


class FactStore:
    """A set of atoms with hash indexes ``(pred, positions) -> key -> set of atoms``."""

    __slots__ = ("by_pred", "_idx", "_pred_idx")

    def __init__(self, atoms=()) -> None:
        self.by_pred: dict[str, set[tuple]] = {}
        self._idx: dict[tuple, dict] = {}
        self._pred_idx: dict[str, list] = {}  # pred -> [(positions, index)]
        for a in atoms:
            self.add(a)

    def clone(self) -> FactStore:
        new = FactStore.__new__(FactStore)
        new.by_pred = {p: set(s) for p, s in self.by_pred.items()}
        new._idx = {}
        new._pred_idx = {}
        return new

    def __contains__(self, atom: tuple) -> bool:
        s = self.by_pred.get(atom[0])
        return s is not None and atom in s

    def __iter__(self):
        for s in self.by_pred.values():
            yield from s

    def __len__(self) -> int:
        return sum(len(s) for s in self.by_pred.values())

    def pred(self, pred: str) -> set[tuple]:
        s = self.by_pred.get(pred)
        if s is None:
            s = self.by_pred[pred] = set()
        return s

    def add(self, atom: tuple) -> bool:
        s = self.pred(atom[0])
        if atom in s:
            return False
        s.add(atom)
        for pos, idx in self._pred_idx.get(atom[0], ()):
            key = atom[pos[0] + 1] if len(pos) == 1 else tuple(atom[i + 1] for i in pos)
            b = idx.get(key)
            if b is None:
                idx[key] = {atom}
            else:
                b.add(atom)
        return True

    def discard(self, atom: tuple) -> bool:
        s = self.by_pred.get(atom[0])
        if s is None or atom not in s:
            return False
        s.discard(atom)
        for pos, idx in self._pred_idx.get(atom[0], ()):
            key = atom[pos[0] + 1] if len(pos) == 1 else tuple(atom[i + 1] for i in pos)
            b = idx.get(key)
            if b is not None:
                b.discard(atom)
        return True

    def index(self, pred: str, positions: tuple[int, ...]) -> dict:
        """``key -> set of atoms`` for argument `positions` (a bare value for one position)."""
        k = (pred, positions)
        idx = self._idx.get(k)
        if idx is None:
            idx = {}
            for atom in self.pred(pred):
                key = atom[positions[0] + 1] if len(positions) == 1 else tuple(atom[i + 1] for i in positions)
                b = idx.get(key)
                if b is None:
                    idx[key] = {atom}
                else:
                    b.add(atom)
            self._idx[k] = idx
            self._pred_idx.setdefault(pred, []).append((positions, idx))
        return idx


class TextFacts:
    """textworld's fact view: ``pred -> set of argument tuples``, static part shared.

    Args:
        static: facts of predicates no effect ever touches (shared by all episodes
            of a game, with their sorted-query caches).
        dynamic: facts of the other predicates (and of ``not_`` predicates).
        obj_type: each object's declared type (a fact's type signature).
    """

    __slots__ = ("static", "dyn", "obj_type", "_static_cache")

    def __init__(
        self, static: dict[str, frozenset], dynamic: dict[str, set], obj_type: dict[str, str], cache: dict
    ) -> None:
        self.static = static
        self.dyn = dynamic
        self.obj_type = obj_type
        self._static_cache = cache

    def clone_dynamic(self) -> TextFacts:
        return TextFacts(self.static, {p: set(s) for p, s in self.dyn.items()}, self.obj_type, self._static_cache)

    def add(self, pred: str, args: tuple) -> None:
        s = self.dyn.get(pred)
        if s is None:
            s = self.dyn[pred] = set()
        s.add(args)

    def discard(self, pred: str, args: tuple) -> None:
        s = self.dyn.get(pred)
        if s is not None:
            s.discard(args)

    def all(self):
        """Every fact as (pred, args)."""
        for p, s in self.static.items():
            if p not in self.dyn:
                for a in s:
                    yield p, a
        for p, s in self.dyn.items():
            for a in s:
                yield p, a

    def sorted_matching(self, pred: str, types: tuple, bound: tuple) -> list[tuple]:
        """Facts of `pred` whose argument types are exactly `types` and whose
        arguments at the `bound` (position, name) pairs match, sorted."""
        if pred in self.dyn:
            return self._scan(self.dyn[pred], types, bound)
        key = (pred, types, tuple(p for p, _ in bound))
        idx = self._static_cache.get(key)
        if idx is None:
            idx = {}
            pos = key[2]
            for args in self._scan(self.static.get(pred, ()), types, ()):
                idx.setdefault(tuple(args[i] for i in pos), []).append(args)
            self._static_cache[key] = idx
        return idx.get(tuple(n for _, n in bound), [])

    def _scan(self, facts, types: tuple, bound: tuple) -> list[tuple]:
        ot = self.obj_type
        n = len(types)
        out = []
        for args in facts:
            if len(args) != n:
                continue
            ok = True
            for pos, name in bound:
                if args[pos] != name:
                    ok = False
                    break
            if ok:
                for a, t in zip(args, types):
                    if ot.get(a) != t:
                        ok = False
                        break
                if ok:
                    out.append(args)
        out.sort()
        return out
