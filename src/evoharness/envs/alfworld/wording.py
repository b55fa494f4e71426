"""The two ALFWorld command wordings for placing an object.

json_2.1.1 games (and the ReAct prompts, and most papers) say
``put X in/on Y``; alfworld >= 0.4 games say ``move X to Y``. Both come from
the game file's own grammar, so a game can be rewritten from one wording to
the other; the rest of the project accepts either (see `place_command`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

WORDINGS = ("native", "put", "move")

_PUT = ('template :: "put {o} in/on {r}"', '"rhs": "You put the {o.name} in/on the {r.name}."')
_MOVE = ('template :: "move {o} to {r}"', '"rhs": "You move the {o.name} to the {r.name}."')

PLACE_RE = re.compile(r"^(?:put (?P<o1>.+?) in/on (?P<r1>.+)|move (?P<o2>.+?) to (?P<r2>.+))$")


def parse_place(command: str) -> tuple[str, str] | None:
    """``put apple 1 in/on table 1`` or ``move apple 1 to table 1`` -> (object, receptacle)."""
    m = PLACE_RE.match(command.strip())
    if not m:
        return None
    return (m["o1"] or m["o2"]), (m["r1"] or m["r2"])


def detect_wording(grammar: str) -> str:
    return "move" if _MOVE[0] in grammar else "put"


def rewrite_grammar(grammar: str, wording: str) -> str:
    """Rewrite a game's TWL2 grammar to the given wording (``put``/``move``)."""
    src, dst = (_PUT, _MOVE) if wording == "move" else (_MOVE, _PUT)
    for a, b in zip(src, dst):
        grammar = grammar.replace(a, b)
    return grammar


def game_file_for_wording(path: str, wording: str, cache_dir: Path | None = None) -> str:
    """Path of a game file in the requested wording (the file itself when it
    already has it; else a rewritten copy in a cache, written atomically)."""
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; expected one of {WORDINGS}")
    if wording == "native":
        return path
    raw = Path(path).read_text()
    game = json.loads(raw)
    if detect_wording(game["grammar"]) == wording:
        return path
    game["grammar"] = rewrite_grammar(game["grammar"], wording)
    from evoharness.envs.alfworld.games import default_cache_dir

    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    out = (cache_dir or default_cache_dir()) / "alfworld-wording" / wording / f"{digest}.tw-pddl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(game))
        os.replace(tmp, out)
    return str(out)
