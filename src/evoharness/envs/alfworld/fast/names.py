"""ALFWorld's object names: ``alarmclock_bar__plus_02_dot_04...`` -> ``alarmclock 2``.

Reproduces ``alfworld.agents.utils.misc.Demangler`` (``shuffle=False``) as
``AlfredDemangler`` applies it to every entity of the loaded game (every
argument of an initial fact):

- ids are visited in sorted order; the name is the part before the first
  ``_bar_`` (after un-escaping ``_minus_``/``_plus_``/``_dot_``/``_comma_``),
  with ``basin`` appended when the id contains ``basin`` (``sinkbasin``);
- numbers per name are handed out from the top down: the first id in sorted
  order gets the highest number (hence "a mug 2, a mug 1" in sorted lists);
- an id without ``_bar_`` keeps its text and gets the name ``"<text> "``
  (trailing space: ``agent1 ``, ``desklamptype ``), as the stock engine does.
"""

from __future__ import annotations

from collections import Counter


def demangle(ids) -> dict[str, str]:
    ids = sorted(set(ids))
    count: Counter[str] = Counter()
    for id_ in ids:
        parts = id_.split("_bar_", 1)
        if len(parts) > 1:
            name = parts[0]
            if "basin" in id_:
                name += "basin"
            count[name] += 1
    num_ids = {name: list(range(1, n + 1)) for name, n in count.most_common()}
    out: dict[str, str] = {}
    for id_ in ids:
        text = (
            id_.replace("_bar_", "|")
            .replace("_minus_", "-")
            .replace("_plus_", "+")
            .replace("_dot_", ".")
            .replace("_comma_", ",")
        )
        parts = text.split("|", 1)
        if len(parts) == 1:
            out[id_] = f"{text} "
        else:
            name = parts[0]
            if "basin" in id_:
                name += "basin"
            out[id_] = f"{name} {num_ids[name].pop()}"
    return out
