"""Writing a benchmark's results: ``<prefix>.md`` (the printed table) and ``<prefix>.json`` (its data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(prefix: str | Path, lines: list[str], data: Any) -> None:
    """Write `lines` to ``<prefix>.md`` and `data` to ``<prefix>.json`` (parents created), then print
    the lines."""
    res = Path(prefix)
    res.parent.mkdir(parents=True, exist_ok=True)
    res.with_suffix(".md").write_text("\n".join(lines) + "\n")
    res.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))
