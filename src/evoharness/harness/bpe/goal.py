"""Parse an ALFWorld objective sentence into its parts.

The BPE harness (EvoHarness-RL, arXiv 2608.05446) needs to know what the
objective is about: which object to find, where it must end up, which
transform (heat / cool / clean) or light it needs, and how many. ALFWorld
goals come from a handful of templates (checked on all 140 valid_seen goals):

    put a/some X in/on Y                      pick_and_place_simple
    put two X in/on Y | find two X and put them in/on Y     pick_two_obj_and_place
    put a clean/hot/cool X in/on Y | clean/heat/cool some X and put it in/on Y
    look at X under the L | examine the X with the L        look_at_obj_in_light
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Where each transform is done (the PDDL domain's preconditions).
APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
_ADJ_TO_TRANSFORM = {"hot": "heat", "cool": "cool", "cold": "cool", "clean": "clean"}

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("look", re.compile(r"^look at (?:an? |the |some )?(?P<obj>\w+) under the (?P<light>\w+)$")),
    ("look", re.compile(r"^examine the (?P<obj>\w+) with the (?P<light>\w+)$")),
    ("pick2", re.compile(r"^(?:put two (?P<obj>\w+)|find two (?P<obj2>\w+) and put them) (?:in|on) (?P<target>\w+)$")),
    (
        "transform",
        re.compile(r"^put (?:an?|some|the) (?P<adj>clean|hot|cool|cold) (?P<obj>\w+) (?:in|on) (?P<target>\w+)$"),
    ),
    (
        "transform",
        re.compile(r"^(?P<verb>clean|heat|cool) (?:an?|some|the) (?P<obj>\w+) and put it (?:in|on) (?P<target>\w+)$"),
    ),
    ("pick", re.compile(r"^put (?:an?|some|the) (?P<obj>\w+) (?:in|on) (?P<target>\w+)$")),
]
_TYPE_OF = {"pick": "pick_and_place_simple", "pick2": "pick_two_obj_and_place", "look": "look_at_obj_in_light"}
_TRANSFORM_TYPE = {
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
}


@dataclass(frozen=True)
class Goal:
    """What an objective asks for.

    Attributes:
        text: the objective sentence (without ``Your task is to:``).
        task_type: one of ALFWorld's 6 task types, or ``""`` if unparsed.
        obj: the object type to find (``apple``), ``""`` if unparsed.
        target: the receptacle type it must end in/on (``""`` for look tasks).
        transform: ``heat`` / ``cool`` / ``clean`` or ``""``.
        appliance: where the transform is done (``microwave`` / ``fridge`` /
            ``sinkbasin``), ``""`` if none.
        light: the light to use for look tasks (``desklamp``), else ``""``.
        count: how many objects must be placed (2 for pick-two tasks, else 1).
    """

    text: str
    task_type: str = ""
    obj: str = ""
    target: str = ""
    transform: str = ""
    appliance: str = ""
    light: str = ""
    count: int = 1

    @property
    def parsed(self) -> bool:
        return bool(self.task_type)

    def keywords(self) -> set[str]:
        """Type names the objective is about (object, target, appliance, light)."""
        return {w for w in (self.obj, self.target, self.appliance, self.light) if w}


def parse_goal(text: str) -> Goal:
    """Parse an ALFWorld objective (``heat some egg and put it in countertop.``).

    Accepts the sentence with or without ``Your task is to:`` and the final
    period. Never raises: an unknown sentence gives a `Goal` with
    ``task_type == ""``.
    """
    text = re.sub(r"^.*your task is to:\s*", "", text.strip(), flags=re.I | re.S).strip()
    s = re.sub(r"\s+", " ", text.rstrip(".").lower())
    for kind, pat in _PATTERNS:
        m = pat.match(s)
        if not m:
            continue
        g = m.groupdict()
        obj = g.get("obj") or g.get("obj2") or ""
        if kind == "look":
            return Goal(text, _TYPE_OF["look"], obj=obj, light=g["light"])
        if kind == "pick2":
            return Goal(text, _TYPE_OF["pick2"], obj=obj, target=g["target"], count=2)
        if kind == "transform":
            tr = g.get("verb") or _ADJ_TO_TRANSFORM[g["adj"]]
            return Goal(text, _TRANSFORM_TYPE[tr], obj=obj, target=g["target"], transform=tr, appliance=APPLIANCE[tr])
        return Goal(text, _TYPE_OF["pick"], obj=obj, target=g["target"])
    return Goal(text)
