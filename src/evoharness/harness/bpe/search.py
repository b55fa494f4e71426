"""Search order: the scene's receptacles, likeliest place for an object first.

The BPE harness lists the receptacles a ``track <object>`` has not searched yet
in this order (TRACK RESULT), so "where next" is the list's first entry instead
of a ranking a small student must recompute from RECALLED HINTS every turn.
The scripted teacher follows the same order; it was its rule 6 before the
harness rendered it.

Order: the object's recalled receptacle types (the experience store's location
priors, in hint order); then the open types of `GENERIC_ORDER`; then its closed
types (a visit costs go + open); instances in natural order. A recalled type
of a big closed family (`MANY_CLOSED` or more cabinets or drawers) keeps its
generic place. Demoted types (the objective's target for the objective's own
object in pick tasks: ALFWorld never starts X in Y there) go last.

`GENERIC_ORDER` was counted once, offline, from the train games' initial
states (per receptacle instance, how often it holds the goal object, divided
by the steps a visit costs): a fixed prior, like the experience store's seeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from evoharness.harness.bpe.belief import natural_key, type_of

GENERIC_ORDER = (
    "diningtable",
    "desk",
    "tvstand",
    "dresser",
    "toilet",
    "countertop",
    "sidetable",
    "sofa",
    "coffeetable",
    "bed",
    "bathtubbasin",
    "armchair",
    "ottoman",
    "garbagecan",
    "shelf",
    "fridge",
    "sinkbasin",
    "handtowelholder",
    "coffeemachine",
    "microwave",
    "stoveburner",
    "safe",
    "toiletpaperhanger",
    "cabinet",
    "drawer",
    "towelholder",
    "toaster",
    "laundryhamper",
    "cart",
)
_UNKNOWN_RANK = GENERIC_ORDER.index("safe")  # an unlisted type is searched before cabinets and drawers
CLOSED_TYPES = ("fridge", "microwave", "safe", "cabinet", "drawer")  # a visit costs go + open
CLOSED_FAMILIES = ("cabinet", "drawer")
MANY_CLOSED = 5  # a recalled cabinet/drawer prior with this many instances loses its priority
_ALIAS = {"sink": "sinkbasin", "bathtub": "bathtubbasin", "lamp": "desklamp"}


def receptacle_type(name: str) -> str:
    """``sinkbasin 1`` -> ``sinkbasin``; the experience store's short names (``sink``) -> ALFWorld's."""
    t = type_of(name)
    return _ALIAS.get(t, t)


def search_order(
    receps: Iterable[str],
    prior_types: Sequence[str] = (),
    demote_types: Sequence[str] = (),
    counts_from: Iterable[str] | None = None,
) -> list[str]:
    """Receptacles in search order (module docstring).

    Args:
        receps: receptacle instances (``cabinet 3``) to order.
        prior_types: recalled receptacle types, best first.
        demote_types: types moved to the end (their own order kept).
        counts_from: the scene's receptacles, for the `MANY_CLOSED` rule (default `receps`):
            the rule must not flip as a family's instances get searched.

    Returns:
        A new list of the same instances.
    """
    receps = list(receps)
    counts = Counter(receptacle_type(r) for r in (receps if counts_from is None else counts_from))
    prior = [receptacle_type(t) for t in prior_types]
    demote = {receptacle_type(t) for t in demote_types}

    def key(r: str):
        t = receptacle_type(r)
        rank = GENERIC_ORDER.index(t) if t in GENERIC_ORDER else _UNKNOWN_RANK
        if t in prior and not (t in CLOSED_FAMILIES and counts[t] >= MANY_CLOSED):
            head = (0, prior.index(t), natural_key(r))
        else:
            head = (2 if t in CLOSED_TYPES else 1, rank, natural_key(r))
        return (t in demote, *head)

    return sorted(receps, key=key)
