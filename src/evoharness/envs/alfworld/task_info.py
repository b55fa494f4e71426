"""What an ALFWorld game asks for, read from its ``traj_data.json``.

``pddl_params`` names the target object type, the receptacle type it must end
in, and the lamp for look tasks; the task type gives the transform (clean /
heat / cool) and how many objects (pick-two).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TRANSFORM = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}
# Receptacle types where each transform is done, in order of preference.
APPLIANCES = {"clean": ("sinkbasin", "bathtubbasin"), "heat": ("microwave",), "cool": ("fridge",)}
STATE_PREDICATE = {"clean": "isclean", "heat": "ishot", "cool": "iscool"}


@dataclass(frozen=True)
class TaskInfo:
    """Goal of one game, in the demangled (lower-case) vocabulary.

    Attributes:
        task_type: one of the 6 ALFWorld task types.
        object_type: e.g. ``apple`` (matches ``objecttype(x, "appletype")``).
        receptacle_type: where it must end, e.g. ``diningtable`` ("" for look).
        transform: ``clean``/``heat``/``cool`` or "".
        count: objects needed (2 for pick-two).
        lamp_type: ``desklamp``/``floorlamp`` for look tasks, else "".
    """

    task_type: str
    object_type: str
    receptacle_type: str
    transform: str
    count: int
    lamp_type: str


@lru_cache(maxsize=4096)
def load_task_info(game_path: str) -> TaskInfo:
    """Read ``traj_data.json`` beside ``game_path``.

    Raises:
        FileNotFoundError / KeyError: the game folder lacks a valid traj_data.json.
    """
    traj = json.loads((Path(game_path).parent / "traj_data.json").read_text())
    p = traj["pddl_params"]
    tt = traj["task_type"]
    look = tt == "look_at_obj_in_light"
    return TaskInfo(
        task_type=tt,
        object_type=p["object_target"].lower(),
        receptacle_type="" if look else p["parent_target"].lower(),
        transform=TRANSFORM.get(tt, ""),
        count=2 if tt == "pick_two_obj_and_place" else 1,
        lamp_type=p["toggle_target"].lower() if look else "",
    )
