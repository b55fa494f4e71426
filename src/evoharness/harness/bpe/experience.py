"""Experience E_t: cross-episode knowledge, frozen within a batch, consolidated between epochs.

EvoHarness-RL (arXiv 2608.05446): 4 categories — general skills, task-specific
skills, common mistakes, object-location search priors. Retrieval by keyword
overlap, top-3 per category. Capacity 80 entries per category with
least-frequently-used eviction: each retrieval increments an entry's use
count, new entries start at 1; the evicted entry is the one with the fewest
uses (ties: the oldest). Successful pickups update the location priors online.
``note`` writes to a temporary buffer; the store is frozen within a rollout
batch and consolidated at epoch boundaries with ADD / UPDATE / REMOVE / SKIP.

Writes and the buffer:

- ``note`` always goes to the buffer (``pending``) until `consolidate`.
- pickups (hits), search misses and use-count increments apply at once while
  the store is not frozen; while frozen they are buffered too. Reads during a
  frozen batch therefore rank by the counts at freeze time, whatever order
  concurrent episodes run in.
- `consolidate` hands the buffer to a consolidator (any callable
  ``(store, pending) -> list[Op]``; the default `RuleConsolidator` is
  rule-based, an LLM consolidator can replace it), applies its operations,
  clears the buffer and advances the epoch.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from evoharness.harness.bpe import seeds

CATEGORIES = ("general", "task", "mistakes", "locations")
TITLES = {
    "general": "General skills",
    "task": "Task skills",
    "mistakes": "Common mistakes",
    "locations": "Where to find",
}
MODES = {
    "where-to-find": ("locations",),
    "how-to-do": ("general", "task"),
    "mistakes": ("mistakes",),
    "all": CATEGORIES,
}
CAPACITY = 80
TOP_K = 3

OpKind = Literal["ADD", "UPDATE", "REMOVE", "SKIP"]

_STOP = set(
    "a an the and or of to in on at with for from by is are was be it its this that then than into onto "
    "you your i me my we do does did not no yes can will should must x y some one first when while "
    "where how what which find locate location search look for mistake mistakes avoid recall "
    "often usually always sometimes found".split()
)
_SYNONYM = {
    "hot": "heat",
    "warm": "heat",
    "heated": "heat",
    "heating": "heat",
    "microwaved": "heat",
    "cold": "cool",
    "cooled": "cool",
    "cooling": "cool",
    "chill": "cool",
    "chilled": "cool",
    "wash": "clean",
    "washed": "clean",
    "rinse": "clean",
    "cleaned": "clean",
    "cleaning": "clean",
    "lamp": "desklamp",
    "light": "desklamp",
    "examine": "look",
    "sink": "sinkbasin",
    "bathtub": "bathtubbasin",
    "pick": "take",
    "picked": "take",
    "took": "take",
    "taking": "take",
}
_WHERE_WORDS = {"where", "find", "locate", "location", "located", "search", "prior", "priors"}
_HOW_WORDS = {"how", "heat", "cool", "clean", "use", "skill", "skills", "steps", "do", "put", "hot", "cold"}
_MISTAKE_WORDS = {
    "mistake",
    "mistakes",
    "avoid",
    "wrong",
    "error",
    "errors",
    "fail",
    "failed",
    "pitfall",
    "pitfalls",
    "dont",
}
_PREFIXES = {
    "where": "where-to-find",
    "where-to-find": "where-to-find",
    "location": "where-to-find",
    "how": "how-to-do",
    "how-to-do": "how-to-do",
    "skill": "how-to-do",
    "mistake": "mistakes",
    "mistakes": "mistakes",
    "all": "all",
}
_NOTE_PREFIXES = {
    "mistake": "mistakes",
    "mistakes": "mistakes",
    "avoid": "mistakes",
    "skill": "general",
    "general": "general",
    "task": "task",
    "where": "locations",
    "location": "locations",
}
_LOCATION_NOTE_RE = re.compile(
    r"^(?:the |an? |some )?([a-z]+) (?:is|are) (?:often |usually |always |sometimes |mostly )?(?:found )?"
    r"(?:in/on|in|on|at|inside) (?:the |an? )?([a-z]+)(?: \d+)?\.?$"
)
_TASK_WORDS = {"heat", "cool", "clean", "look", "two", "pick", "pick2", "desklamp"}


def _word(w: str) -> str:
    """Fold a synonym and a plural: ``apples`` -> ``apple``, ``hot`` -> ``heat``."""
    w = _SYNONYM.get(w, w)
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-2] if w.endswith("xes") else w[:-1]
        w = _SYNONYM.get(w, w)
    return w


def keywords(text: str) -> set[str]:
    """Content words of `text`: lower-case, synonyms folded (hot -> heat),
    plurals stripped, stop words and numbers dropped."""
    words = (_word(w) for w in re.findall(r"[a-z]+", text.lower().replace("don't", "dont")) if w not in _STOP)
    return {w for w in words if w not in _STOP and len(w) > 1}


def _norm_text(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", re.sub(r"\s+", " ", text.lower())).strip()


@dataclass
class Entry:
    """One experience entry. Location priors carry ``obj``/``recep`` and
    ``hits`` (successful pickups, seeds count as pseudo-hits) / ``misses``
    (episodes that searched ``recep`` without finding ``obj``)."""

    id: int
    category: str
    text: str
    keywords: list[str]
    uses: int = 1
    created_epoch: int = 0
    source: str = "seed"
    obj: str = ""
    recep: str = ""
    hits: int = 0
    misses: int = 0

    def render(self) -> str:
        if self.category == "locations":
            return f"{self.obj}: look in {self.recep} (found {self.hits}x" + (
                f", missed {self.misses}x)" if self.misses else ")"
            )
        return self.text


@dataclass
class Pending:
    """A buffered write: ``note`` (text), ``pickup`` / ``miss`` (obj, recep) or ``use`` (entry_id)."""

    kind: Literal["note", "pickup", "miss", "use"]
    text: str = ""
    category: str = ""
    obj: str = ""
    recep: str = ""
    entry_id: int = -1
    task_type: str = ""

    def sort_key(self) -> tuple:
        return (self.kind, self.category, _norm_text(self.text), self.obj, self.recep, self.entry_id, self.task_type)


@dataclass
class Op:
    """One consolidation operation.

    ADD: new entry (``category``, ``text``; ``obj``/``recep``/``hits`` for a
    location). UPDATE: add ``uses``/``hits``/``misses`` to entry ``entry_id``
    (and replace its text if ``text`` is set). REMOVE: delete ``entry_id``.
    SKIP: nothing (kept for the log). ``reason`` says why.
    """

    op: OpKind
    category: str
    entry_id: int | None = None
    text: str = ""
    obj: str = ""
    recep: str = ""
    uses: int = 0
    hits: int = 0
    misses: int = 0
    reason: str = ""


Consolidator = Callable[["ExperienceStore", list[Pending]], list[Op]]


@dataclass
class Recall:
    """A ``recall`` result: the mode used and the top entries per category."""

    query: str
    mode: str
    hits: dict[str, list[Entry]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        found = {c: es for c, es in self.hits.items() if es}
        if not found:
            return f"[{self.mode}] nothing recalled for '{self.query}'."
        lines = [f"[{self.mode}] {self.query}"]
        for cat, es in found.items():
            if len(found) > 1:
                lines.append(f"{TITLES[cat]}:")
            lines += [f"- {e.render()}" for e in es]
        return "\n".join(lines)


def infer_mode(query: str) -> tuple[str, str]:
    """(mode, query without an explicit ``mode:`` prefix). Precedence: explicit
    prefix, then mistake words, then where words, then how words, else ``all``."""
    q = query.strip().lower()
    m = re.match(r"^([a-z-]+)\s*:\s*(.*)$", q)
    if m and m.group(1) in _PREFIXES:
        return _PREFIXES[m.group(1)], m.group(2).strip()
    words = set(re.findall(r"[a-z]+", q.replace("don't", "dont")))
    if words & _MISTAKE_WORDS:
        return "mistakes", q
    if words & _WHERE_WORDS:
        return "where-to-find", q
    if words & _HOW_WORDS:
        return "how-to-do", q
    return "all", q


def infer_note_category(text: str, task_type: str = "") -> tuple[str, str]:
    """(category, text without an explicit ``category:`` prefix) for a note."""
    t = text.strip()
    m = re.match(r"^([a-z]+)\s*:\s*(.+)$", t, re.I)
    if m and m.group(1).lower() in _NOTE_PREFIXES:
        return _NOTE_PREFIXES[m.group(1).lower()], m.group(2).strip()
    low = t.lower()
    if _LOCATION_NOTE_RE.match(low):
        return "locations", t
    words = set(re.findall(r"[a-z]+", low.replace("don't", "dont").replace("do not", "dont")))
    if words & (_MISTAKE_WORDS | {"never", "instead", "dont", "wasted", "waste"}):
        return "mistakes", t
    if keywords(t) & _TASK_WORDS:
        return "task", t
    return "general", t


class NoConsolidation:
    """A consolidator that applies nothing: the batch's notes, pickups, misses and use counts
    are dropped and the store stays as it was (RL with a fixed store, `RLConfig.consolidate_experience`)."""

    def __call__(self, store: ExperienceStore, pending: list[Pending]) -> list[Op]:
        return []


class RuleConsolidator:
    """Default rule-based consolidator (no LLM).

    - use increments -> UPDATE uses; pickups -> UPDATE hits of the (obj, recep)
      prior, or ADD it; misses -> UPDATE misses (SKIP when no such prior);
    - notes: near-duplicate of a skill or mistake entry of any category (same
      normalised text or keyword Jaccard >= `dup_jaccard`) -> UPDATE its uses; duplicate of an earlier
      note of this batch -> SKIP; fewer than 2 keywords -> SKIP; else ADD;
    - REMOVE location priors contradicted by evidence (misses >= `min_misses`
      and misses >= 2 x hits), and non-seed entries never retrieved
      (uses == 1) `unused_epochs` epochs after they were added.
    """

    def __init__(self, dup_jaccard: float = 0.75, min_misses: int = 3, unused_epochs: int = 3) -> None:
        self.dup_jaccard = dup_jaccard
        self.min_misses = min_misses
        self.unused_epochs = unused_epochs

    def __call__(self, store: ExperienceStore, pending: list[Pending]) -> list[Op]:
        updates: dict[int, Op] = {}
        adds: list[Op] = []
        skips: list[Op] = []

        def upd(e: Entry, reason: str) -> Op:
            return updates.setdefault(e.id, Op("UPDATE", e.category, e.id, reason=reason))

        items = sorted(pending, key=Pending.sort_key)
        for p in items:
            if p.kind == "use":
                if (e := store.get(p.entry_id)) is not None:
                    upd(e, "retrieved").uses += 1
            elif p.kind in ("pickup", "miss") or (p.kind == "note" and p.category == "locations" and p.obj):
                e = store.find_location(p.obj, p.recep)
                if p.kind == "miss":
                    if e is None:
                        skips.append(Op("SKIP", "locations", obj=p.obj, recep=p.recep, reason="miss without prior"))
                    else:
                        upd(e, "search evidence").misses += 1
                elif e is not None:
                    op = upd(e, "pickup" if p.kind == "pickup" else "note")
                    op.hits += p.kind == "pickup"
                    op.uses += p.kind == "note"
                else:
                    add = next((a for a in adds if a.obj == p.obj and a.recep == p.recep), None)
                    if add is None:
                        adds.append(Op("ADD", "locations", obj=p.obj, recep=p.recep, hits=1, reason=p.kind))
                    else:
                        add.hits += p.kind == "pickup"
            elif p.kind == "note":
                adds_or_skip = self._note(store, p, adds)
                if adds_or_skip.op == "UPDATE":
                    upd(store.get(adds_or_skip.entry_id), adds_or_skip.reason).uses += 1
                elif adds_or_skip.op == "ADD":
                    adds.append(adds_or_skip)
                else:
                    skips.append(adds_or_skip)
        removes = []
        for e in store.all_entries():
            op = updates.get(e.id)
            uses, hits, misses = (
                e.uses + (op.uses if op else 0),
                e.hits + (op.hits if op else 0),
                e.misses + (op.misses if op else 0),
            )
            if e.category == "locations" and misses >= self.min_misses and misses >= 2 * hits:
                removes.append(Op("REMOVE", e.category, e.id, reason=f"contradicted (found {hits}, missed {misses})"))
            elif e.source != "seed" and uses <= 1 and store.epoch - e.created_epoch >= self.unused_epochs:
                removes.append(
                    Op("REMOVE", e.category, e.id, reason=f"unused for {store.epoch - e.created_epoch} epochs")
                )
        removed = {r.entry_id for r in removes}
        return [u for u in updates.values() if u.entry_id not in removed] + removes + adds + skips

    def _note(self, store: ExperienceStore, p: Pending, adds: list[Op]) -> Op:
        kw = keywords(p.text)
        if len(kw) < 2:
            return Op("SKIP", p.category, text=p.text, reason="too few keywords")
        norm = _norm_text(p.text)

        def dup(text: str, other: set[str]) -> bool:
            return _norm_text(text) == norm or (
                len(kw | other) > 0 and len(kw & other) / len(kw | other) >= self.dup_jaccard
            )

        for e in (e for c in ("general", "task", "mistakes") for e in store.entries(c)):
            if dup(e.text, set(e.keywords)):
                return Op("UPDATE", p.category, e.id, reason=f"duplicate note of #{e.id}")
        for a in adds:
            if a.category != "locations" and dup(a.text, keywords(a.text)):
                return Op("SKIP", p.category, text=p.text, reason="duplicate within batch")
        return Op("ADD", p.category, text=p.text, reason=f"note ({p.task_type or 'any task'})")


class ExperienceStore:
    """Cross-episode experience (EvoHarness-RL E_t), shared by all episodes of a run.

    Args:
        capacity: entries per category (80).
        top_k: entries returned per category by a retrieval (3).
        seed: start with the default entries of `seeds.py`.
    """

    def __init__(self, capacity: int = CAPACITY, top_k: int = TOP_K, seed: bool = True) -> None:
        self.capacity = capacity
        self.top_k = top_k
        self.epoch = 0
        self._entries: dict[str, dict[int, Entry]] = {c: {} for c in CATEGORIES}
        self._pending: list[Pending] = []
        self._frozen = False
        self._next_id = 1
        self._lock = threading.RLock()
        if seed:
            self._seed()

    def _seed(self) -> None:
        for cat, texts in (
            ("general", seeds.GENERAL_SKILLS),
            ("task", seeds.TASK_SKILLS),
            ("mistakes", seeds.COMMON_MISTAKES),
        ):
            for t in texts:
                self._add(Op("ADD", cat, text=t), source="seed")
        for obj, receps in seeds.LOCATION_PRIORS.items():
            for recep, hits in zip(receps, seeds.SEED_HITS):
                self._add(Op("ADD", "locations", obj=obj, recep=recep, hits=hits), source="seed")

    # ----- reading ---------------------------------------------------------
    def entries(self, category: str) -> list[Entry]:
        return sorted(self._entries[category].values(), key=lambda e: e.id)

    def all_entries(self) -> list[Entry]:
        return [e for c in CATEGORIES for e in self.entries(c)]

    def get(self, entry_id: int) -> Entry | None:
        return next((c[entry_id] for c in self._entries.values() if entry_id in c), None)

    def find_location(self, obj: str, recep: str) -> Entry | None:
        return next((e for e in self._entries["locations"].values() if e.obj == obj and e.recep == recep), None)

    def __len__(self) -> int:
        return sum(len(c) for c in self._entries.values())

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def pending(self) -> list[Pending]:
        """The buffer of writes awaiting consolidation (a copy)."""
        with self._lock:
            return list(self._pending)

    def retrieve(
        self, query: str, categories: tuple[str, ...] = CATEGORIES, k: int | None = None, count_use: bool = True
    ) -> dict[str, list[Entry]]:
        """Top-`k` entries per category by keyword overlap with `query`.

        Ranking: overlap, then (for location priors) hits - misses, then
        uses, then age. Entries with no overlap are never returned. Each
        returned entry's use count goes up by one (buffered while frozen).
        """
        q = keywords(query)
        k = self.top_k if k is None else k
        out: dict[str, list[Entry]] = {}
        with self._lock:
            for cat in categories:
                scored = [(len(q & set(e.keywords)), e) for e in self._entries[cat].values()]
                scored = [(s, e) for s, e in scored if s > 0]
                scored.sort(key=lambda se: (-se[0], -(se[1].hits - se[1].misses), -se[1].uses, se[1].id))
                out[cat] = [e for _, e in scored[:k]]
                if count_use:
                    for e in out[cat]:
                        self._write(Pending("use", entry_id=e.id))
        return out

    def recall(self, query: str) -> Recall:
        """The ``recall`` meta-action: mode from an explicit prefix
        (``where:``, ``how:``, ``mistakes:``, ``all:``) or the query's words."""
        mode, q = infer_mode(query)
        return Recall(q, mode, self.retrieve(q, MODES[mode]))

    def where_to_find(self, obj_type: str, k: int | None = None, count_use: bool = True) -> list[Entry]:
        """Location priors for one object type, best first (the RECALLED HINTS)."""
        return self.retrieve(obj_type, ("locations",), k=k, count_use=count_use)["locations"]

    # ----- writing -----------------------------------------------------------
    def note(self, text: str, task_type: str = "") -> str:
        """Buffer an insight for the next consolidation; returns feedback."""
        text = re.sub(r"\s+", " ", text).strip().strip("[]").strip()
        if not text:
            return "Error: note needs an insight, e.g. note the fridge must be opened first."
        category, body = infer_note_category(text, task_type)
        p = Pending("note", text=body, category=category, task_type=task_type)
        if category == "locations":
            m = _LOCATION_NOTE_RE.match(body.lower())
            if m:  # "apple is often in fridge" -> a location prior
                p.obj, p.recep = _word(m.group(1)), _word(m.group(2))
            else:  # free text about places: keep it as a general skill
                p.category = category = "general"
        with self._lock:
            self._pending.append(p)
        return f"Noted ({TITLES[category].lower()}); it will be consolidated after this epoch."

    def record_pickup(self, obj_type: str, recep_type: str) -> None:
        """A successful pickup of `obj_type` from a `recep_type` (online prior update)."""
        if obj_type and recep_type:
            self._write(Pending("pickup", obj=obj_type, recep=recep_type))

    def record_miss(self, obj_type: str, recep_type: str) -> None:
        """`recep_type` was searched in an episode and held no `obj_type`."""
        if obj_type and recep_type:
            self._write(Pending("miss", obj=obj_type, recep=recep_type))

    def _write(self, p: Pending) -> None:
        """Buffer `p` when frozen, else apply it now through the default rules."""
        with self._lock:
            if self._frozen:
                self._pending.append(p)
            else:
                self.apply(RuleConsolidator(unused_epochs=10**9, min_misses=10**9)(self, [p]))

    def freeze(self) -> None:
        """Start a rollout batch: reads allowed, every write goes to the buffer."""
        self._frozen = True

    def unfreeze(self) -> None:
        self._frozen = False

    def consolidate(self, consolidator: Consolidator | None = None, epoch: int | None = None) -> list[Op]:
        """Epoch boundary: turn the buffer into operations, apply them, clear the
        buffer, advance the epoch (to `epoch` if given). Returns the operations
        applied, LFU evictions included (for logs). Frozen state is unchanged.

        The epoch only moves forward across a store's whole life (collect, then
        RL on the same store): entry ages (``created_epoch``), the unused-entry
        pruning and the LFU tie-break all compare epochs.

        Raises:
            ValueError: `epoch` below the current epoch.
        """
        if epoch is not None and epoch < self.epoch:
            raise ValueError(f"experience epoch must not go backwards: {self.epoch} -> {epoch}")
        with self._lock:
            pending, self._pending = self._pending, []
            ops = (consolidator or RuleConsolidator())(self, pending)
            applied = self.apply(ops)
            self.epoch = self.epoch + 1 if epoch is None else epoch
            return applied

    def apply(self, ops: list[Op]) -> list[Op]:
        """Apply operations in order; ADD into a full category first evicts the
        least-frequently-used entry (fewest uses, then oldest). Unknown ids are
        skipped. Returns what was applied, evictions as extra REMOVE ops."""
        applied: list[Op] = []
        with self._lock:
            for op in ops:
                if op.op == "ADD":
                    applied += self._add(op, source="pickup" if op.reason == "pickup" else "note")
                elif op.op in ("UPDATE", "REMOVE"):
                    e = self.get(op.entry_id) if op.entry_id is not None else None
                    if e is None:
                        continue
                    if op.op == "REMOVE":
                        del self._entries[e.category][e.id]
                    else:
                        e.uses += op.uses
                        e.hits += op.hits
                        e.misses += op.misses
                        if op.text:
                            e.text, e.keywords = op.text, sorted(keywords(op.text))
                    applied.append(op)
                else:
                    applied.append(op)
        return applied

    def _add(self, op: Op, source: str) -> list[Op]:
        cat = op.category
        out: list[Op] = []
        bucket = self._entries[cat]
        while len(bucket) >= self.capacity:
            victim = min(bucket.values(), key=lambda e: (e.uses, e.created_epoch, e.id))
            del bucket[victim.id]
            out.append(Op("REMOVE", cat, victim.id, reason="lfu-evicted"))
        if cat == "locations":
            text = f"{op.obj} is often in/on {op.recep}"
            kw = [op.obj, op.recep]
        else:
            text, kw = op.text, sorted(keywords(op.text))
        entry = Entry(
            self._next_id,
            cat,
            text,
            kw,
            uses=1,
            created_epoch=self.epoch,
            source=source,
            obj=op.obj,
            recep=op.recep,
            hits=op.hits,
        )
        bucket[entry.id] = entry
        self._next_id += 1
        op.entry_id = entry.id
        out.insert(0, op)
        return out

    # ----- persistence -----------------------------------------------------------
    def to_dict(self) -> dict:
        with self._lock:
            return {
                "version": 1,
                "epoch": self.epoch,
                "capacity": self.capacity,
                "top_k": self.top_k,
                "next_id": self._next_id,
                "frozen": self._frozen,
                "entries": [asdict(e) for e in self.all_entries()],
                "pending": [asdict(p) for p in self._pending],
            }

    @classmethod
    def from_dict(cls, d: dict) -> ExperienceStore:
        store = cls(capacity=d.get("capacity", CAPACITY), top_k=d.get("top_k", TOP_K), seed=False)
        store.epoch = d.get("epoch", 0)
        store._frozen = bool(d.get("frozen", False))
        for raw in d.get("entries", []):
            e = Entry(**raw)
            store._entries[e.category][e.id] = e
        store._pending = [Pending(**p) for p in d.get("pending", [])]
        store._next_id = max([d.get("next_id", 1)] + [e.id + 1 for e in store.all_entries()])
        return store

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (temporary file + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> ExperienceStore:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def stats(self) -> dict[str, int]:
        """Entries per category and buffered writes (for metrics)."""
        out = {c: len(self._entries[c]) for c in CATEGORIES}
        out["pending"] = len(self._pending)
        out.update({f"pending_{k}": v for k, v in Counter(p.kind for p in self._pending).items()})
        return out
