"""Reading the project's JSONL logs (trajectories, metrics, traces).

Every writer appends one record per line (and fsyncs, or writes the whole
file atomically), so the only damage a kill leaves is a torn last line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL file, in order; [] when it does not exist.

    Blank lines are skipped; a line that does not parse (torn by a kill
    mid-write) is skipped with a warning naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for n, ln in enumerate(path.read_text().splitlines(), 1):
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            warnings.warn(f"{path}:{n}: dropped a torn line ({ln[:60]!r}...)", stacklevel=2)
    return out
